//! `Ipv6Packet::new_checked` and the extension-header walk (`upper`) on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_packet::ipv6::{Ipv6Packet, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(ip) = Ipv6Packet::new_checked(data) else { return };
    let _ = (ip.src(), ip.dst(), ip.hop_limit(), ip.traffic_class(), ip.flow_label(), ip.next_header());
    assert!(ip.total_len() <= data.len());
    if let Ok(up) = ip.upper() {
        // The upper-layer header starts after the fixed header and inside the packet.
        assert!(up.offset >= HEADER_LEN, "upper offset {} < 40", up.offset);
        assert!(up.offset <= ip.total_len(), "upper offset {} beyond total length {}", up.offset, ip.total_len());
        let _ = &data[up.offset..ip.total_len()];
    }
});
