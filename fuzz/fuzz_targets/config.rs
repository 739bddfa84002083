//! `vectorlb_config::Config::parse` on arbitrary text (invalid UTF-8 is replaced, lossily).
//!
//! Parsing must never panic, whatever the input; errors are fine. On `Ok`, the engine settings
//! it validated must hold and `worker_config` must not panic for any core count. (No worker is
//! built: a fuzzed `max_sessions` could ask for gigabytes.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_config::Config;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = Config::parse(&text) else { return };
    let e = &c.engine;
    assert!(e.max_sessions > 0, "{e:?}");
    assert!(e.index_entries >= e.max_sessions, "{e:?}");
    assert!((1..=4096).contains(&e.batch), "{e:?}");
    assert!(e.local_port_min >= 1 && e.local_port_min <= e.local_port_max, "{e:?}");
    assert!(e.sweep_budget >= 1, "{e:?}");
    for cores in [1u16, 2, 3, 64, u16::MAX] {
        let w = c.worker_config(cores - 1, cores);
        assert_eq!(w.batch, e.batch);
        assert!(w.table.core_shift <= 16, "cores {cores}: shift {}", w.table.core_shift);
    }
});
