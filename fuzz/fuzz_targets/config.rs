//! `vectorlb_config::Config::parse` on arbitrary text (invalid UTF-8 is replaced, lossily).
//!
//! Parsing must never panic, whatever the input; errors are fine. On `Ok`, the engine settings
//! it validated must hold, queue sets must be consistent and written back unchanged, and
//! `worker_config` must not panic for any core count. (No worker is built: a fuzzed
//! `max_sessions` could ask for gigabytes.)
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
    // Queue sets: workers that exist, each in one set, at least one left for the rest, each
    // service in one set; and the file written back reads the same.
    let mut taken = std::collections::HashSet::new();
    let mut services = std::collections::HashSet::new();
    for q in &c.queue_sets {
        assert!(!q.workers.is_empty());
        for w in &q.workers {
            assert!(*w < c.runtime.workers && taken.insert(*w), "{q:?}");
        }
        for s in &q.services {
            assert!(services.insert(*s), "{q:?}");
        }
        if let Some(r) = q.rate {
            assert!(r.bps != Some(0) && r.pps != Some(0) && (r.bps.is_some() || r.pps.is_some()) && r.burst_ms >= 1);
        }
    }
    assert!(c.queue_sets.is_empty() || taken.len() < c.runtime.workers as usize);
    if let Some(r) = c.default_ingress {
        assert!(r.bps != Some(0) && r.pps != Some(0) && (r.bps.is_some() || r.pps.is_some()) && (1..=10_000).contains(&r.burst_ms));
    }
    if !c.queue_sets.is_empty() || c.default_ingress.is_some() {
        assert_eq!(Config::parse(&c.to_toml()).as_ref().ok(), Some(&c), "queue sets write back");
    }
    for cores in [1u16, 2, 3, 64, u16::MAX] {
        let w = c.worker_config(cores - 1, cores);
        assert_eq!(w.batch, e.batch);
        assert!(w.table.core_shift <= 16, "cores {cores}: shift {}", w.table.core_shift);
    }
});
