//! `vectorlb-tools pod-memif`: an application in a pod that uses the memif vectorlb gives it
//! (docs/pod-network.md#memif-by-annotation), written as the example of the memif client
//! library (`vectorlb_memif::Client`).
//!
//! The pod's memif is in IP mode: each buffer holds one bare IPv4 or IPv6 packet, to or from
//! the pod's own address (the same as its interface's). The application connects to the
//! daemon's socket in the pod's network namespace (`@vectorlb/memif-eth0` for `eth0`), then
//! receives and sends on queue 0 without a system call per packet; when the daemon restarts,
//! the connection breaks and the application connects again.
//!
//! - `echo`: answers every UDP datagram (addresses and ports swapped in place: the checksums
//!   stay right, a swap does not change a one's-complement sum) and counts the rest (TCP
//!   segments, say: a real application would bring a TCP stack).
//! - `send`: sends UDP datagrams of a size to a destination as fast as the ring takes them.
//! - `sink`: counts what arrives.
//!
//! Each prints one JSON line at the end.

use crate::ToolError;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr as NetAddr};
use std::time::{Duration, Instant};
use vectorlb_memif::{Buf, Client, ClientConfig, Mode, SocketAddr};
use vectorlb_packet::checksum;

#[derive(Subcommand, Debug, Clone)]
pub enum PodMemifCmd {
    /// Echoes UDP datagrams back to their senders.
    Echo(Common),
    /// Sends UDP datagrams as fast as the ring takes them.
    Send(SendArgs),
    /// Counts the packets that arrive.
    Sink(Common),
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The memif socket (in the pod's namespace).
    #[arg(long, default_value = "@vectorlb/memif-eth0")]
    pub socket: String,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
}

#[derive(Args, Debug, Clone)]
pub struct SendArgs {
    #[command(flatten)]
    pub common: Common,
    /// The pod's own address (the source).
    #[arg(long)]
    pub src: IpAddr,
    /// Where to: ADDRESS:PORT (of the source's family).
    #[arg(long)]
    pub dst: NetAddr,
    /// Bytes per frame as on an Ethernet wire (64 to 1514; the IP packet is 14 bytes shorter).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Source ports used in turn (flows), from 10000.
    #[arg(long, default_value_t = 16)]
    pub flows: u16,
    /// Packets per second at most (0: as fast as the ring takes them).
    #[arg(long, default_value_t = 0)]
    pub pps: u64,
}

/// Connects, trying again until `deadline` (the daemon may be starting, or restarting).
fn connect(socket: &str, deadline: Instant) -> Result<Option<Client>, ToolError> {
    let addr = SocketAddr::parse(socket).map_err(ToolError::Usage)?;
    let cfg = ClientConfig { name: "pod-memif".into(), mode: Mode::Ip, queues: 1, log2_ring: 10, buffer_size: 2048, ..Default::default() };
    while Instant::now() < deadline {
        match Client::connect(&addr, &cfg) {
            Ok(c) => return Ok(Some(c)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    Ok(None)
}

/// Whether the connection is gone (the daemon stopped, or broke a ring).
fn broken(c: &Client) -> bool {
    c.check().is_err() || c.queues[0].broken().is_some()
}

/// Swaps a UDP packet's addresses and ports in place; false when `p` is not UDP.
pub fn swap_udp(p: &mut [u8]) -> bool {
    let (a, alen, l4) = match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= 28 && p[9] == 17 => (12, 4, usize::from(p[0] & 0x0f) * 4),
        Some(6) if p.len() >= 48 && p[6] == 17 => (8, 16, 40),
        _ => return false,
    };
    if p.len() < l4 + 8 {
        return false;
    }
    for i in 0..alen {
        p.swap(a + i, a + alen + i);
    }
    for i in 0..2 {
        p.swap(l4 + i, l4 + 2 + i);
    }
    true
}

/// A UDP packet from `src`:`sport` to `dst` of `len` bytes (IP header included).
pub fn udp_packet(src: IpAddr, sport: u16, dst: NetAddr, len: usize) -> Vec<u8> {
    match (src, dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let len = len.max(28);
            let mut p = vec![0u8; len];
            p[0] = 0x45;
            p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            p[8] = 64;
            p[9] = 17;
            p[12..16].copy_from_slice(&s.octets());
            p[16..20].copy_from_slice(&d.octets());
            let c = checksum::checksum(&p[..20]);
            p[10..12].copy_from_slice(&c.to_be_bytes());
            udp_header(&mut p[20..], sport, dst.port(), checksum::pseudo_v4(s.octets(), d.octets(), 17, (len - 20) as u16));
            p
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let len = len.max(48);
            let mut p = vec![0u8; len];
            p[0] = 0x60;
            p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
            p[6] = 17;
            p[7] = 64;
            p[8..24].copy_from_slice(&s.octets());
            p[24..40].copy_from_slice(&d.octets());
            udp_header(&mut p[40..], sport, dst.port(), checksum::pseudo_v6(&s.octets(), &d.octets(), 17, (len - 40) as u32));
            p
        }
        _ => Vec::new(),
    }
}

fn udp_header(u: &mut [u8], sport: u16, dport: u16, pseudo: u64) {
    let len = u.len() as u16;
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&len.to_be_bytes());
    let c = checksum::finish(checksum::accumulate(pseudo, u));
    // 0 means "no checksum" in UDP: a computed 0 is sent as all ones.
    u[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
}

pub fn run(cmd: &PodMemifCmd) -> Result<Value, ToolError> {
    let common = match cmd {
        PodMemifCmd::Echo(c) | PodMemifCmd::Sink(c) => c,
        PodMemifCmd::Send(a) => &a.common,
    };
    if !(0.0..=3600.0).contains(&common.duration_s) {
        return Err(ToolError::Usage("--duration-s: 0 to 3600".into()));
    }
    let frames: Vec<Vec<u8>> = match cmd {
        PodMemifCmd::Send(a) => {
            if !(64..=1514).contains(&a.size) || a.flows == 0 || a.src.is_ipv4() != a.dst.is_ipv4() {
                return Err(ToolError::Usage("--size 64..=1514, --flows at least 1, --src and --dst of one family".into()));
            }
            (0..a.flows).map(|f| udp_packet(a.src, 10000u16.wrapping_add(f), a.dst, a.size - 14)).collect()
        }
        _ => Vec::new(),
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(common.duration_s);
    let (mut echoed, mut other, mut received, mut sent, mut connects) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // The active time: from the first packet to the last one received (sink) or sent.
    let (mut first_packet, mut last_packet): (Option<Instant>, Option<Instant>) = (None, None);
    let mut bufs: Vec<Buf> = Vec::with_capacity(256);
    let mut next = 0usize;
    'outer: while let Some(mut c) = connect(&common.socket, deadline)? {
        connects += 1;
        while Instant::now() < deadline {
            if c.queues[0].broken().is_some() {
                continue 'outer;
            }
            let idle_check = check_every(&mut next);
            if idle_check && broken(&c) {
                continue 'outer;
            }
            let q = &mut c.queues[0];
            match cmd {
                PodMemifCmd::Echo(_) => {
                    bufs.clear();
                    if q.recv(&mut bufs, 256) == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    // Each frame is one buffer (packets up to 2048 bytes); answer UDP, count
                    // the rest and give those buffers back.
                    let mut back = Vec::with_capacity(bufs.len());
                    let mut drop = Vec::new();
                    for &b in &bufs {
                        if !b.more && swap_udp(q.data_mut(b)) {
                            back.push(b);
                        } else {
                            drop.push(b);
                        }
                    }
                    received += bufs.len() as u64;
                    other += drop.len() as u64;
                    q.free(&mut drop);
                    let n = q.send(&mut back);
                    echoed += n as u64;
                    q.free(&mut back);
                }
                PodMemifCmd::Sink(_) => {
                    bufs.clear();
                    let n = q.recv(&mut bufs, 256);
                    if n == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let now = Instant::now();
                    first_packet.get_or_insert(now);
                    last_packet = Some(now);
                    received += bufs.iter().filter(|b| !b.more).count() as u64;
                    q.free(&mut bufs);
                }
                PodMemifCmd::Send(a) => {
                    // At most --pps: no more sent than the time since the start allows (the
                    // time in between is given to the other processes).
                    if a.pps > 0 {
                        let allowed = (start.elapsed().as_secs_f64() * a.pps as f64) as u64;
                        if sent >= allowed {
                            std::thread::sleep(Duration::from_micros(50));
                            continue;
                        }
                    }
                    // Frames already sent come back to the pool as the daemon takes them.
                    let mut burst = 0;
                    while burst < 32 && q.send_copy(&frames[(sent as usize) % frames.len()]) {
                        sent += 1;
                        burst += 1;
                    }
                    if burst == 0 {
                        std::hint::spin_loop();
                    } else {
                        let now = Instant::now();
                        first_packet.get_or_insert(now);
                        last_packet = Some(now);
                    }
                }
            }
        }
        c.disconnect("done");
        break;
    }
    let busy = match (first_packet, last_packet) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let rate = |n: u64| if busy > 0.0 { (n as f64 / busy).round() } else { 0.0 };
    Ok(match cmd {
        PodMemifCmd::Echo(_) => json!({"pod_memif": "echo", "received": received, "echoed": echoed, "other": other, "connects": connects}),
        PodMemifCmd::Sink(_) => json!({"pod_memif": "sink", "received": received, "pps": rate(received), "seconds": busy, "connects": connects}),
        PodMemifCmd::Send(_) => json!({"pod_memif": "send", "sent": sent, "pps": rate(sent), "seconds": busy, "connects": connects}),
    })
}

/// True once every 4096 calls: how often the loop asks whether the connection still stands
/// (a system call).
fn check_every(n: &mut usize) -> bool {
    *n += 1;
    (*n).is_multiple_of(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_built_and_swapped_with_valid_checksums() {
        for (src, dst) in [("10.244.1.5", "10.244.1.6:5000"), ("fd00:244:1::5", "[fd00:244:1::6]:5000")] {
            let src: IpAddr = src.parse().unwrap();
            let dst: NetAddr = dst.parse().unwrap();
            let mut p = udp_packet(src, 10001, dst, 50);
            let l4 = if src.is_ipv4() { 20 } else { 40 };
            assert!(p.len() >= l4 + 8);
            let sum = |p: &[u8]| {
                let pseudo = match src {
                    IpAddr::V4(_) => {
                        assert_eq!(checksum::checksum(&p[..20]), 0, "IPv4 header checksum");
                        checksum::pseudo_v4(p[12..16].try_into().unwrap(), p[16..20].try_into().unwrap(), 17, (p.len() - 20) as u16)
                    }
                    IpAddr::V6(_) => checksum::pseudo_v6(p[8..24].try_into().unwrap(), p[24..40].try_into().unwrap(), 17, (p.len() - 40) as u32),
                };
                checksum::finish(checksum::accumulate(pseudo, &p[l4..]))
            };
            assert_eq!(sum(&p), 0, "UDP checksum");
            assert!(swap_udp(&mut p));
            assert_eq!(sum(&p), 0, "still valid after the swap");
            assert_eq!(u16::from_be_bytes([p[l4], p[l4 + 1]]), 5000);
            assert_eq!(u16::from_be_bytes([p[l4 + 2], p[l4 + 3]]), 10001);
        }
        let mut tcp = udp_packet("10.0.0.1".parse().unwrap(), 1, "10.0.0.2:2".parse().unwrap(), 40);
        tcp[9] = 6;
        assert!(!swap_udp(&mut tcp));
        assert!(!swap_udp(&mut [0x45; 10]));
    }
}
