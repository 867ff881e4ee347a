//! A blocking HTTPS client on rustls 0.22 (`StreamOwned` over a
//! `TcpStream`), for tests/tls_rustls.rs: the probes on an older rustls,
//! through its blocking read and write. Arguments and output: `blocking.rs`.
#![expect(clippy::unwrap_used, reason = "a test helper: a panic is a failure")]

#[path = "../blocking.rs"]
mod blocking;

use std::{net::TcpStream, sync::Arc};

use rustls022 as rustls;

fn main() {
    let a = blocking::Args::parse();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(a.ca_der()))
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(a.name.clone()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let sock = TcpStream::connect(&a.addr).unwrap();
    blocking::get_each(rustls::StreamOwned::new(conn, sock), &a.name, a.requests);
}
