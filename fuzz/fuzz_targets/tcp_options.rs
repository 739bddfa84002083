//! TCP header view and option iterator on arbitrary bytes, and TOA insertion.
//!
//! Input layout: byte 0 picks the TOA option (bit 0: 0 = IPv4, 8 bytes; 1 = IPv6, 20 bytes) and
//! how much spare room the buffer gets (bits 1..: 0..=31 bytes, so both the success and the
//! "no room" paths are reached); the rest is the TCP segment.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_packet::tcp::{self, field, TcpOption, TcpPacket};

/// Iterates all options; returns whether the walk was clean (no Err, no End) and the last option.
fn walk<'a>(p: &'a TcpPacket<&'a [u8]>) -> (bool, Option<TcpOption<'a>>) {
    let mut clean = true;
    let mut last = None;
    let mut errored = false;
    for opt in p.options() {
        assert!(!errored, "options iterator yielded an item after an Err");
        match opt {
            Ok(o) => {
                if o == TcpOption::End {
                    clean = false;
                }
                last = Some(o);
            }
            Err(_) => {
                errored = true;
                clean = false;
            }
        }
    }
    (clean, last)
}

fuzz_target!(|data: &[u8]| {
    // The whole input as a segment.
    if let Ok(p) = TcpPacket::new_checked(data) {
        let _ = (p.src_port(), p.dst_port(), p.seq(), p.ack(), p.flags(), p.window(), p.checksum());
        let _ = p.payload().len();
        walk(&p);
    }

    let Some((&sel, seg)) = data.split_first() else { return };
    let v6 = sel & 1 != 0;
    let room = (sel >> 1) as usize % 32;
    let addr: Vec<u8> = if v6 { vec![sel; 16] } else { vec![sel; 4] };
    let port = u16::from_be_bytes([sel, !sel]);
    let (opt, opt_len) = tcp::toa_option(&addr, port);
    assert_eq!(opt_len, if v6 { tcp::option::TOA_V6_LEN } else { tcp::option::TOA_V4_LEN });

    let seg_len = seg.len();
    let mut buf = seg.to_vec();
    buf.resize(seg_len + room, 0xee);
    let Ok(added) = tcp::insert_option(&mut buf, seg_len, &opt[..opt_len]) else { return };

    assert_eq!(added, opt_len.div_ceil(4) * 4);
    // insert_option succeeded, so the original header was valid.
    let before = TcpPacket::new_checked(seg).expect("insert_option accepted a header new_checked refuses");
    let after = TcpPacket::new_checked(&buf[..seg_len + added]).expect("grown segment does not parse");
    assert_eq!(after.header_len(), before.header_len() + added, "header length did not grow by {added}");
    assert!(after.header_len() <= tcp::MAX_HEADER_LEN);
    assert_eq!(after.payload(), before.payload(), "payload changed");
    assert_eq!(buf[field::OFF_FLAGS] & 0x0f, seg[field::OFF_FLAGS] & 0x0f, "reserved bits changed");
    assert_eq!(&buf[..field::OFF_FLAGS], &seg[..field::OFF_FLAGS], "fixed header changed");
    assert_eq!(&buf[field::OFF_FLAGS + 1..tcp::MIN_HEADER_LEN], &seg[field::OFF_FLAGS + 1..tcp::MIN_HEADER_LEN]);
    assert_eq!(&buf[tcp::MIN_HEADER_LEN..before.header_len()], &seg[tcp::MIN_HEADER_LEN..before.header_len()], "old options changed");
    // When the old options walked cleanly to the end of the header, the TOA is the last option.
    let (clean_before, _) = walk(&before);
    let (clean_after, last) = walk(&after);
    if clean_before {
        assert!(clean_after, "options no longer parse after insertion");
        assert_eq!(last, Some(TcpOption::Toa { port, addr: &addr[..] }), "TOA is not the last option");
    }
});
