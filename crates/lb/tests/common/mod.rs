//! A two-arm test topology shared by the fixture tests.
//!
//! ```text
//! client 198.51.100.7 / 2001:db8:ff::7
//!    | via router 10.0.0.254 / 2001:db8::fe (02:00:00:00:00:fe)
//! [port 0 "ext" 02:00:00:00:00:01  10.0.0.1/24  2001:db8::1/64]   VIPs 10.0.0.100, 2001:db8::100
//! [port 1 "int" 02:00:00:00:01:01  10.1.0.1/24  2001:db8:1::1/64] local 10.1.0.200, 2001:db8:1::200
//!    | backends 10.1.0.11..13 / 2001:db8:1::11..13 (02:00:00:00:01:11..13)
//! ```
#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;
use vectorlb_lb::*;
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

#[allow(unused_imports)] // each test binary uses its own part of this module
pub use vectorlb_lb::service::two_arm::{EXT_MAC, INT_MAC, ROUTER_MAC};

pub fn be_mac(i: u8) -> [u8; 6] {
    [2, 0, 0, 0, 1, 0x10 + i]
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub struct Fam {
    pub v6: bool,
}

impl Fam {
    pub fn client(&self) -> &'static str {
        if self.v6 {
            "2001:db8:ff::7"
        } else {
            "198.51.100.7"
        }
    }
    pub fn vip(&self) -> &'static str {
        if self.v6 {
            "2001:db8::100"
        } else {
            "10.0.0.100"
        }
    }
    pub fn laddr(&self) -> &'static str {
        if self.v6 {
            "2001:db8:1::200"
        } else {
            "10.1.0.200"
        }
    }
    pub fn int_addr(&self) -> &'static str {
        if self.v6 {
            "2001:db8:1::1"
        } else {
            "10.1.0.1"
        }
    }
    pub fn backend(&self, i: u8) -> String {
        if self.v6 {
            format!("2001:db8:1::1{i}")
        } else {
            format!("10.1.0.1{i}")
        }
    }
    /// The four endpoints of the standard TCP flow: client:40000, VIP:80, backend 1:8080 and
    /// the first full-NAT local port.
    pub fn flow(&self) -> (String, String, String, String) {
        (self.sock(self.client(), 40000), self.sock(self.vip(), 80), self.sock(&self.backend(1), 8080), self.sock(self.laddr(), 1024))
    }

    /// "addr:port" with brackets for IPv6.
    pub fn sock(&self, a: &str, port: u16) -> String {
        if self.v6 {
            format!("[{a}]:{port}")
        } else {
            format!("{a}:{port}")
        }
    }
}

pub fn topology() -> LbSpec {
    let mut spec = vectorlb_lb::service::two_arm::spec(24);
    for i in 1..=3u8 {
        spec.neighbors.push((ip(&format!("10.1.0.1{i}")), be_mac(i)));
        spec.neighbors.push((ip(&format!("2001:db8:1::1{i}")), be_mac(i)));
    }
    spec
}

pub fn service(f: &Fam, mode: Mode, protocol: u8, port: u16, backends: &[(u8, u16, u32)]) -> ServiceSpec {
    ServiceSpec {
        vip: ip(f.vip()),
        port,
        proto: protocol,
        mode,
        scheduler: Algorithm::Rr,
        backends: backends.iter().map(|&(i, p, w)| BackendSpec { addr: ip(&f.backend(i)), port: p, weight: w, quic_id: None }).collect(),
        local_addrs: if mode == Mode::Fnat { vec![ip(f.laddr())] } else { vec![] },
        peer_local_addrs: vec![],
        toa: false,
        synproxy: Default::default(),
        timeouts: Timeouts::default(),
        continuation: false,
        quic: false,
        affinity_ms: 0,
        keep_source: Vec::new(),
    }
}

pub fn proto_name(p: u8) -> &'static str {
    if p == proto::TCP {
        "tcp"
    } else {
        "udp"
    }
}

pub struct Lb {
    pub control: Arc<Control>,
    pub worker: Worker,
    pub now: u32,
}

impl Lb {
    pub fn new(spec: LbSpec) -> Lb {
        Lb::with_capacity(spec, 1000)
    }

    pub fn with_capacity(spec: LbSpec, max: u32) -> Lb {
        let control = Control::new(&spec).expect("valid spec");
        let mut cfg = WorkerConfig::new(max);
        cfg.table.index_entries = max * 2;
        let worker = Worker::new(control.clone(), cfg).unwrap();
        Lb { control, worker, now: 1 }
    }

    /// Runs one frame; returns the verdict and the frame as it would leave.
    pub fn run(&mut self, frame: &[u8]) -> (Verdict, Vec<u8>) {
        let mut bufs = [HeapBuf::from_frame(frame)];
        let mut v = [Verdict::Kernel];
        self.worker.process(&mut bufs, &mut v, self.now);
        (v[0], bufs[0].data().to_vec())
    }

    pub fn expect_tx(&mut self, frame: &[u8], port: u16, expected: &[u8]) {
        let (v, out) = self.run(frame);
        assert_eq!(v, Verdict::Tx(port), "verdict");
        if out != expected {
            panic!("output differs\n got:      {}\n expected: {}", hex(&out), hex(expected));
        }
    }

    pub fn expect_drop(&mut self, frame: &[u8], reason: DropReason) {
        let (v, _) = self.run(frame);
        assert_eq!(v, Verdict::Drop(reason));
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
