//! The session hand-off file (vectorlb-sync's `handoff`): arbitrary bytes, read a second after
//! the time they claim, either parse or are refused whole with a message; nothing panics, and
//! what parses holds at most the records its length allows. The input is also taken as the
//! records of a well-formed file (what the fuzzer cannot seal itself), which must come back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_sync::handoff::{parse, Writer};
use vectorlb_sync::{decode, Secret};

fuzz_target!(|data: &[u8]| {
    let written = data.get(8..16).map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap()));
    match parse(data, written.saturating_add(1000)) {
        Ok(l) => assert!(l.records.len() <= data.len() / 98),
        Err(e) => assert!(!e.is_empty()),
    }
    // Records the fuzzer chose, sealed into a file by the writer: read back whole.
    let secret = Secret::new(b"fuzz: not the file's secret");
    let _ = decode(data, &secret);
    let mut w = Writer::new(1_000_000).unwrap();
    let records: Vec<_> = data
        .chunks_exact(8)
        .map(|c| vectorlb_lb::sync::SyncRecord {
            proto: c[0],
            vip: std::net::Ipv4Addr::new(10, 0, 0, c[1]).into(),
            vport: u16::from_be_bytes([c[2], c[3]]),
            client: std::net::Ipv6Addr::from([c[4]; 16]).into(),
            cport: u16::from_be_bytes([c[5], c[6]]),
            backend: std::net::Ipv4Addr::new(10, 1, 0, c[7]).into(),
            bport: 80,
            local: None,
            state: c[0] % 12,
            flags: 0,
            expire_in: 2000 + u32::from(c[1]),
            adj: Default::default(),
        })
        .collect();
    w.push(data.first().copied().unwrap_or(0), &records);
    let l = parse(&w.finish(), 1_000_500).expect("a file the writer made");
    assert_eq!(l.records.len(), records.len());
});
