//! `vectorlb bench gen`: a traffic generator on DPDK ports, in the spirit of TRex's stateless
//! mode. UDP packets over N flows (source ports), of a given size, at a target rate; each
//! carries a sequence number and a timestamp. It receives on the return port and reports
//! sent, received, lost, reordered and latency percentiles.

use clap::Args;
use serde_json::json;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use vectorlb_dpdk::{free_bulk, Eal, Mbuf, Mempool, Port};
use vectorlb_lb::PacketBuf;

/// The payload: a 2-byte marker, the sequence number, the send time (ns): 18 bytes, what a
/// 64-byte frame holds. The flow is the UDP source port.
pub const MAGIC: u16 = 0x5647; // "VG"
const PAYLOAD_MIN: usize = 2 + 8 + 8;

#[derive(Args, Debug, Clone)]
pub struct GenArgs {
    /// Device to send on (a DPDK device string: net_af_xdp0,iface=g0).
    #[arg(long)]
    pub tx: String,
    /// Device to receive on (default: the sending one).
    #[arg(long)]
    pub rx: Option<String>,
    /// Destination MAC (the device under test's port).
    #[arg(long)]
    pub dst_mac: String,
    #[arg(long, default_value = "10.0.0.2")]
    pub src_ip: Ipv4Addr,
    #[arg(long, default_value = "10.0.0.100")]
    pub dst_ip: Ipv4Addr,
    #[arg(long, default_value_t = 9)]
    pub dst_port: u16,
    /// Flows (distinct source ports from 1024).
    #[arg(long, default_value_t = 1024)]
    pub flows: u16,
    /// Frame size without the FCS (60 = a 64-byte frame on the wire), up to 9000.
    #[arg(long, default_value_t = 60)]
    pub size: usize,
    /// Packets per second (0: as fast as the port takes them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// EAL arguments.
    #[arg(long, default_value = "-l 0 --in-memory --log-level *:error")]
    pub eal: String,
    #[arg(long)]
    pub json: bool,
}

/// Writes the frame for `flow` / `seq` into `f` (already sized).
pub fn build(f: &mut [u8], a: &GenArgs, src_mac: [u8; 6], dst_mac: [u8; 6], flow: u16, seq: u64, ts_ns: u64) {
    let n = f.len();
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (n - 14) as u16;
    let ip = &mut f[14..34];
    ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[12..16].copy_from_slice(&a.src_ip.octets());
    ip[16..20].copy_from_slice(&a.dst_ip.octets());
    let c = vectorlb_packet::checksum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp_len = ip_len - 20;
    let u = &mut f[34..42];
    u[0..2].copy_from_slice(&(1024 + flow).to_be_bytes());
    u[2..4].copy_from_slice(&a.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6..8].fill(0); // no UDP checksum (allowed for IPv4)
    let p = &mut f[42..];
    p[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    p[2..10].copy_from_slice(&seq.to_be_bytes());
    p[10..18].copy_from_slice(&ts_ns.to_be_bytes());
}

/// (flow, seq, send time) of a received frame, wherever its UDP payload starts.
pub fn parse(f: &[u8]) -> Option<(u16, u64, u64)> {
    let info = vectorlb_packet::parse_frame(f).ok()?;
    if info.proto != 17 {
        return None;
    }
    let u = f.get(info.l4..info.l4 + 8)?;
    let p = f.get(info.l4 + 8..)?;
    if p.len() < PAYLOAD_MIN || u16::from_be_bytes([p[0], p[1]]) != MAGIC {
        return None;
    }
    // The device under test may rewrite the source port (full NAT): then the flow is unknown
    // and reordering is judged over all packets (flow 0).
    let sport = u16::from_be_bytes([u[0], u[1]]);
    let flow = sport.wrapping_sub(1024);
    Some((flow, u64::from_be_bytes(p[2..10].try_into().ok()?), u64::from_be_bytes(p[10..18].try_into().ok()?)))
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((p / 100.0) * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)] as f64 / 1000.0
}

pub fn run(a: &GenArgs) -> Result<serde_json::Value, String> {
    if !(60..=9000).contains(&a.size) || a.size < 42 + PAYLOAD_MIN {
        return Err(format!("--size: {} is out of range 64..=9000", a.size));
    }
    if a.flows == 0 {
        return Err("--flows: at least 1".into());
    }
    let dst_mac = vectorlb_config::parse_mac(&a.dst_mac).ok_or_else(|| format!("--dst-mac: '{}' is not a MAC address", a.dst_mac))?;
    let mut devs = vec![a.tx.clone()];
    if let Some(r) = &a.rx {
        if r != &a.tx {
            devs.push(r.clone());
        }
    }
    let eal_args: Vec<String> = a.eal.split_whitespace().map(str::to_string).collect();
    let eal = Eal::init(&eal_args, &devs).map_err(|e| e.to_string())?;
    let room = (a.size + 128).max(2048 + 128) as u16;
    let pool = Mempool::new(&eal, "vlbgen", 16383, 256, room).map_err(|e| e.to_string())?;
    let tx = Port::find(&eal, &devs[0]).map_err(|e| e.to_string())?;
    let rx = if devs.len() > 1 { Port::find(&eal, &devs[1]).map_err(|e| e.to_string())? } else { tx };
    for p in if devs.len() > 1 { vec![tx, rx] } else { vec![tx] } {
        p.setup(1, 1024, &pool, 0).map_err(|e| e.to_string())?;
        p.start().map_err(|e| e.to_string())?;
    }
    let src_mac = tx.mac().map_err(|e| e.to_string())?;
    let mut template = vec![0u8; a.size];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.seconds);
    let mut seq = 0u64;
    let mut flow = 0u16;
    let (mut sent, mut received, mut reordered, mut foreign) = (0u64, 0u64, 0u64, 0u64);
    let mut last: Vec<u64> = vec![0; a.flows as usize];
    let mut seen: Vec<bool> = vec![false; a.flows as usize];
    let mut lat: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
    let mut rxb: Vec<Option<Mbuf>> = (0..64).map(|_| None).collect();
    let mut drain_until = None;
    loop {
        let now = Instant::now();
        if now >= end && drain_until.is_none() {
            drain_until = Some(now + Duration::from_millis(300));
        }
        if drain_until.is_some_and(|d| now >= d) {
            break;
        }
        // Send: as many as the rate allows now (up to a burst).
        if drain_until.is_none() {
            let due = if a.rate == 0 { u64::MAX } else { (start.elapsed().as_secs_f64() * a.rate as f64) as u64 };
            let n = due.saturating_sub(sent).min(32) as usize;
            let ts = start.elapsed().as_nanos() as u64;
            for _ in 0..n {
                let Some(mut m) = pool.alloc() else { break };
                build(&mut template, a, src_mac, dst_mac, flow, seq, ts);
                if !m.load(&template) {
                    free_bulk(std::slice::from_mut(&mut m));
                    break;
                }
                burst.push(m);
                seq += 1;
                flow = (flow + 1) % a.flows;
            }
            if !burst.is_empty() {
                let k = tx.tx(0, &mut burst);
                sent += k as u64;
                if k < burst.len() {
                    // Not taken: give back the sequence numbers with the buffers.
                    seq -= (burst.len() - k) as u64;
                    flow = ((flow as u64 + a.flows as u64 * 64 - (burst.len() - k) as u64) % a.flows as u64) as u16;
                    free_bulk(&mut burst[k..]);
                }
                burst.clear();
            }
        }
        // Receive.
        let n = rx.rx(0, &mut rxb);
        if n > 0 {
            let t = start.elapsed().as_nanos() as u64;
            let mut got: Vec<Mbuf> = rxb[..n].iter_mut().map(|m| m.take().unwrap()).collect();
            for m in &got {
                match parse(m.data()) {
                    Some((f, s, ts)) => {
                        received += 1;
                        let fi = if (f as usize) < last.len() { f as usize } else { 0 };
                        if seen[fi] && s < last[fi] {
                            reordered += 1;
                        } else {
                            last[fi] = s;
                            seen[fi] = true;
                        }
                        if lat.len() < lat.capacity() {
                            lat.push(t.saturating_sub(ts));
                        }
                    }
                    _ => foreign += 1,
                }
            }
            free_bulk(&mut got);
        }
    }
    let secs = a.seconds;
    lat.sort_unstable();
    for p in if devs.len() > 1 { vec![tx, rx] } else { vec![tx] } {
        p.stop();
    }
    drop(eal);
    Ok(json!({
        "bench": "gen", "size": a.size, "flows": a.flows, "rate_pps": a.rate, "seconds": secs,
        "sent": sent, "received": received, "lost": sent.saturating_sub(received), "reordered": reordered,
        "not_ours": foreign,
        "tx_mpps": sent as f64 / secs / 1e6, "rx_mpps": received as f64 / secs / 1e6,
        "loss_ratio": if sent == 0 { 0.0 } else { sent.saturating_sub(received) as f64 / sent as f64 },
        "latency_us": { "p50": pct(&lat, 50.0), "p90": pct(&lat, 90.0), "p99": pct(&lat, 99.0), "p99_9": pct(&lat, 99.9), "max": pct(&lat, 100.0) },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        g: GenArgs,
    }

    #[test]
    fn frames_carry_flow_sequence_and_time() {
        let a = T::parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01"]).g;
        for size in [60, 64, 1500, 9000] {
            let mut f = vec![0u8; size];
            build(&mut f, &a, [2; 6], [4; 6], 7, 123_456_789, 42);
            assert_eq!(parse(&f), Some((7, 123_456_789, 42)), "size {size}");
            let info = vectorlb_packet::parse_frame(&f).unwrap();
            assert_eq!((info.proto, info.end), (17, size));
            assert_eq!(vectorlb_packet::checksum::checksum(&f[14..34]), 0);
        }
        let mut f = vec![0u8; 60];
        build(&mut f, &a, [2; 6], [4; 6], 1, 1, 1);
        f[42] ^= 0xff;
        assert_eq!(parse(&f), None, "not our marker");
    }
}
