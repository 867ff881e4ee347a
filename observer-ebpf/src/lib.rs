//! Empty on purpose: the eBPF programs are the `observer` binary target of this
//! crate, built for bpfel-unknown-none by `observer/build.rs`. This library only
//! lets `observer` declare a build-dependency so that cargo rebuilds it when the
//! eBPF sources change.
#![no_std]
