//! The JSON Schema of every record kind the observer prints: `watch --json`
//! (connection, request, dns, pool) and `diagnose --json` (diagnosis,
//! pool_leak). Generated from the types that serialize them, so it cannot
//! drift from the output: `docs/records.schema.json` is this schema (a unit
//! test below keeps it current), and the end-to-end tests validate every
//! record `watch --json` printed against that file.

use schemars::{generate::SchemaSettings, JsonSchema};
use serde_json::Value;

use crate::{
    diagnose::{pools::Leak, text::Verdict},
    dns::DnsRecord,
    http::RequestRecord,
    pools::PoolRecord,
    record::ConnRecord,
};

/// One line of `watch --json` or `diagnose --json` that is a record (its
/// `kind` tells which).
// Only its schema is used (records are printed each as its own type): never
// built, so its size does not matter.
#[allow(dead_code, clippy::large_enum_variant)]
#[derive(JsonSchema)]
#[schemars(untagged)]
enum Record {
    Connection(ConnRecord),
    Request(RequestRecord),
    Dns(DnsRecord),
    Pool(PoolRecord),
    Diagnosis(Verdict<'static>),
    PoolLeak(Leak),
}

/// The schema (JSON Schema 2020-12) of a record line. Every object lists
/// every field it may carry and allows no other; a field that may be null
/// is still always present.
pub fn records_schema() -> Value {
    let schema = SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<Record>();
    let mut v = schema.to_value();
    close_objects(&mut v);
    v
}

/// `additionalProperties: false` on every object schema that lists its
/// properties: a field printed but not in the types is an error.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(close_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IN_DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/records.schema.json");

    /// `OBSERVER_WRITE_SCHEMA=1 cargo test -p observer --lib schema` writes it.
    #[test]
    fn the_schema_in_docs_is_the_records_own() {
        let now = serde_json::to_string_pretty(&records_schema()).expect("json") + "\n";
        if std::env::var_os("OBSERVER_WRITE_SCHEMA").is_some() {
            std::fs::write(IN_DOCS, &now).expect("write docs/records.schema.json");
        }
        let kept = std::fs::read_to_string(IN_DOCS).unwrap_or_default();
        assert!(
            kept == now,
            "docs/records.schema.json is not the records' schema: \
             OBSERVER_WRITE_SCHEMA=1 cargo test -p observer --lib schema"
        );
    }

    #[test]
    fn every_kind_is_told_apart_by_its_kind() {
        let s = records_schema();
        let kinds: Vec<&str> = s["$defs"]
            .as_object()
            .expect("defs")
            .values()
            .filter_map(|d| d["properties"]["kind"]["const"].as_str())
            .collect();
        for k in [
            "connection",
            "request",
            "dns",
            "pool",
            "diagnosis",
            "pool_leak",
        ] {
            assert!(kinds.contains(&k), "{k}: {kinds:?}");
        }
        assert_eq!(s["anyOf"].as_array().map(Vec::len), Some(6));
    }
}
