//! Writes the capture `make demo` replays: 1,000 IPv4 clients opening TCP connections to the
//! demo VIP (SYN, then an ACK with a request), 100 IPv6 DNS queries, a ping to the VIP, an ARP
//! request, and a few malformed frames.
//!
//! Usage: cargo run --release --example demo_pcap -- OUT.pcap

use std::fs::File;
use std::io::BufWriter;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::tcp::flags::*;
use vectorlb_pcap::Writer;

const ROUTER: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const LB: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn main() {
    let out = std::env::args().nth(1).expect("usage: demo_pcap OUT.pcap");
    let mut w = Writer::new(BufWriter::new(File::create(&out).expect("create output"))).expect("write header");
    let mut ts = 1_700_000_000_000_000_000u64;
    let mut put = |w: &mut Writer<BufWriter<File>>, f: &[u8]| {
        ts += 10_000;
        w.write(ts, f).expect("write");
    };
    for i in 0..1000u32 {
        let client = format!("198.51.{}.{}:{}", 100 + i / 250, i % 250 + 1, 20000 + i);
        let syn = Builder::tcp(&client, "10.0.0.100:80", SYN).seq(i).macs(ROUTER, LB).build();
        put(&mut w, &syn);
        let req = Builder::tcp(&client, "10.0.0.100:80", PSH | ACK).seq(i + 1).payload(b"GET / HTTP/1.0\r\n\r\n").macs(ROUTER, LB).build();
        put(&mut w, &req);
    }
    for i in 0..100u32 {
        let q = Builder::udp(&format!("[2001:db8:ff::{:x}]:{}", i + 1, 30000 + i), "[2001:db8::100]:53")
            .payload(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01")
            .macs(ROUTER, LB)
            .build();
        put(&mut w, &q);
    }
    put(&mut w, &Builder::icmp("198.51.100.1", "10.0.0.100", 8, 0, [0, 1, 0, 1]).payload(b"ping").macs(ROUTER, LB).build());
    let arp = vectorlb_packet::arp::build(1, ROUTER, "10.0.0.254".parse().unwrap(), [0; 6], "10.0.0.100".parse().unwrap());
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&ROUTER);
    f.extend_from_slice(&[0x08, 0x06]);
    f.extend_from_slice(&arp);
    put(&mut w, &f);
    // Malformed: a runt, a lying IPv4 length, a bad header checksum.
    let good = Builder::tcp("198.51.100.9:1000", "10.0.0.100:80", SYN).macs(ROUTER, LB).build();
    put(&mut w, &good[..20]);
    let mut long = good.clone();
    long[17] = 0xff;
    put(&mut w, &long);
    let mut bad = good.clone();
    bad[24] ^= 0xff;
    put(&mut w, &bad);
    w.flush().expect("flush");
}
