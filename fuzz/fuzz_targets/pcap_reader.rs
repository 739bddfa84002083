//! `vectorlb_pcap::Reader` over an arbitrary byte slice: the header, then every record until the
//! end of the file or the first error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_pcap::{Reader, MAX_SNAPLEN};

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = Reader::new(data) else { return };
    let mut consumed = 24usize;
    for rec in reader {
        let Ok(rec) = rec else { break };
        assert!(rec.data.len() <= MAX_SNAPLEN as usize);
        assert!(rec.orig_len as usize >= rec.data.len());
        consumed += 16 + rec.data.len();
        assert!(consumed <= data.len(), "records claim more bytes than the file has");
    }
});
