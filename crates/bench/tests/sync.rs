//! The sync benchmark's own check, in a process of its own (the pipeline benchmark's test
//! samples the process's memory, which another test's tables would disturb).

use vectorlb_bench::sync::{run, Options};

#[test]
fn every_session_goes_out_and_comes_in() {
    for v6 in [false, true] {
        let r = run(&Options { v6, sessions: 5_000, rounds: 2 }).unwrap();
        assert_eq!(r.errors, 0, "{r:?}");
        assert!(r.send_per_second > 0.0 && r.receive_per_second > 0.0);
        // 98 bytes a record, a 64-byte header and a 16-byte tag per 16: 103.
        assert!((r.bytes_per_session - 103.0).abs() < 0.01, "{r:?}");
    }
}
