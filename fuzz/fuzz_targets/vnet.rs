//! The virtio-net header of a pod's tun interface and the packet behind it
//! (`vectorlb_packet::vnet`): the first 10 bytes are the header, the rest the IP packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_packet::vnet::{self, VnetHdr, HDR_LEN, MIN_GSO_SIZE};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = VnetHdr::parse(data) else { return };
    let ip = &data[HDR_LEN..];
    let mut b = [0u8; HDR_LEN];
    h.emit(&mut b).unwrap();
    assert_eq!(&b[..], &data[..HDR_LEN], "the header round-trips");
    let mut p = ip.to_vec();
    if vnet::complete_checksum(&mut p, &h).is_err() {
        assert_eq!(p, ip, "a refused packet is left as it was");
    }
    let mut count = 0usize;
    if let Ok(r) = vnet::segment(ip, &h, &mut Vec::new(), |s| {
        assert!(s.len() <= ip.len(), "a segment is never longer than the packet");
        count += 1;
    }) {
        assert_eq!(r.count, count);
        assert!(r.largest <= ip.len());
        if h.gso_kind() != vnet::gso::NONE {
            assert!(count <= ip.len() / MIN_GSO_SIZE as usize + 1, "{count} segments of {} bytes", ip.len());
        }
    }
    // A packet kept whole and written on: the header made for it agrees with it, and what
    // the receiver would do with that header (complete, or cut) is refused never.
    if let Ok(seg) = vnet::keepable(ip, &h) {
        let mut k = ip.to_vec();
        let out = vnet::offload_hdr(&mut k, seg).expect("a keepable packet gets a header");
        assert_eq!(out.gso_size == 0, seg == 0);
        let mut c = k.clone();
        vnet::complete_checksum(&mut c, &VnetHdr { gso_type: 0, gso_size: 0, ..out }).expect("its checksum completes");
        if seg > 0 {
            vnet::segment(&k, &out, &mut Vec::new(), |_| {}).expect("it cuts");
        }
    }
});
