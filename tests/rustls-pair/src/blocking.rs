//! The older-rustls clients' shared part: their arguments, and HTTP/1.1
//! keep-alive GETs over any blocking stream, each printed as one JSON line
//! in the reqwest client's format (its pid, the call's start, its own time
//! to the answer's header).

use std::{
    io::{BufRead, BufReader, Read, Write},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

/// `--addr IP:PORT --name NAME --ca PEM --requests N`.
pub struct Args {
    pub addr: String,
    pub name: String,
    pub ca: String,
    pub requests: usize,
}

impl Args {
    pub fn parse() -> Args {
        let mut a = Args {
            addr: String::new(),
            name: String::new(),
            ca: String::new(),
            requests: 1,
        };
        let mut it = std::env::args().skip(1);
        while let Some(k) = it.next() {
            let v = it.next().unwrap();
            match k.as_str() {
                "--addr" => a.addr = v,
                "--name" => a.name = v,
                "--ca" => a.ca = v,
                "--requests" => a.requests = v.parse().unwrap(),
                _ => panic!("unknown argument {k}"),
            }
        }
        a
    }

    /// The CA certificate's DER bytes.
    pub fn ca_der(&self) -> Vec<u8> {
        let pem = std::fs::read_to_string(&self.ca).unwrap();
        let b64: String = pem
            .lines()
            .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        decode_base64(&b64)
    }
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(val).collect();
    bytes
        .chunks(4)
        .flat_map(|c| {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &v)| n | u32::from(v) << (18 - 6 * i));
            let out = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.into_iter().take(c.len() - 1)
        })
        .collect()
}

/// `requests` GETs of /req0, /req1, ... on one connection.
pub fn get_each(stream: impl Read + Write, host: &str, requests: usize) {
    let mut s = BufReader::new(stream);
    for i in 0..requests {
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let t = Instant::now();
        write!(s.get_mut(), "GET /req{i} HTTP/1.1\r\nhost: {host}\r\n\r\n").unwrap();
        s.get_mut().flush().unwrap();
        let mut line = String::new();
        s.read_line(&mut line).unwrap();
        let header_ns = t.elapsed().as_nanos() as u64;
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            line.clear();
            s.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; len];
        s.read_exact(&mut body).unwrap();
        let total_ns = t.elapsed().as_nanos() as u64;
        println!(
            "{{\"pid\":{},\"i\":{i},\"start_unix_ns\":{start_unix_ns},\"header_ns\":{header_ns},\"total_ns\":{total_ns},\"status\":{status},\"version\":\"HTTP/1.1\",\"body_bytes\":{len}}}",
            std::process::id(),
        );
    }
}
