//! The userspace pipeline alone: decode ring-buffer records and correlate them
//! in the connection table, on one core. `cargo xtask bench` reports the result
//! in events/s (EVENTS_PER_ITER events per iteration).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use observer::{
    clock::Clock,
    conntrack::ConnTable,
    decode::{as_bytes, decode},
    process::ProcessCache,
};
use observer_common::{
    CloseEvent, Conn, EventHeader, EventKind, OwnerEvent, TlsConn, AF_INET, DIR_OUTBOUND,
    FLAG_ESTABLISHED, FLAG_OWNED,
};

const EVENTS_PER_ITER: usize = 10_000;

/// Owner + close records for EVENTS_PER_ITER / 2 connections of this process,
/// as the kernel would write them.
fn stream() -> Vec<Vec<u8>> {
    let pid = std::process::id();
    let mut out = Vec::with_capacity(EVENTS_PER_ITER);
    for i in 0..(EVENTS_PER_ITER / 2) as u64 {
        let sk = 0xffff_8880_0000_0000 + i * 4096;
        let owner = OwnerEvent {
            hdr: EventHeader {
                kind: EventKind::Owner as u32,
                size: std::mem::size_of::<OwnerEvent>() as u32,
                ts_ns: 1_000 + i,
            },
            sk,
            pid,
            tid: pid,
            comm: *b"bench\0\0\0\0\0\0\0\0\0\0\0",
            direction: DIR_OUTBOUND,
            _pad: 0,
            family: observer_common::AF_INET,
            _pad2: 0,
            daddr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        };
        let mut conn = Conn {
            sk,
            start_ns: 1_000 + i,
            established_ns: 2_000 + i,
            first_tx_ns: 3_000 + i,
            first_rx_ns: 9_000 + i,
            end_ns: 20_000 + i,
            bytes_tx: 517,
            bytes_rx: 4096,
            tx_calls: 1,
            rx_calls: 2,
            pid,
            tid: pid,
            sport: 40_000 + (i % 20_000) as u16,
            dport: 443,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            ..Conn::default()
        };
        conn.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        conn.daddr[..4].copy_from_slice(&[10, 0, 0, (i % 250) as u8]);
        let close = CloseEvent {
            hdr: EventHeader {
                kind: EventKind::Close as u32,
                size: std::mem::size_of::<CloseEvent>() as u32,
                ts_ns: 20_000 + i,
            },
            conn,
            tls: TlsConn::default(),
        };
        out.push(as_bytes(&owner).to_vec());
        out.push(as_bytes(&close).to_vec());
    }
    out
}

fn pipeline(c: &mut Criterion) {
    let records = stream();
    let mut table = ConnTable::new(ProcessCache::new("/proc"), Clock::sample());
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(EVENTS_PER_ITER as u64));
    group.bench_function("decode_and_correlate", |b| {
        b.iter(|| {
            for bytes in &records {
                let ev = decode(bytes).expect("synthetic records decode");
                black_box(table.handle(ev));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
