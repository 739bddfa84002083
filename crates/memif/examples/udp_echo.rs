//! A UDP echo server behind a memif interface: a pod's whole network stack in one loop.
//!
//! It connects to the data plane's memif socket as a client, answers ARP for its address and
//! ICMP echo requests, echoes UDP datagrams sent to its ports, and answers datagrams to any
//! other port with an ICMP port-unreachable, as a host would. It waits on the interface's
//! interrupt (eventfd) when idle, and reconnects when the data plane goes away.
//!
//!   udp_echo --socket /run/vectorlb/memif.sock --id 0 --mac 02:00:00:00:02:11 --ip 10.2.0.11 --port 7

use clap::Parser;
use std::net::Ipv4Addr;
use std::time::Duration;
use vectorlb_memif::{Client, ClientConfig, Mode, SocketAddr};

#[derive(Parser)]
struct Args {
    /// The data plane's memif socket (a path, or @name).
    #[arg(long)]
    socket: String,
    #[arg(long, default_value_t = 0)]
    id: u32,
    #[arg(long)]
    secret: Option<String>,
    /// Our MAC address.
    #[arg(long)]
    mac: String,
    /// Our IPv4 address.
    #[arg(long)]
    ip: Ipv4Addr,
    /// UDP ports to echo on (others get ICMP port unreachable).
    #[arg(long = "port", required = true)]
    ports: Vec<u16>,
    /// IP-mode memif: bare IPv4 packets, no Ethernet header (and no ARP).
    #[arg(long)]
    ip_mode: bool,
    /// Exit after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>().ok()?;
    v.try_into().ok()
}

/// The Internet checksum of `data` (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

struct Host {
    mac: [u8; 6],
    ip: [u8; 4],
    ports: Vec<u16>,
}

impl Host {
    /// The answer to `f`, written into `out`; false when `f` needs none.
    fn answer(&self, f: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        if f.len() < 14 {
            return false;
        }
        let ethertype = u16::from_be_bytes([f[12], f[13]]);
        let src_mac: [u8; 6] = f[6..12].try_into().unwrap();
        match ethertype {
            0x0806 if f.len() >= 42 && f[20..22] == [0, 1] && f[38..42] == self.ip => {
                // ARP request for us: reply.
                out.extend_from_slice(&src_mac);
                out.extend_from_slice(&self.mac);
                out.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
                out.extend_from_slice(&self.mac);
                out.extend_from_slice(&self.ip);
                out.extend_from_slice(&f[22..32]); // the asker's MAC and IP
                true
            }
            0x0800 if f.len() >= 34 => {
                let ihl = ((f[14] & 0x0f) as usize) * 4;
                let total = u16::from_be_bytes([f[16], f[17]]) as usize;
                if ihl < 20 || f.len() < 14 + total || total < ihl || f[30..34] != self.ip {
                    return false;
                }
                let ip = &f[14..14 + total];
                let (proto, l4) = (ip[9], &ip[ihl..]);
                match proto {
                    1 if l4.len() >= 8 && l4[0] == 8 => {
                        // Echo request: the same packet back, as an echo reply.
                        self.reply_ip(&src_mac, ip, ihl, out);
                        let o = 14 + ihl;
                        out[o] = 0;
                        out[o + 2..o + 4].copy_from_slice(&[0, 0]);
                        let c = checksum(&out[o..]);
                        out[o + 2..o + 4].copy_from_slice(&c.to_be_bytes());
                        true
                    }
                    17 if l4.len() >= 8 => {
                        let dport = u16::from_be_bytes([l4[2], l4[3]]);
                        if self.ports.contains(&dport) {
                            // Echo: addresses and ports swapped; both checksums stay valid.
                            self.reply_ip(&src_mac, ip, ihl, out);
                            let o = 14 + ihl;
                            out[o..o + 2].copy_from_slice(&l4[2..4]);
                            out[o + 2..o + 4].copy_from_slice(&l4[0..2]);
                        } else {
                            self.unreachable(&src_mac, ip, ihl, out);
                        }
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// `ip` back to its sender: Ethernet and IP addresses swapped, the rest as it came.
    fn reply_ip(&self, to: &[u8; 6], ip: &[u8], _ihl: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(to);
        out.extend_from_slice(&self.mac);
        out.extend_from_slice(&[0x08, 0x00]);
        out.extend_from_slice(ip);
        let h = &mut out[14..];
        let (src, dst) = ([h[12], h[13], h[14], h[15]], [h[16], h[17], h[18], h[19]]);
        h[12..16].copy_from_slice(&dst);
        h[16..20].copy_from_slice(&src);
        h[8] = 64;
        h[10..12].copy_from_slice(&[0, 0]);
        let ihl = ((h[0] & 0x0f) as usize) * 4;
        let c = checksum(&h[..ihl]);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }

    /// ICMP destination unreachable (port) quoting the datagram's IP header and 8 bytes.
    fn unreachable(&self, to: &[u8; 6], ip: &[u8], ihl: usize, out: &mut Vec<u8>) {
        let quote = &ip[..(ihl + 8).min(ip.len())];
        out.extend_from_slice(to);
        out.extend_from_slice(&self.mac);
        out.extend_from_slice(&[0x08, 0x00]);
        let total = 20 + 8 + quote.len();
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        h[8] = 64;
        h[9] = 1;
        h[12..16].copy_from_slice(&self.ip);
        h[16..20].copy_from_slice(&ip[12..16]);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&h);
        let o = out.len();
        out.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(quote);
        let c = checksum(&out[o..]);
        out[o + 2..o + 4].copy_from_slice(&c.to_be_bytes());
    }
}

fn main() {
    let a = Args::parse();
    let addr = SocketAddr::parse(&a.socket).unwrap_or_else(|e| panic!("--socket: {e}"));
    let host = Host { mac: parse_mac(&a.mac).expect("--mac: not a MAC address"), ip: a.ip.octets(), ports: a.ports };
    let mode = if a.ip_mode { Mode::Ip } else { Mode::Ethernet };
    let cfg = ClientConfig { id: a.id, name: "udp_echo".into(), secret: a.secret.map(String::into_bytes), mode, ..Default::default() };
    let ip_mode = a.ip_mode;
    let start = std::time::Instant::now();
    let done = || a.seconds > 0 && start.elapsed() >= Duration::from_secs(a.seconds);
    let (mut frame, mut out) = (Vec::new(), Vec::new());
    while !done() {
        let mut c = match Client::connect(&addr, &cfg) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("udp_echo: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        eprintln!("udp_echo: connected to {}", c.server_name);
        let mut answered = 0u64;
        while !done() {
            let q = &mut c.queues[0];
            let mut replies: Vec<Vec<u8>> = Vec::new();
            q.recv_copy(64, &mut frame, |f| {
                if ip_mode {
                    // The same host behind a header of its own making, taken off again.
                    let mut g = Vec::with_capacity(14 + f.len());
                    g.extend_from_slice(&host.mac);
                    g.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0x08, 0x00]);
                    g.extend_from_slice(f);
                    if f.first().is_some_and(|b| b >> 4 == 4) && host.answer(&g, &mut out) {
                        replies.push(out[14..].to_vec());
                    }
                } else if host.answer(f, &mut out) {
                    replies.push(out.clone());
                }
            });
            for r in &replies {
                if q.send_copy(r) {
                    answered += 1;
                }
            }
            if let Some(why) = q.broken() {
                eprintln!("udp_echo: the server broke a ring ({why}); reconnecting");
                break;
            }
            if replies.is_empty() && !q.wait(100) {
                if let Err(why) = c.check() {
                    eprintln!("udp_echo: {why} (answered {answered}); reconnecting");
                    break;
                }
            }
        }
    }
}
