//! observer: where every TCP connection on this host spends its time, from the
//! kernel, for every process. The binary (`main.rs`) is a thin shell over this
//! library so that tests and benchmarks can drive each stage without root.

pub mod btf;
pub mod cause;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod conntrack;
pub mod correlator;
pub mod decode;
pub mod diagnose;
pub mod dns;
pub mod doctor;
pub mod ebpf;
pub mod export;
pub mod features;
pub mod fields;
pub mod filter;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gpu;
pub mod health;
pub mod heap;
pub mod hist;
pub mod http;
pub mod k8s;
pub mod keys;
pub mod libraries;
pub mod listeners;
pub mod observer;
pub mod others;
pub mod output;
pub mod pipeline;
pub mod pools;
pub mod privileges;
pub mod process;
pub mod programs;
pub mod record;
pub mod schema;
pub mod stats;
pub mod tables;
pub mod tls;
pub mod top;
pub mod tracefs;
pub mod units;
pub mod watch;
