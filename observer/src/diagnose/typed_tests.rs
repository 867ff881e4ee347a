//! The live run reads the pipeline's records typed, `--from FILE` reads
//! them as `watch --json` printed them: the same records give the same
//! report either way.

use std::sync::Arc;

use clap::Parser as _;

use super::{
    collect::Collector,
    read::Record,
    run::{report, Tally},
    DiagnoseArgs,
};
use crate::{
    cause::fixtures::{
        conn, conn_with, dns_join, dns_record, gen_ai, gpu, pool, request_on, rpc, server_conn,
        stream, tls, MS, T0,
    },
    output::{write_line, Format, Line},
};

/// A run: a client's lookup, TLS connection and two requests on it (the
/// first holding the connection as it stood), the server's side of it on
/// this host, a failed connect, an open connection, an LLM stream on a busy
/// GPU, a gRPC call, and the pool records of a leak and of a steady pool.
fn run() -> Vec<Line> {
    let mut lines = vec![Line::Dns(dns_record(7, "api.example.com", T0 - 13 * MS))];
    let mut c = conn(443);
    c.tls = Some(tls("api.example.com"));
    c.dns = Some(dns_join("api.example.com"));
    let mut first = request_on(&c);
    first.host = Some("api.example.com:443".into());
    (first.ttfb_ns, first.duration_ns) = (Some(1_500 * MS), 1_600 * MS);
    let mut second = request_on(&c);
    (second.request_index, second.start_unix_ns) = (Some(2), first.start_unix_ns + 50 * MS);
    // The connection as the first request saw it: before its retransmits.
    let mut then = c.clone();
    then.retransmits = 0;
    first.connection = Some(Box::new(then));
    let s = server_conn(443);
    let mut answered = request_on(&s);
    answered.ttfb_ns = Some(1_450 * MS);
    lines.extend([
        Line::Request(Box::new(first)),
        Line::Request(Box::new(second)),
        Line::Conn(Box::new(c)),
        Line::Request(Box::new(answered)),
        Line::Conn(Box::new(s)),
    ]);
    lines.extend(others());
    lines.extend(pools());
    lines
}

/// A failed connect, an open connection, an LLM stream, a gRPC call.
fn others() -> Vec<Line> {
    let timeout = conn_with(8081, |c| {
        c.flags = observer_common::FLAG_OWNED;
        c.error = libc::ETIMEDOUT as u32;
        (c.established_ns, c.first_tx_ns, c.first_rx_ns) = (0, 0, 0);
        c.end_ns = 1_031 * MS;
    });
    let open = conn_with(8082, |c| c.end_ns = 0);
    let mut llm_conn = conn(8000);
    llm_conn.gpu = Some(gpu(Some("GPU-0"), 99));
    llm_conn.retransmits = 0;
    let mut llm = request_on(&llm_conn);
    llm.comm = Some(Arc::from("python3"));
    (llm.duration_ns, llm.streamed) = (3_100 * MS, true);
    llm.stream = Some(stream(41, 900 * MS));
    llm.gen_ai = Some(gen_ai(Some(39), Some(950 * MS)));
    let grpc_conn = conn(50051);
    let mut grpc = request_on(&grpc_conn);
    (grpc.protocol, grpc.stream_id) = ("h2", Some(1));
    grpc.host = Some("greeter.test:50051".into());
    grpc.rpc = Some(rpc());
    [timeout, open, llm_conn, grpc_conn]
        .into_iter()
        .map(|c| Line::Conn(Box::new(c)))
        .chain([llm, grpc].map(|r| Line::Request(Box::new(r))))
        .collect()
}

/// A record a second for 10 s: a pool that grows idle while its requests
/// hold steady (a leak), and one reused throughout.
fn pools() -> Vec<Line> {
    (0..10u32)
        .flat_map(|i| {
            let t = u64::from(i) * 1_000 * MS;
            let requests = 3 * u64::from(i);
            [
                pool(7, 8080, t, 2 + 3 * i, 1 + 3 * i, requests),
                pool(7, 443, t, 4, 3, 10 * requests),
            ]
        })
        .map(|p| Line::Pool(Box::new(p)))
        .collect()
}

fn args(flags: &[&str]) -> DiagnoseArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: DiagnoseArgs,
    }
    let argv = std::iter::once("diagnose").chain(flags.iter().copied());
    Cli::try_parse_from(argv).expect("diagnose's flags").args
}

/// The report of a collector that took the run.
fn report_of(c: Collector, flags: &[&str]) -> String {
    let mut out = Vec::new();
    report(c, &args(flags), &Tally::default(), &mut out).expect("a report");
    String::from_utf8(out).expect("text")
}

/// A record's line as `watch --json` prints it.
fn printed(l: &Line) -> serde_json::Value {
    let mut line = Vec::new();
    write_line(&mut line, l, Format::Json).expect("printed");
    serde_json::from_slice(&line).expect("a JSON line")
}

/// The run, typed and as `watch --json` printed it.
fn both(lines: &[Line]) -> (Collector, Collector) {
    let (mut typed, mut json) = (Collector::default(), Collector::default());
    for l in lines {
        typed.add_line(l);
        let v = printed(l);
        assert!(json.add(&v), "{v}");
    }
    (typed, json)
}

#[test]
fn each_record_reads_as_its_line_does() {
    let lines = run();
    for l in &lines {
        let v = printed(l);
        assert_eq!(Some(Record::of_line(l)), Record::from_json(&v), "{v}");
    }
    let kinds = |k: fn(&Record) -> bool| lines.iter().filter(|l| k(&Record::of_line(l))).count();
    assert_eq!(kinds(|r| matches!(r, Record::Snapshot)), 1);
    assert_eq!(kinds(|r| matches!(r, Record::Lookup(_))), 1);
    assert_eq!(kinds(|r| matches!(r, Record::Pool(_))), 20);
}

#[test]
fn the_typed_run_and_its_json_give_the_same_report() {
    let lines = run();
    for flags in [
        &[][..],
        &["--top", "0"],
        &["--json", "--top", "0"],
        &["--host", "api.example.com"],
        &["--pid", "9"],
        &["--comm", "client", "--ttfb-ms", "20"],
    ] {
        let (typed, json) = both(&lines);
        assert_eq!(report_of(typed, flags), report_of(json, flags), "{flags:?}");
    }
    let (typed, json) = both(&lines);
    let text = report_of(typed, &["--top", "0"]);
    assert_eq!(json.calls(&super::only::Only::default()).len(), 5, "{text}");
    for line in [
        "observer diagnose: the 5 slowest of 5 calls;",
        // The server's record folded into its client's call.
        "server slow to answer: first byte after 1.50 s (the server on this host took 1.45 s)",
        "connect failed: timeout after 1.03 s",
        "GPU busy: device GPU-0 at 99% during the request; first token after 950 ms",
        "pool leak: pid 7 client -> 10.0.0.9:8080 (api.test): open connections 2 -> 29 in 9s",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}
