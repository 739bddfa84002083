//! `ArpPacket::new_checked` and every accessor on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use vectorlb_packet::arp::{ArpPacket, PACKET_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = ArpPacket::new_checked(data) else { return };
    assert!(data.len() >= PACKET_LEN);
    assert_eq!(p.operation(), u16::from_be_bytes([data[6], data[7]]));
    assert_eq!(p.sender_mac(), data[8..14]);
    assert_eq!(p.sender_ip(), Ipv4Addr::new(data[14], data[15], data[16], data[17]));
    assert_eq!(p.target_mac(), data[18..24]);
    assert_eq!(p.target_ip(), Ipv4Addr::new(data[24], data[25], data[26], data[27]));
});
