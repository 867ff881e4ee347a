//! A blocking HTTPS client on rustls 0.21, for tests/tls_rustls.rs: a
//! version the probes do not cover (no `DeframerVecBuffer`), which `doctor`
//! names with what is missing and whose handshake is read on the wire.
//! Arguments and output: `blocking.rs`.
#![expect(clippy::unwrap_used, reason = "a test helper: a panic is a failure")]

#[path = "../blocking.rs"]
mod blocking;

use std::{net::TcpStream, sync::Arc};

use rustls021 as rustls;

fn main() {
    let a = blocking::Args::parse();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(&rustls::Certificate(a.ca_der())).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_safe_defaults()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::ServerName::try_from(a.name.as_str()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let sock = TcpStream::connect(&a.addr).unwrap();
    blocking::get_each(rustls::StreamOwned::new(conn, sock), &a.name, a.requests);
}
