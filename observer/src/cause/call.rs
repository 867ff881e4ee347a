//! What a verdict rests on: one call's phases, from a request record or a
//! connection record, typed (the exporters; `diagnose` live) or as `watch
//! --json` printed it (`diagnose --from FILE`). `diagnose` reads both alike:
//! a typed record gives the call its JSON gives.

use serde_json::Value;

use crate::{
    http::RequestRecord,
    record::{ip_text, ConnRecord},
};

/// The lookup that led to the call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookup {
    pub name: String,
    pub duration_ns: u64,
    pub result: String,
    /// The server asked and the queries sent again, from the lookup's own
    /// record (joined by `diagnose`; unknown to the exporters).
    pub server: Option<String>,
    pub retries: Option<u32>,
}

/// A GPU the process used during the call, at its busiest.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBusy {
    pub device: String,
    pub utilization_pct: u32,
}

/// The answering side's own record, when the server runs on this host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSide {
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// Its wait: the request's first byte to its answer's first byte (or
    /// first token).
    pub wait_ns: Option<u64>,
    /// A proxy whose legs were seen: its own time outside them.
    pub own_ns: Option<u64>,
    pub gpus: Vec<GpuBusy>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    /// "request" or "connection".
    pub record: &'static str,
    /// "outbound" or "inbound".
    pub direction: &'static str,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// The name asked for: Host header, TLS server name or looked-up name.
    pub host: Option<String>,
    pub local_addr: String,
    pub local_port: u16,
    pub remote_addr: String,
    pub remote_port: u16,
    pub method: Option<String>,
    pub path: Option<String>,
    pub status: Option<u16>,
    pub start_unix_ns: u64,
    /// The record's own duration (a request: first byte sent to last byte
    /// received; a connection: connect to close).
    pub duration_ns: u64,
    pub dns: Option<Lookup>,
    pub connect_ns: Option<u64>,
    pub tls_setup_ns: Option<u64>,
    pub tls_handshake_ns: Option<u64>,
    pub srtt_us: Option<u32>,
    pub ttfb_ns: Option<u64>,
    /// Request start to the first generated token (or stream event).
    pub first_token_ns: Option<u64>,
    /// Tokens the server said it generated, else the stream's events.
    pub tokens: Option<u64>,
    pub max_gap_ns: Option<u64>,
    pub gpus: Vec<GpuBusy>,
    pub retransmits: u32,
    pub error: Option<String>,
    pub server: Option<ServerSide>,
    /// A proxy's inbound request whose legs were seen: its own time
    /// outside them (`own_time_ns`).
    pub own_ns: Option<u64>,
}

impl Call {
    /// Through a proxy whose legs were seen (this call is its inbound
    /// request, or its server on this host is one): the proxy's own time
    /// and its upstream's.
    pub fn proxy_split(&self) -> Option<(u64, u64)> {
        if let Some(own) = self.own_ns {
            return Some((own, self.duration_ns.saturating_sub(own)));
        }
        let s = self.server.as_ref()?;
        let own = s.own_ns?;
        let wait = s.wait_ns.or(self.first_token_ns.or(self.ttfb_ns))?;
        Some((own.min(wait), wait.saturating_sub(own)))
    }

    /// The phases before the record's own start (lookup, connect, TLS) plus
    /// its duration: what the caller waited in all.
    pub fn total_ns(&self) -> u64 {
        let before = match self.record {
            // A connection's duration already holds its connect and TLS.
            "connection" => 0,
            _ => {
                self.connect_ns.unwrap_or(0)
                    + self.tls_setup_ns.unwrap_or(0)
                    + self.tls_handshake_ns.unwrap_or(0)
            }
        };
        self.dns.as_ref().map_or(0, |d| d.duration_ns) + before + self.duration_ns
    }

    /// Reads a `"kind": "request"` or `"kind": "connection"` record; None
    /// for anything else (DNS records, other JSON).
    pub fn from_json(v: &Value) -> Option<Call> {
        let record = match v["kind"].as_str()? {
            "request" => "request",
            "connection" => "connection",
            _ => return None,
        };
        let u = |v: &Value| v.as_u64();
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let tls = &v["tls"];
        let (ttfb_ns, first_token_ns, tokens, max_gap_ns) = if record == "request" {
            let stream = &v["stream"];
            let gen_ai = &v["gen_ai"];
            (
                u(&v["ttfb_ns"]),
                u(&gen_ai["time_to_first_token_ns"]).or_else(|| u(&stream["first_event_ns"])),
                u(&gen_ai["output_tokens"]).or_else(|| u(&stream["events"])),
                u(&stream["max_gap_ns"]),
            )
        } else {
            (
                // On TLS the socket's first byte is the handshake's.
                if tls.is_object() {
                    u(&tls["ttfb_ns"])
                } else {
                    u(&v["ttfb_ns"])
                },
                None,
                None,
                None,
            )
        };
        let dns = v["dns"].as_object().map(|d| Lookup {
            name: d.get("name").and_then(Value::as_str).unwrap_or("").into(),
            duration_ns: d.get("duration_ns").and_then(Value::as_u64).unwrap_or(0),
            result: d.get("result").and_then(Value::as_str).unwrap_or("").into(),
            server: None,
            retries: None,
        });
        let host = v["host"]
            .as_str()
            .map(|h| host_name(h).to_owned())
            .or_else(|| text(&tls["server_name"]))
            .or_else(|| dns.as_ref().map(|d| d.name.clone()));
        Some(Call {
            record,
            direction: match v["direction"].as_str() {
                Some("inbound") => "inbound",
                _ => "outbound",
            },
            pid: u(&v["pid"]).and_then(|p| u32::try_from(p).ok()),
            comm: text(&v["comm"]),
            host,
            local_addr: text(&v["local_addr"]).unwrap_or_default(),
            local_port: u(&v["local_port"]).and_then(|p| u16::try_from(p).ok())?,
            remote_addr: text(&v["remote_addr"]).unwrap_or_default(),
            remote_port: u(&v["remote_port"]).and_then(|p| u16::try_from(p).ok())?,
            method: text(&v["method"]),
            path: text(&v["path"]),
            status: u(&v["status"]).and_then(|s| u16::try_from(s).ok()),
            start_unix_ns: u(&v["start_unix_ns"])?,
            duration_ns: u(&v["duration_ns"]).unwrap_or(0),
            dns,
            connect_ns: u(&v["connect_ns"]),
            tls_setup_ns: u(&tls["setup_ns"]),
            tls_handshake_ns: u(&tls["handshake_ns"]),
            srtt_us: u(&v["srtt_us"]).and_then(|s| u32::try_from(s).ok()),
            ttfb_ns,
            first_token_ns,
            tokens,
            max_gap_ns,
            gpus: gpus_json(&v["gpu"]),
            retransmits: u(&v["retransmits"]).map_or(0, |n| n.min(u64::from(u32::MAX)) as u32),
            error: text(&v["error"]),
            server: None,
            own_ns: u(&v["own_time_ns"]),
        })
    }

    /// A connection record's phases without its identity (the exporters:
    /// no strings copied but the lookup's name).
    pub fn phases_of_conn(r: &ConnRecord) -> Call {
        let mut c = Call {
            record: "connection",
            duration_ns: r.duration_ns.unwrap_or(0),
            ttfb_ns: r.answer_ttfb_ns(),
            ..Call::default()
        };
        c.phases(r);
        c
    }

    /// A request record's phases without its identity.
    pub fn phases_of_request(r: &RequestRecord) -> Call {
        let mut c = Call::default();
        if let Some(conn) = &r.connection {
            c.phases(conn);
        }
        c.request_phases(r);
        c
    }

    /// A connection record as `watch --json` prints it (`diagnose` live):
    /// named by its TLS server name, else by its lookup.
    pub fn from_conn(r: &ConnRecord) -> Call {
        let mut c = Call {
            record: "connection",
            direction: direction(r.direction),
            pid: r.pid,
            comm: r.comm.as_deref().map(str::to_owned),
            host: r
                .tls
                .as_ref()
                .and_then(|t| t.server_name.as_deref())
                .or(r.dns.as_ref().map(|d| &*d.name))
                .map(str::to_owned),
            local_addr: ip_text(&r.local_addr),
            local_port: r.local_port,
            remote_addr: ip_text(&r.remote_addr),
            remote_port: r.remote_port,
            start_unix_ns: r.start_unix_ns,
            duration_ns: r.duration_ns.unwrap_or(0),
            ttfb_ns: r.answer_ttfb_ns(),
            ..Call::default()
        };
        c.phases(r);
        c
    }

    /// A request record as `watch --json` prints it, so that `diagnose`
    /// reads the pipeline's records as it reads a recorded stream: the
    /// request's own identity and phases. The connection it rode on
    /// (`connection`, not printed) is left out: `diagnose` joins the
    /// connection's own closed record, whose retransmits and error are the
    /// whole connection's, not the first request's snapshot of them.
    pub fn from_request(r: &RequestRecord) -> Call {
        let mut c = Call {
            direction: direction(r.direction),
            pid: r.pid,
            comm: r.comm.as_deref().map(str::to_owned),
            host: r.host.as_deref().map(|h| host_name(h).to_owned()),
            local_addr: ip_text(&r.local_addr),
            local_port: r.local_port,
            remote_addr: ip_text(&r.remote_addr),
            remote_port: r.remote_port,
            method: r.method.clone(),
            path: r.path.clone(),
            status: r.status,
            start_unix_ns: r.start_unix_ns,
            ..Call::default()
        };
        c.request_phases(r);
        c
    }

    fn request_phases(&mut self, r: &RequestRecord) {
        let c = self;
        c.record = "request";
        c.duration_ns = r.duration_ns;
        c.ttfb_ns = r.ttfb_ns;
        c.first_token_ns = r
            .gen_ai
            .as_ref()
            .and_then(|g| g.time_to_first_token_ns)
            .or_else(|| r.stream.as_ref().and_then(|s| s.first_event_ns));
        c.tokens = r
            .gen_ai
            .as_ref()
            .and_then(|g| g.output_tokens)
            .or_else(|| r.stream.as_ref().and_then(|s| s.events.map(u64::from)));
        c.max_gap_ns = r.stream.as_ref().and_then(|s| s.max_gap_ns);
        if let Some(e) = r.error {
            c.error = Some(e.to_owned());
        }
        c.own_ns = r.own_time_ns;
        if r.gpu.is_some() {
            c.gpus = gpus_typed(r.gpu.as_ref());
        }
    }

    fn phases(&mut self, r: &ConnRecord) {
        self.dns = r.dns.as_ref().map(|d| Lookup {
            name: d.name.to_string(),
            duration_ns: d.duration_ns,
            result: d.result.into(),
            server: None,
            retries: None,
        });
        self.connect_ns = r.connect_ns;
        self.tls_setup_ns = r.tls.as_ref().and_then(|t| t.setup_ns);
        self.tls_handshake_ns = r.tls.as_ref().and_then(|t| t.handshake_ns);
        self.srtt_us = r.srtt_us;
        self.gpus = gpus_typed(r.gpu.as_ref());
        self.retransmits = r.retransmits;
        self.error = r.error.map(str::to_owned);
    }
}

/// A Host header's (or `:authority`'s) name without its port: `--host
/// api.test` finds `api.test:8080`. An IPv6 literal keeps its brackets, and
/// one without a port stays whole (not `[::1]` cut to `[:`).
fn host_name(h: &str) -> &str {
    match h.rsplit_once(':') {
        Some((name, _)) if !name.contains(':') || name.ends_with(']') => name,
        _ => h,
    }
}

fn direction(d: crate::record::Direction) -> &'static str {
    match d {
        crate::record::Direction::Outbound => "outbound",
        crate::record::Direction::Inbound => "inbound",
    }
}

/// Devices are named by UUID (the record carries no index), else by their
/// place in the record.
fn gpus_typed(g: Option<&crate::gpu::GpuRecord>) -> Vec<GpuBusy> {
    g.map_or_else(Vec::new, |g| {
        g.devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                Some(GpuBusy {
                    device: d.uuid.clone().unwrap_or_else(|| i.to_string()),
                    utilization_pct: d.utilization_gpu_pct_max?,
                })
            })
            .collect()
    })
}

fn gpus_json(g: &Value) -> Vec<GpuBusy> {
    g["devices"].as_array().map_or_else(Vec::new, |devices| {
        devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                Some(GpuBusy {
                    device: d["uuid"]
                        .as_str()
                        .map_or_else(|| i.to_string(), str::to_owned),
                    utilization_pct: u32::try_from(d["utilization_gpu_pct_max"].as_u64()?).ok()?,
                })
            })
            .collect()
    })
}
