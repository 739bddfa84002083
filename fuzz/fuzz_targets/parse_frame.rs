//! `parse_frame` on arbitrary bytes, then the per-layer views at the offsets it returned.
//!
//! `parse_frame` promises that every length field fits in the buffer and that the TCP/UDP/ICMP
//! header is complete unless the packet is a later fragment, so constructing the views at its
//! offsets must succeed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_packet::icmp::IcmpPacket;
use vectorlb_packet::ipv4::Ipv4Packet;
use vectorlb_packet::ipv6::Ipv6Packet;
use vectorlb_packet::tcp::TcpPacket;
use vectorlb_packet::udp::{self, UdpPacket};
use vectorlb_packet::{parse_frame, proto, Error, Family, Frag};

fuzz_target!(|data: &[u8]| {
    let Ok(info) = parse_frame(data) else { return };

    // Offsets are ordered and inside the buffer, whatever the family.
    assert!(info.l3 <= data.len(), "l3 {} beyond buffer {}", info.l3, data.len());
    let Some(family) = info.family else { return };
    assert!(info.l3 <= info.l4 && info.l4 <= info.end && info.end <= data.len(), "{info:?} len {}", data.len());

    match family {
        Family::V4 => {
            let ip = Ipv4Packet::new_checked(&data[info.l3..]).expect("IPv4 view at info.l3");
            assert_eq!(info.l3 + ip.header_len(), info.l4);
            assert_eq!(info.l3 + ip.total_len() as usize, info.end);
            assert_eq!(ip.protocol(), info.proto);
            let _ = (ip.options().len(), ip.payload().len(), ip.verify_checksum(), ip.src(), ip.dst());
            let _ = (ip.tos(), ip.ident(), ip.dont_frag(), ip.more_frags(), ip.frag_offset(), ip.ttl());
        }
        Family::V6 => {
            let ip = Ipv6Packet::new_checked(&data[info.l3..]).expect("IPv6 view at info.l3");
            assert_eq!(info.l3 + ip.total_len(), info.end);
            let up = ip.upper().expect("upper() succeeded inside parse_frame");
            assert_eq!(info.l3 + up.offset, info.l4);
            assert_eq!(up.protocol, info.proto);
            let _ = (ip.src(), ip.dst(), ip.hop_limit(), ip.traffic_class(), ip.flow_label());
        }
    }

    if info.frag == Frag::Later {
        return;
    }
    let seg = &data[info.l4..info.end];
    match info.proto {
        proto::TCP => {
            let tcp = TcpPacket::new_checked(seg).expect("TCP header complete after parse_frame");
            let _ = (tcp.src_port(), tcp.dst_port(), tcp.seq(), tcp.ack(), tcp.flags(), tcp.window());
            let _ = (tcp.checksum(), tcp.payload().len());
            let mut errored = false;
            for opt in tcp.options() {
                assert!(!errored, "options iterator yielded an item after an Err");
                errored = opt.is_err();
            }
        }
        proto::UDP => match UdpPacket::new_checked(seg) {
            Ok(u) => {
                let _ = (u.src_port(), u.dst_port(), u.len(), u.is_empty(), u.checksum(), u.payload().len());
            }
            // A first fragment carries only part of the datagram its UDP length describes, so
            // parse_frame (rightly) only checks the 8-byte header there; `UdpPacket::new_checked`
            // also checks the length field against the buffer and may say Truncated.
            Err(Error::Truncated) if info.frag == Frag::First && seg.len() >= udp::HEADER_LEN => {}
            Err(e) => panic!("UDP view failed after parse_frame: {e:?} ({info:?})"),
        },
        proto::ICMP | proto::ICMPV6 => {
            let icmp = IcmpPacket::new_checked(seg).expect("ICMP header complete after parse_frame");
            let _ = (icmp.msg_type(), icmp.code(), icmp.checksum(), icmp.echo_ident(), icmp.echo_seq());
            let _ = (icmp.v4_next_hop_mtu(), icmp.v6_mtu(), icmp.payload().len());
        }
        _ => {}
    }
});
