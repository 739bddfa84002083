//! Writes seed corpora for the `pipeline` and `config` fuzz targets:
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example seeds -- fuzz/corpus
//!
//! (`scripts/fuzz.sh` runs it when `fuzz/corpus/pipeline` or `fuzz/corpus/config` is missing
//! or empty.) Pipeline seeds are in the target's input format and are replayed through the
//! target's own harness (`src/pipeline.rs`) before they are written. They are built with `vectorlb_packet::builder::Builder`, and
//! backend replies, ICMP errors quoting a flow and SNAT returns are derived from what a worker
//! built from the same `fuzz/pipeline.toml` actually transmitted, so they carry the real
//! backend, local address and local port.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use vectorlb_fuzz::pipeline::{self, flags as fl, Case};
use vectorlb_lb::{Control, HeapBuf, PacketBuf, Verdict, Worker};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::ethernet::Mac;
use vectorlb_packet::icmp::{v4, v6};
use vectorlb_packet::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use vectorlb_packet::{parse_frame, Family};

const DEMO: &str = include_str!("../../examples/fnat-demo.toml");

const EXT_MAC: Mac = [2, 0, 0, 0, 0, 1];
const GW_MAC: Mac = [2, 0, 0, 0, 0, 0xfe];
const INT_MAC: Mac = [2, 0, 0, 0, 1, 1];
const NOW0: u32 = 1_000;

/// A seed under construction: the input, and a worker that has seen its frames (one frame
/// per call, at the clock of the batch the frame is in) so that replies can be derived from
/// what it transmitted.
struct Seed {
    case: Case,
    control: Arc<Control>,
    worker: Worker,
    now: u32,
    /// The verdict of each frame while generating, for `SEEDS_VERBOSE=1`.
    log: Vec<String>,
}

impl Seed {
    fn new(flags: u8) -> Seed {
        let (control, worker) = pipeline::worker(flags);
        let case = Case { flags, now0: NOW0, dt: 500, split: 255, frames: Vec::new() };
        Seed { case, control, worker, now: NOW0, log: Vec::new() }
    }

    /// Starts the second batch: frames pushed from now on run `dt` ms later (after the
    /// configuration change, if the seed's flags ask for one).
    fn second_batch(&mut self, dt: u32) {
        self.case.split = self.case.frames.len() as u8;
        self.case.dt = dt;
        self.now = NOW0.wrapping_add(dt);
        if self.case.flags & fl::RECONFIGURE != 0 {
            self.control.apply(&pipeline::setup().reconfigured).expect("reconfigure");
        }
    }

    /// Adds a frame; returns what the worker transmitted for it, if anything.
    fn push(&mut self, f: Vec<u8>) -> Option<Vec<u8>> {
        let mut b = [HeapBuf::from_frame(&f)];
        let mut v = [Verdict::Kernel];
        self.worker.process(&mut b, &mut v, self.now);
        self.case.frames.push(f);
        match v[0] {
            Verdict::Tx(_) => {
                let o = seen(b[0].data());
                self.log.push(format!("at {}: {:?} {} -> {}", self.now, v[0], sa(o.src, o.sport), sa(o.dst, o.dport)));
                Some(b[0].data().to_vec())
            }
            _ => {
                self.log.push(format!("at {}: {:?}", self.now, v[0]));
                None
            }
        }
    }
}

/// Addresses, ports and layout of a frame the worker sent.
struct Seen {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    vlan: Option<u16>,
    eth_src: Mac,
    eth_dst: Mac,
    /// The IP packet (without Ethernet header or padding).
    ip: Vec<u8>,
}

fn seen(f: &[u8]) -> Seen {
    let i = parse_frame(f).expect("worker output parses");
    let (src, dst): (IpAddr, IpAddr) = match i.family.expect("IP") {
        Family::V4 => {
            let s: [u8; 4] = f[i.l3 + 12..i.l3 + 16].try_into().unwrap();
            let d: [u8; 4] = f[i.l3 + 16..i.l3 + 20].try_into().unwrap();
            (s.into(), d.into())
        }
        Family::V6 => {
            let s: [u8; 16] = f[i.l3 + 8..i.l3 + 24].try_into().unwrap();
            let d: [u8; 16] = f[i.l3 + 24..i.l3 + 40].try_into().unwrap();
            (s.into(), d.into())
        }
    };
    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    Seen {
        src,
        dst,
        sport: port(i.l4),
        dport: port(i.l4 + 2),
        vlan: i.vlan,
        eth_dst: f[0..6].try_into().unwrap(),
        eth_src: f[6..12].try_into().unwrap(),
        ip: f[i.l3..i.end].to_vec(),
    }
}

fn sa(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// The peer's answer to a TCP segment the worker sent.
fn tcp_reply(out: &[u8], flags: u8, payload: &[u8]) -> Vec<u8> {
    let s = seen(out);
    let mut b = Builder::tcp(&sa(s.dst, s.dport), &sa(s.src, s.sport), flags).payload(payload).macs(s.eth_dst, s.eth_src);
    if let Some(v) = s.vlan {
        b = b.vlan(v);
    }
    b.build()
}

/// The peer's answer to a UDP datagram the worker sent.
fn udp_reply(out: &[u8], payload: &[u8]) -> Vec<u8> {
    let s = seen(out);
    let mut b = Builder::udp(&sa(s.dst, s.dport), &sa(s.src, s.sport)).payload(payload).macs(s.eth_dst, s.eth_src);
    if let Some(v) = s.vlan {
        b = b.vlan(v);
    }
    b.build()
}

/// An ICMP error from `from` to `to` quoting (the start of) the IP packet `quoted`.
fn icmp_error(from: &str, to: &str, quoted: &[u8], too_big: Option<u16>, macs: (Mac, Mac), vlan: Option<u16>) -> Vec<u8> {
    let is_v6 = from.contains(':');
    let (t, code, rest) = match (is_v6, too_big) {
        (false, None) => (v4::DEST_UNREACH, v4::CODE_PORT_UNREACH, [0; 4]),
        (false, Some(m)) => (v4::DEST_UNREACH, v4::CODE_FRAG_NEEDED, [0, 0, (m >> 8) as u8, m as u8]),
        (true, None) => (v6::DEST_UNREACH, 4, [0; 4]),
        (true, Some(m)) => (v6::PACKET_TOO_BIG, 0, (m as u32).to_be_bytes()),
    };
    let keep = if is_v6 { quoted.len().min(1232) } else { quoted.len().min(28 + 8) };
    let mut b = Builder::icmp(from, to, t, code, rest).payload(&quoted[..keep]).macs(macs.0, macs.1);
    if let Some(v) = vlan {
        b = b.vlan(v);
    }
    b.build()
}

fn client_tcp(src: &str, dst: &str, flags: u8) -> Builder {
    Builder::tcp(src, dst, flags).macs(GW_MAC, EXT_MAC)
}

fn client_udp(src: &str, dst: &str) -> Builder {
    Builder::udp(src, dst).macs(GW_MAC, EXT_MAC)
}

fn inside_tcp(src: &str, dst: &str, flags: u8, backend_mac: Mac) -> Builder {
    Builder::tcp(src, dst, flags).macs(backend_mac, INT_MAC).vlan(100)
}

fn inside_udp(src: &str, dst: &str, backend_mac: Mac) -> Builder {
    Builder::udp(src, dst).macs(backend_mac, INT_MAC).vlan(100)
}

/// A TCP connection through a two-way (fnat / nat) service: handshake (TOA inserted on the
/// ACK), data both ways. Returns the transmitted SYN and SYN-ACK.
fn tcp_open(s: &mut Seed, client: &str, vip: &str) -> (Vec<u8>, Vec<u8>) {
    let syn = s.push(client_tcp(client, vip, SYN).tcp_options(&[2, 4, 5, 0xb4, 1, 3, 3, 7]).build()).expect("SYN forwarded");
    let synack = s.push(tcp_reply(&syn, SYN | ACK, b"")).expect("SYN-ACK returned");
    s.push(client_tcp(client, vip, ACK).build()).expect("ACK forwarded (TOA)");
    let data = s.push(client_tcp(client, vip, PSH | ACK).payload(b"GET / HTTP/1.1\r\n\r\n").build()).unwrap();
    s.push(tcp_reply(&data, PSH | ACK, b"HTTP/1.1 200 OK\r\n\r\n"));
    (syn, synack)
}

/// The client closes the connection `tcp_open` opened (time_wait = 0 removes the session).
fn tcp_close(s: &mut Seed, client: &str, vip: &str) {
    let fin = s.push(client_tcp(client, vip, FIN | ACK).build()).expect("FIN forwarded");
    s.push(tcp_reply(&fin, FIN | ACK, b"")).expect("FIN returned");
    s.push(client_tcp(client, vip, ACK).build()).expect("last ACK forwarded");
}

/// Bodies of client handshake records (the `tls_peek` target): ClientHellos of OpenSSL 3's
/// `s_client` (TLS 1.3 only, TLS 1.2 only, both), captured once, and a ClientKeyExchange.
const TLS_RECORDS: [(&str, &str); 4] = [
    // TLS 1.3 only
    ("client-hello-0", "010000d80303ac3ac168c8df989397b7568fd3c1491567f87f79da1d52b84d845746c6ba62dd203297ef547a01d6cfd856c99ebf11598a9783fe3b3edf4a2f5e044b0c094c819a000813021303130100ff01000087000b000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d001e001c040305030603080708080809080a080b080408050806040105010601002b0003020304002d00020101003300260024001d002001de59956eabda9b30f14bdf7d40eb6c026af675e618c9df15bf7320a986b811"),
    // TLS 1.2 only
    ("client-hello-1", "010000b30303519f74b2d24d03654869138194237a095c20152e541290185056cfdd10e2f89a000038c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d003c0035002f00ff01000052000b000403000102000a000c000a001d0017001e00190018002300000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602"),
    // TLS 1.2 and 1.3
    ("client-hello-2", "010001200303162d6adb7707827372ed1d68d7ed038d78ac788e340620df1f911da1d87bca4b20a95b3e59169f454fc673b914fa58da1cd59f6ca971edffa6a9c7f078c44d6a2a003e130213031301c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d003c0035002f00ff01000099000b000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d00209a4a0ddca2c9beb7bfc8a6059c4ced0991f2096f1c4f55002478a4b67de68e5a"),
    // a ClientKeyExchange with an X25519 key
    ("client-key-exchange", "100000212057866afe1d1730b4613a512b78ba943db9deb009f82c17760890b04923f4db6b"),
];

fn main() {
    let root = std::env::args().nth(1).unwrap_or_else(|| "corpus".into());
    let root = Path::new(&root);
    let new = Seed::new;
    let mut seeds: Vec<(&str, Seed)> = Vec::new();

    // IPv4 full NAT with TOA: a whole conversation, then ICMP errors quoting the flow from
    // both sides (backend -> local address, outside router -> VIP).
    let mut s = new(0);
    let (c, vip) = ("198.51.100.10:40000", "10.0.0.100:80");
    let (syn, synack) = tcp_open(&mut s, c, vip);
    let f = seen(&syn);
    s.push(icmp_error(&f.dst.to_string(), &f.src.to_string(), &f.ip, Some(1300), (f.eth_dst, INT_MAC), Some(100))).expect("translated");
    let r = seen(&synack);
    s.push(icmp_error("203.0.113.1", "10.0.0.100", &r.ip, None, (GW_MAC, EXT_MAC), None)).expect("translated");
    tcp_close(&mut s, c, vip);
    seeds.push(("fnat4-conversation-icmp", s));

    // The same conversation on two cores (ports partitioned), core 1, batches of 4.
    let mut s = new(fl::TWO_CORES | fl::CORE1 | fl::SMALL_BATCH);
    tcp_open(&mut s, "198.51.100.11:40001", "10.0.0.100:80");
    tcp_close(&mut s, "198.51.100.11:40001", "10.0.0.100:80");
    seeds.push(("fnat4-core1-batch4", s));

    // IPv6 full NAT with TOA behind the SYN proxy (fuzz/pipeline.toml: synproxy = "on"): the
    // SYN is answered with a cookie, and nothing reaches a backend yet.
    let mut s = new(0);
    let (c, vip) = ("[2001:db8:ff::10]:40000", "[2001:db8::100]:443");
    s.push(client_tcp(c, vip, SYN).tcp_options(&[2, 4, 5, 0xb4, 1, 3, 3, 7]).build()).expect("SYN answered with a cookie");
    seeds.push(("fnat6-synproxy-syn", s));

    // IPv4 NAT UDP: queries from two clients, replies, and ICMP errors both ways.
    let mut s = new(0);
    let q1 = s.push(client_udp("198.51.100.20:5000", "10.0.0.100:53").payload(b"query-1").build()).unwrap();
    let q2 = s.push(client_udp("198.51.100.21:5001", "10.0.0.100:53").payload(b"query-2").build()).unwrap();
    let a1 = s.push(udp_reply(&q1, b"answer-1")).unwrap();
    s.push(udp_reply(&q2, b"answer-2"));
    let f = seen(&q1);
    s.push(icmp_error(&f.dst.to_string(), &f.src.to_string(), &f.ip, None, (f.eth_dst, INT_MAC), Some(100)));
    let r = seen(&a1);
    s.push(icmp_error(&r.dst.to_string(), "10.0.0.100", &r.ip, None, (GW_MAC, EXT_MAC), None));
    seeds.push(("nat4-udp", s));

    // IPv6 NAT UDP with reply.
    let mut s = new(0);
    let q = s.push(client_udp("[2001:db8:ff::20]:5000", "[2001:db8::100]:53").payload(b"q6").build()).unwrap();
    s.push(udp_reply(&q, b"a6"));
    seeds.push(("nat6-udp", s));

    // DR TCP: one-way connection tracking, several clients (wlc, one backend without a
    // neighbour), and an ICMP error quoting a reply the backend sent directly.
    let mut s = new(0);
    for (i, c) in ["198.51.100.30:41000", "198.51.100.31:41001", "198.51.100.32:41002"].iter().enumerate() {
        s.push(client_tcp(c, "10.0.0.101:80", SYN).build());
        if i == 0 {
            s.push(client_tcp(c, "10.0.0.101:80", ACK).build());
            s.push(client_tcp(c, "10.0.0.101:80", PSH | ACK).payload(b"hello").build());
            s.push(client_tcp(c, "10.0.0.101:80", FIN | ACK).build());
            s.push(client_tcp(c, "10.0.0.101:80", ACK).build());
        }
    }
    let reply = Builder::tcp("10.0.0.101:80", "198.51.100.31:41001", SYN | ACK).build_ip();
    s.push(icmp_error("203.0.113.1", "10.0.0.101", &reply, None, (GW_MAC, EXT_MAC), None));
    seeds.push(("dr4-tcp", s));

    // TUN UDP (any port) and TUN IPv6 TCP.
    let mut s = new(0);
    s.push(client_udp("198.51.100.40:6000", "10.0.0.102:5000").payload(b"tun-1").build());
    s.push(client_udp("198.51.100.41:6001", "10.0.0.102:6000").payload(b"tun-2").build());
    let reply = Builder::udp("10.0.0.102:5000", "198.51.100.40:6000").build_ip();
    s.push(icmp_error("203.0.113.1", "10.0.0.102", &reply, None, (GW_MAC, EXT_MAC), None));
    s.push(client_tcp("[2001:db8:ff::40]:42000", "[2001:db8::101]:80", SYN).build());
    s.push(client_tcp("[2001:db8:ff::40]:42000", "[2001:db8::101]:80", ACK).build());
    seeds.push(("tun-udp4-tcp6", s));

    // ICMP echo to the VIPs, interface and local addresses, and to someone else.
    let mut s = new(0);
    for dst in ["10.0.0.100", "10.0.0.1", "10.1.0.200", "192.0.2.1"] {
        s.push(Builder::icmp("198.51.100.50", dst, v4::ECHO_REQUEST, 0, [0, 1, 0, 1]).payload(b"ping").macs(GW_MAC, EXT_MAC).build());
    }
    for dst in ["2001:db8::100", "2001:db8::1", "2001:db8:1::200"] {
        s.push(Builder::icmp("2001:db8:ff::50", dst, v6::ECHO_REQUEST, 0, [0, 1, 0, 1]).payload(b"ping6").macs(GW_MAC, EXT_MAC).build());
    }
    seeds.push(("icmp-echo", s));

    // SNAT: UDP and TCP from inside hosts, the returns, a NAT backend's own traffic, IPv6.
    let mut s = new(0);
    let o = s.push(inside_udp("10.1.0.50:33000", "8.8.8.8:53", [2, 0, 0, 0, 1, 0x50]).payload(b"dns?").build()).unwrap();
    s.push(udp_reply(&o, b"dns!"));
    let o = s.push(inside_tcp("10.1.0.51:40000", "93.184.216.34:443", SYN, [2, 0, 0, 0, 1, 0x51]).build()).unwrap();
    s.push(tcp_reply(&o, SYN | ACK, b""));
    s.push(inside_tcp("10.1.0.51:40000", "93.184.216.34:443", ACK, [2, 0, 0, 0, 1, 0x51]).build());
    let f = seen(&o);
    s.push(icmp_error("203.0.113.9", &f.src.to_string(), &f.ip, None, (GW_MAC, EXT_MAC), None));
    s.push(inside_udp("10.1.0.11:53", "8.8.4.4:53", [2, 0, 0, 0, 1, 0x11]).payload(b"backend-own").build());
    let o = s.push(inside_udp("[2001:db8:1::50]:33000", "[2001:4860::8888]:53", [2, 0, 0, 0, 1, 0x50]).payload(b"dns6?").build());
    if let Some(o) = o {
        s.push(udp_reply(&o, b"dns6!"));
    }
    seeds.push(("snat", s));

    // Edge cases: TTL 1 (time exceeded), too big with and without DF, IPv6 too big, a
    // fragment, ARP, a VLAN-tagged client, IPv4 options, long TCP options (no room for TOA),
    // an unsupported protocol, a port without service, a bad IPv4 checksum, weight-0 NAT.
    let mut s = new(0);
    s.push(client_tcp("198.51.100.60:43000", "10.0.0.100:80", SYN).ttl(1).build());
    s.push(client_tcp("198.51.100.61:43001", "10.0.0.100:80", SYN).build());
    s.push(client_tcp("198.51.100.61:43001", "10.0.0.100:80", ACK).payload(&[0x55; 1440]).build());
    s.push(client_udp("198.51.100.62:43002", "10.0.0.100:53").dont_frag(false).payload(&[0x66; 1440]).build());
    s.push(client_tcp("[2001:db8:ff::60]:43000", "[2001:db8::100]:443", SYN).build());
    s.push(client_tcp("[2001:db8:ff::60]:43000", "[2001:db8::100]:443", ACK).payload(&[0x77; 1400]).build());
    let mut frag = client_udp("198.51.100.63:43003", "10.0.0.102:7000").payload(&[1; 64]).dont_frag(false).build();
    frag[14 + 6] |= 0x20; // more fragments
    let sum = {
        frag[14 + 10] = 0;
        frag[14 + 11] = 0;
        vectorlb_packet::checksum::checksum(&frag[14..34])
    };
    frag[14 + 10..14 + 12].copy_from_slice(&sum.to_be_bytes());
    s.push(frag);
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&GW_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&GW_MAC);
    arp.extend_from_slice(&[10, 0, 0, 254, 0, 0, 0, 0, 0, 0, 10, 0, 0, 100]);
    s.push(arp);
    s.push(client_tcp("198.51.100.64:43004", "10.0.0.100:80", SYN).vlan(7).build());
    s.push(client_tcp("198.51.100.65:43005", "10.0.0.100:80", SYN).ip_options(&[1, 1, 1, 0]).build());
    let long = [2, 4, 5, 0xb4, 1, 3, 3, 7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 1, 1, 1, 1, 1, 0];
    let syn = s.push(client_tcp("198.51.100.66:43006", "10.0.0.100:80", SYN).tcp_options(&long).build()).unwrap();
    s.push(tcp_reply(&syn, SYN | ACK, b""));
    s.push(client_tcp("198.51.100.66:43006", "10.0.0.100:80", ACK).tcp_options(&long).build());
    s.push(Builder::raw("198.51.100.67", "10.0.0.100", 47).payload(&[0; 8]).macs(GW_MAC, EXT_MAC).build());
    s.push(client_tcp("198.51.100.68:43008", "10.0.0.100:8080", SYN).build());
    let mut bad = client_tcp("198.51.100.69:43009", "10.0.0.100:80", SYN).build();
    bad[14 + 10] ^= 0xff;
    s.push(bad);
    s.push(client_tcp("198.51.100.70:43010", "10.0.0.103:80", SYN).build());
    s.push(client_tcp("198.51.100.71:43011", "10.0.0.100:80", RST).build());
    seeds.push(("edge-cases", s));

    // More new flows than local ports (8) and sessions (16): no_local_port, table full.
    let mut s = new(0);
    for i in 0..32u16 {
        let c = format!("198.51.100.{}:{}", 100 + i, 30000 + i);
        if i < 10 {
            s.push(client_tcp(&c, "10.0.0.100:80", SYN).build());
        } else if i % 2 == 0 {
            s.push(client_udp(&c, "10.0.0.100:53").payload(b"q").build());
        } else {
            s.push(client_udp(&c, &format!("10.0.0.102:{}", 7000 + i)).payload(b"t").build());
        }
    }
    seeds.push(("flood", s));

    // Expiry between the two batches: the SYN times out (1 s) before the ACK, the UDP
    // session (3 s) before the reply.
    let mut s = new(0);
    let syn = s.push(client_tcp("198.51.100.80:44000", "10.0.0.100:80", SYN).build()).unwrap();
    let q = s.push(client_udp("198.51.100.81:44001", "10.0.0.100:53").payload(b"q").build()).unwrap();
    s.second_batch(4_000);
    s.push(tcp_reply(&syn, SYN | ACK, b""));
    s.push(client_tcp("198.51.100.80:44000", "10.0.0.100:80", ACK).build());
    s.push(udp_reply(&q, b"late"));
    seeds.push(("expiry", s));

    // Second batch within the timeouts: a handshake split across the two calls.
    let mut s = new(0);
    let syn = s.push(client_tcp("198.51.100.90:45000", "10.0.0.100:80", SYN).build()).unwrap();
    s.second_batch(300);
    s.push(tcp_reply(&syn, SYN | ACK, b""));
    s.push(client_tcp("198.51.100.90:45000", "10.0.0.100:80", ACK).build());
    seeds.push(("two-batches", s));

    // A configuration change between the batches: flows of every kind open in the first
    // batch and continue in the second, after a backend, a service and the SNAT address have
    // gone (src/pipeline.rs, `reconfigure`).
    let mut s = new(fl::RECONFIGURE);
    let mut fnat = Vec::new();
    for i in 0..6u16 {
        let c = format!("198.51.100.{}:{}", 110 + i, 46000 + i);
        let syn = s.push(client_tcp(&c, "10.0.0.100:80", SYN).build()).unwrap();
        fnat.push((c, syn));
    }
    let q: Vec<_> = (0..2u16).map(|i| s.push(client_udp(&format!("198.51.100.{}:{}", 120 + i, 47000 + i), "10.0.0.100:53").payload(b"q").build()).unwrap()).collect();
    s.push(client_tcp("198.51.100.130:48000", "10.0.0.101:80", SYN).build());
    s.push(client_tcp("[2001:db8:ff::40]:42000", "[2001:db8::101]:80", SYN).build());
    let o = s.push(inside_udp("10.1.0.50:33000", "8.8.8.8:53", [2, 0, 0, 0, 1, 0x50]).payload(b"dns?").build()).unwrap();
    s.second_batch(200);
    for (c, syn) in &fnat {
        s.push(tcp_reply(syn, SYN | ACK, b""));
        s.push(client_tcp(c, "10.0.0.100:80", ACK).build());
    }
    for q in &q {
        s.push(udp_reply(q, b"a"));
    }
    s.push(client_tcp("198.51.100.130:48000", "10.0.0.101:80", ACK).build());
    s.push(client_tcp("[2001:db8:ff::40]:42000", "[2001:db8::101]:80", ACK).build());
    s.push(udp_reply(&o, b"dns!"));
    s.push(inside_udp("10.1.0.50:33000", "8.8.8.8:53", [2, 0, 0, 0, 1, 0x50]).payload(b"again").build());
    s.push(client_tcp("198.51.100.131:48001", "10.0.0.104:80", SYN).build());
    seeds.push(("reconfigure", s));

    let verbose = std::env::var_os("SEEDS_VERBOSE").is_some();
    let dir = root.join("pipeline");
    std::fs::create_dir_all(&dir).expect("create corpus dir");
    let mut count = 0;
    for (name, s) in &seeds {
        // Replay the seed the way the fuzz target does (all frames of a batch in one call,
        // with the target's checks).
        let out = pipeline::run(&s.case);
        if verbose {
            eprintln!("{name} (flags {:#x}, split {}, dt {}):", s.case.flags, s.case.split, s.case.dt);
            for (i, l) in s.log.iter().enumerate() {
                eprintln!("  frame {i:2} {l:70} target: {:?}", out.verdicts[i]);
            }
        }
        std::fs::write(dir.join(format!("seed-{name}")), s.case.encode()).expect("write seed");
        count += 1;
        // Each frame on its own too, so the fuzzer has single-frame starting points.
        for (i, f) in s.case.frames.iter().enumerate() {
            let one = Case { flags: 0, now0: NOW0, dt: 0, split: 255, frames: vec![f.clone()] };
            std::fs::write(dir.join(format!("seed-{name}-{i:02}")), one.encode()).expect("write seed");
            count += 1;
        }
    }
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).expect("create corpus dir");
    std::fs::write(dir.join("seed-pipeline.toml"), pipeline::CONFIG).expect("write seed");
    std::fs::write(dir.join("seed-fnat-demo.toml"), DEMO).expect("write seed");
    // The demo's file with a queue set (three workers, one in the set, a rate limit).
    let sets = format!("[runtime]\nworkers = 3\n\n{DEMO}")
        + "\n[[queue_sets]]\nname = \"web\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [2]\nrate = { bps = 1000000000, pps = 100000, burst_ms = 10 }\nbusy_poll = false\n\n[default_set]\ningress = { pps = 200000, bps = 2000000000, burst_ms = 5 }\n";
    std::fs::write(dir.join("seed-queue-sets.toml"), sets).expect("write seed");
    // The proxy's: every TOML example of docs/proxy.md.
    let pdir = root.join("proxy_config");
    std::fs::create_dir_all(&pdir).expect("create corpus dir");
    let doc = include_str!("../../docs/proxy.md");
    let mut n = 0;
    for (i, block) in doc.split("```toml\n").skip(1).enumerate() {
        let toml = block.split("```").next().unwrap_or("");
        std::fs::write(pdir.join(format!("seed-doc-{i}.toml")), toml).expect("write seed");
        n += 1;
    }
    let tdir = root.join("tls_peek");
    std::fs::create_dir_all(&tdir).expect("create corpus dir");
    for (name, hex) in TLS_RECORDS {
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
        std::fs::write(tdir.join(name), bytes).expect("write seed");
    }
    println!(
        "wrote {count} pipeline seeds to {}, 3 config seeds to {}, {n} proxy seeds to {} and {} TLS records to {}",
        root.join("pipeline").display(),
        dir.display(),
        pdir.display(),
        TLS_RECORDS.len(),
        tdir.display()
    );
}
