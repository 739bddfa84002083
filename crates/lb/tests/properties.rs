//! Property tests: whatever arrives, the pipeline answers with a verdict, never a panic, and
//! what it transmits is a well-formed frame.

mod common;

use common::*;
use proptest::prelude::*;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;

fn lb_with_every_mode() -> Lb {
    let f4 = Fam { v6: false };
    let f6 = Fam { v6: true };
    let mut spec = topology();
    let mut s = service(&f4, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1), (2, 8080, 1)]);
    s.toa = true;
    spec.services.push(s);
    spec.services.push(service(&f4, Mode::Nat, proto::UDP, 53, &[(1, 53, 1)]));
    let mut dr = service(&f4, Mode::Dr, proto::TCP, 443, &[(2, 0, 1)]);
    dr.vip = ip("10.0.0.101");
    spec.services.push(dr);
    let mut tun = service(&f6, Mode::Tun, proto::UDP, 53, &[(3, 0, 1)]);
    tun.vip = ip("2001:db8::101");
    spec.services.push(tun);
    spec.services.push(service(&f6, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]));
    spec.snat.push(SnatSpec { source: ip("10.1.0.0"), prefix_len: 24, addrs: vec![ip("10.0.0.200")], timeouts: Timeouts::default(), except: Vec::new(), outbound_only: false });
    Lb::with_capacity(spec, 16)
}

fn valid_frames() -> Vec<Vec<u8>> {
    vec![
        Builder::tcp("198.51.100.7:1000", "10.0.0.100:80", SYN).build(),
        Builder::tcp("198.51.100.7:1000", "10.0.0.100:80", ACK).payload(b"GET /").build(),
        Builder::tcp("10.1.0.11:8080", "10.1.0.200:1024", SYN | ACK).build(),
        Builder::udp("198.51.100.7:5353", "10.0.0.100:53").payload(b"q").build(),
        Builder::udp("10.1.0.11:53", "198.51.100.7:5353").payload(b"a").build(),
        Builder::tcp("198.51.100.8:2000", "10.0.0.101:443", SYN).build(),
        Builder::udp("[2001:db8:ff::7]:5000", "[2001:db8::101]:53").payload(b"q6").build(),
        Builder::tcp("[2001:db8:ff::7]:5000", "[2001:db8::100]:80", SYN).build(),
        Builder::udp("10.1.0.12:7000", "203.0.113.1:9").payload(b"out").build(),
        Builder::icmp("198.51.100.7", "10.0.0.100", 8, 0, [0, 1, 0, 1]).build(),
        Builder::icmp("10.1.0.254", "10.1.0.200", 3, 4, [0, 0, 5, 0]).payload(&Builder::tcp("10.1.0.200:1024", "10.1.0.11:8080", ACK).build_ip()).build(),
    ]
}

fn check(lb: &mut Lb, frames: &[Vec<u8>], now: u32) {
    let mut bufs: Vec<HeapBuf> = frames.iter().map(|f| HeapBuf::from_frame(f)).collect();
    let mut v = vec![Verdict::Kernel; bufs.len()];
    lb.worker.process(&mut bufs, &mut v, now);
    for (b, v) in bufs.iter().zip(&v) {
        if let Verdict::Tx(port) = v {
            assert!(*port < 2);
            vectorlb_packet::parse_frame(b.data()).expect("transmitted frames parse");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..20), now in any::<u32>()) {
        let mut lb = lb_with_every_mode();
        check(&mut lb, &frames, now);
        lb.worker.idle(now.wrapping_add(1_000_000), 1000);
    }

    #[test]
    fn mutated_valid_frames_never_panic(picks in proptest::collection::vec((0usize..11, any::<usize>(), any::<u8>(), 0usize..80), 1..40), now in 1u32..1000) {
        let base = valid_frames();
        let mut lb = lb_with_every_mode();
        let frames: Vec<Vec<u8>> = picks.iter().map(|&(k, at, byte, cut)| {
            let mut f = base[k].clone();
            let at = at % f.len();
            f[at] ^= byte;
            if cut > 60 { f.truncate(f.len().saturating_sub(cut - 60)); }
            f
        }).collect();
        // Valid traffic first so that sessions exist, then the mutants.
        check(&mut lb, &base, now);
        check(&mut lb, &frames, now + 1);
        check(&mut lb, &base, now + 2);
    }
}

#[test]
fn valid_frames_are_all_handled() {
    let mut lb = lb_with_every_mode();
    let frames = valid_frames();
    let mut bufs: Vec<HeapBuf> = frames.iter().map(|f| HeapBuf::from_frame(f)).collect();
    let mut v = vec![Verdict::Kernel; bufs.len()];
    lb.worker.process(&mut bufs, &mut v, 1);
    // The FNAT reply and the ICMP error refer to port 1024, which the FNAT SYN in the same
    // batch bound: both must be translated.
    assert!(v.iter().all(|x| matches!(x, Verdict::Tx(_))), "{v:?}");
}
