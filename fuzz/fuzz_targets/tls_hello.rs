#![no_main]

use libfuzzer_sys::fuzz_target;
use observer::fuzzing;

fuzz_target!(|data: &[u8]| fuzzing::tls_hello(data));
