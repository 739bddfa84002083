//! The whole packet path: a fresh `vectorlb_lb::Worker` built from `fuzz/pipeline.toml` (every
//! forwarding mode, IPv4 and IPv6, SNAT, a 16-session table, 8 local ports per address) runs a
//! sequence of fuzzed frames in two `process` calls at two fuzzed clock values, optionally
//! with a configuration change in between, then idles past every timeout.
//!
//! Checks: no panic anywhere; every `Tx(port)` verdict names an existing port and its frame
//! passes `parse_frame`; after idling, the session table is empty. The input format and the
//! exact sequence are in `src/pipeline.rs` (shared with `examples/seeds.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_fuzz::pipeline::{run, Case};

fuzz_target!(|data: &[u8]| {
    run(&Case::decode(data));
});
