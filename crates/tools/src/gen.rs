//! `vectorlb-tools gen` and `rfc2544`: a traffic generator on DPDK ports, in the spirit of TRex's stateless
//! mode. UDP or TCP packets over N flows (source ports), of a given size, at a target rate;
//! each carries a sequence number and a timestamp. It receives on the return port and reports
//! sent, received, lost, reordered and latency percentiles (an HDR histogram).

use crate::ToolError;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectorlb_dpdk::{Eal, EthPort, EthRx, EthTx, Mbuf, Mempool};
use vectorlb_io::{Packet, PacketBuf, RxQueue, TxQueue};
use vectorlb_packet::tcp::flags;
use vectorlb_packet::{checksum, proto};

/// The payload starts with a 2-byte marker. UDP: then the sequence number and the send time
/// (ns), 18 bytes in all, what a 64-byte frame holds. TCP (whose 64-byte frame leaves 6 bytes
/// of payload): the sequence number rides in the segment's sequence field and the low 32 bits
/// of the send time in its acknowledgement field (latencies up to 4.29 s). The flow is the
/// source port; the first packet of each flow in a trial carries SYN, the others ACK.
pub const MAGIC: u16 = 0x5647; // "VG"
const UDP_PAYLOAD: usize = 2 + 8 + 8;
const TCP_PAYLOAD: usize = 2;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

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
    #[arg(long, value_enum, default_value = "udp")]
    pub proto: Proto,
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
    /// Stop after this many packets (0: no limit; `--seconds` still bounds the run).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// A SYN flood: every packet a TCP SYN from a pseudo-random address of `--flood-src` and a
    /// pseudo-random port, with a pseudo-random sequence number (as `hping3 -S --rand-source`,
    /// at the port's rate). Implies `--proto tcp`; `--flows` and `--src-ip` are not used.
    #[arg(long)]
    pub syn_flood: bool,
    /// An ACK flood: as --syn-flood, but every segment a bare ACK (what stateless continuation
    /// must bound: a segment without a session).
    #[arg(long, conflicts_with = "syn_flood")]
    pub ack_flood: bool,
    /// The flood's source prefix (default: the benchmarking range of RFC 2544).
    #[arg(long, default_value = "198.18.0.0/15", value_parser = parse_prefix)]
    pub flood_src: (Ipv4Addr, u8),
    /// Packets per transmit burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    pub burst: u16,
    /// EAL arguments.
    #[arg(long, default_value = "-l 0 --in-memory --log-level *:error")]
    pub eal: String,
    #[arg(long)]
    pub json: bool,
}

/// `A.B.C.D/N` with N from 8 to 32 (host bits cleared).
pub fn parse_prefix(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, n) = s.split_once('/').ok_or_else(|| format!("'{s}' is not ADDRESS/LENGTH"))?;
    let a: Ipv4Addr = a.parse().map_err(|_| format!("'{a}' is not an IPv4 address"))?;
    let n: u8 = n.parse().map_err(|_| format!("'{n}' is not a prefix length"))?;
    if !(8..=32).contains(&n) {
        return Err(format!("prefix length {n} is out of range 8..=32"));
    }
    let mask = u32::MAX.checked_shl(32 - n as u32).unwrap_or(0);
    Ok((Ipv4Addr::from(u32::from(a) & mask), n))
}

impl GenArgs {
    /// TCP segments (asked for, or a flood), else UDP datagrams.
    pub fn is_tcp(&self) -> bool {
        self.proto == Proto::Tcp || self.flood()
    }

    /// A SYN or ACK flood from spoofed sources.
    pub fn flood(&self) -> bool {
        self.syn_flood || self.ack_flood
    }
}

/// Writes the frame for `flow` / `seq` into `f` (already sized; bytes past the marker zero).
pub fn build(f: &mut [u8], a: &GenArgs, src_mac: [u8; 6], dst_mac: [u8; 6], flow: u16, seq: u64, ts_ns: u64) {
    let n = f.len();
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let tcp = a.is_tcp();
    // A flood's SYN carries no data (the frame's tail is Ethernet padding), as a scanner's.
    let ip_len = if a.flood() { 40 } else { (n - 14) as u16 };
    let ip_proto = if tcp { proto::TCP } else { proto::UDP };
    // The flood's source, port and ISN are a function of the sequence number: runs repeat.
    let r = vectorlb_bench::Rng(seq.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).next_u64();
    let src_ip = if a.flood() {
        let (base, n) = a.flood_src;
        let host = u32::MAX.checked_shr(n as u32).unwrap_or(0);
        Ipv4Addr::from(u32::from(base) | (r as u32 & host))
    } else {
        a.src_ip
    };
    let ip = &mut f[14..34];
    ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, ip_proto, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[12..16].copy_from_slice(&src_ip.octets());
    ip[16..20].copy_from_slice(&a.dst_ip.octets());
    let c = checksum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let sport = if a.flood() { (1024 + ((r >> 32) % 64512) as u16).to_be_bytes() } else { (1024 + flow).to_be_bytes() };
    match if tcp { Proto::Tcp } else { Proto::Udp } {
        Proto::Udp => {
            let u = &mut f[34..42];
            u[0..2].copy_from_slice(&sport);
            u[2..4].copy_from_slice(&a.dst_port.to_be_bytes());
            u[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
            u[6..8].fill(0); // no UDP checksum (allowed for IPv4)
            let p = &mut f[42..];
            p[0..2].copy_from_slice(&MAGIC.to_be_bytes());
            p[2..10].copy_from_slice(&seq.to_be_bytes());
            p[10..18].copy_from_slice(&ts_ns.to_be_bytes());
        }
        Proto::Tcp => {
            let syn = a.syn_flood || (!a.ack_flood && seq < a.flows as u64);
            let t = &mut f[34..56];
            t[0..2].copy_from_slice(&sport);
            t[2..4].copy_from_slice(&a.dst_port.to_be_bytes());
            let isn = if a.flood() { (r >> 16) as u32 } else { seq as u32 };
            t[4..8].copy_from_slice(&isn.to_be_bytes());
            t[8..12].copy_from_slice(&(ts_ns as u32).to_be_bytes());
            t[12] = 5 << 4;
            t[13] = if syn { flags::SYN } else { flags::ACK };
            t[14..16].copy_from_slice(&65535u16.to_be_bytes());
            t[16..20].fill(0);
            let t = if a.flood() {
                // No payload and no marker: the tail of the frame is zero padding.
                t[20..22].fill(0);
                &mut t[..20]
            } else {
                t[20..22].copy_from_slice(&MAGIC.to_be_bytes());
                t
            };
            // The rest of the payload is zero and adds nothing to the sum.
            let acc = checksum::pseudo_v4(src_ip.octets(), a.dst_ip.octets(), proto::TCP, ip_len - 20);
            let c = checksum::finish(checksum::accumulate(acc, t));
            t[16..18].copy_from_slice(&c.to_be_bytes());
        }
    }
}

/// (flow, sequence number, latency in ns) of a received frame, wherever its payload starts.
pub fn parse(f: &[u8], now_ns: u64) -> Option<(u16, u64, u64)> {
    let info = vectorlb_packet::parse_frame(f).ok()?;
    let (sport, seq, ts, p) = match info.proto {
        proto::UDP => {
            let p = f.get(info.l4 + 8..)?;
            if p.len() < UDP_PAYLOAD {
                return None;
            }
            let seq = u64::from_be_bytes(p[2..10].try_into().ok()?);
            let ts = u64::from_be_bytes(p[10..18].try_into().ok()?);
            (f.get(info.l4..info.l4 + 2)?, seq, now_ns.saturating_sub(ts), p)
        }
        proto::TCP => {
            let t = f.get(info.l4..info.l4 + 20)?;
            let p = f.get(info.l4 + (t[12] >> 4) as usize * 4..)?;
            let seq = u32::from_be_bytes(t[4..8].try_into().ok()?) as u64;
            let ts = u32::from_be_bytes(t[8..12].try_into().ok()?);
            (&t[0..2], seq, (now_ns as u32).wrapping_sub(ts) as u64, p)
        }
        _ => return None,
    };
    if p.len() < 2 || u16::from_be_bytes([p[0], p[1]]) != MAGIC {
        return None;
    }
    // The device under test may rewrite the source port (full NAT): the flow is then not ours
    // and reordering is judged over all packets.
    Some((u16::from_be_bytes([sport[0], sport[1]]).wrapping_sub(1024), seq, ts))
}

/// The generator's ports, opened once for any number of trials.
pub struct Gen {
    pool: Mempool,
    tx: EthTx,
    rx: EthRx,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
}

/// One trial's counts.
#[derive(Debug, Clone)]
pub struct Trial {
    pub size: usize,
    pub rate: u64,
    pub seconds: f64,
    pub sent: u64,
    pub received: u64,
    pub reordered: u64,
    pub foreign: u64,
    pub latency_ns: Histogram<u64>,
}

impl Trial {
    pub fn loss_ratio(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.sent.saturating_sub(self.received) as f64 / self.sent as f64
        }
    }

    pub fn json(&self, flows: u16) -> serde_json::Value {
        let h = &self.latency_ns;
        let us = |v: u64| v as f64 / 1000.0;
        json!({
            "bench": "gen", "size": self.size, "flows": flows, "rate_pps": self.rate, "seconds": self.seconds,
            "sent": self.sent, "received": self.received, "lost": self.sent.saturating_sub(self.received), "reordered": self.reordered,
            "not_ours": self.foreign,
            "tx_mpps": self.sent as f64 / self.seconds / 1e6, "rx_mpps": self.received as f64 / self.seconds / 1e6,
            "loss_ratio": self.loss_ratio(),
            "latency_us": {
                "min": us(h.min()), "mean": h.mean() / 1000.0, "p50": us(h.value_at_percentile(50.0)), "p90": us(h.value_at_percentile(90.0)),
                "p99": us(h.value_at_percentile(99.0)), "p99_9": us(h.value_at_percentile(99.9)), "p99_99": us(h.value_at_percentile(99.99)), "max": us(h.max()),
            },
        })
    }
}

impl Gen {
    pub fn open(a: &GenArgs, max_size: usize) -> Result<Gen, ToolError> {
        let dst_mac = vectorlb_config::parse_mac(&a.dst_mac).ok_or_else(|| ToolError::Usage(format!("--dst-mac: '{}' is not a MAC address", a.dst_mac)))?;
        let mut devs = vec![a.tx.clone()];
        if let Some(r) = &a.rx {
            if r != &a.tx {
                devs.push(r.clone());
            }
        }
        let eal_args: Vec<String> = a.eal.split_whitespace().map(str::to_string).collect();
        let eal = Eal::init(&eal_args, &devs)?;
        // Jumbo frames: room for a whole 16 KB driver frame (af_packet's framesz), fewer mbufs.
        let (room, n) = if max_size > 2048 - 128 { (16384 + 128, 4095) } else { (2048 + 128, 16383) };
        let pool = Mempool::new(&eal, "vlbgen", n, 256, room)?;
        let mut queues = Vec::new();
        for d in &devs {
            let p = Arc::new(EthPort::find(&eal, d)?);
            p.setup(1, 2048, &pool, 0)?;
            p.start()?;
            queues.push(p.queues()?.remove(0));
        }
        let (first_rx, tx) = queues.remove(0);
        let rx = queues.pop().map(|(rx, _)| rx).unwrap_or(first_rx);
        let src_mac = tx.port().mac()?;
        Ok(Gen { pool, tx, rx, src_mac, dst_mac })
    }

    /// Sends `size`-byte frames (without FCS) at `rate` pps (0: as fast as the port takes)
    /// for `seconds`, receiving until 300 ms after the last.
    pub fn trial(&mut self, a: &GenArgs, size: usize, rate: u64, seconds: f64) -> Trial {
        let pool = &self.pool;
        let mut template = vec![0u8; size];
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(seconds);
        let mut seq = 0u64;
        let mut flow = 0u16;
        let hist = Histogram::new(3).expect("3 significant digits is a valid precision");
        let mut t = Trial { size, rate, seconds, sent: 0, received: 0, reordered: 0, foreign: 0, latency_ns: hist };
        let mut top = 0u64;
        let mut any = false;
        let mut burst: Vec<Mbuf> = Vec::with_capacity(a.burst as usize);
        let mut rxb: Vec<Mbuf> = Vec::with_capacity(64);
        let mut drain_until = None;
        let mut skipped = 0u64;
        // A flood is not a measurement of the rate: it catches up on up to 10 ms (a descheduled
        // generator on shared cores) rather than skip.
        let late_cap = if a.flood() { rate / 100 } else { rate / 5000 }.max(a.burst as u64);
        loop {
            let now = Instant::now();
            let done = a.count > 0 && t.sent >= a.count;
            if (now >= end || done) && drain_until.is_none() {
                // Rates are over the time spent sending.
                t.seconds = now.duration_since(start).as_secs_f64().max(1e-9);
                drain_until = Some(now + Duration::from_millis(300));
            }
            if drain_until.is_some_and(|d| now >= d) {
                break;
            }
            if drain_until.is_none() {
                let due = if rate == 0 { u64::MAX } else { (start.elapsed().as_secs_f64() * rate as f64) as u64 - skipped };
                // A generator that fell behind (descheduled, or a full transmit ring) does not
                // catch up with a burst at line rate, which would test the ring depth rather
                // than the rate: packets more than 200 µs late are skipped (the trial then
                // sends fewer; `sent` and `tx_mpps` say how many).
                let due = if rate > 0 && due > t.sent + late_cap {
                    skipped += due - t.sent - late_cap;
                    t.sent + late_cap
                } else {
                    due
                };
                let due = if a.count > 0 { due.min(a.count) } else { due };
                let n = due.saturating_sub(t.sent).min(a.burst as u64) as usize;
                let ts = start.elapsed().as_nanos() as u64;
                for _ in 0..n {
                    let Some(mut m) = pool.alloc() else { break };
                    build(&mut template, a, self.src_mac, self.dst_mac, flow, seq + burst.len() as u64, ts);
                    if !m.load(&template) {
                        break;
                    }
                    burst.push(m);
                    flow = (flow + 1) % a.flows;
                }
                if !burst.is_empty() {
                    let k = self.tx.send(&mut burst);
                    t.sent += k as u64;
                    seq += k as u64;
                    Mbuf::free_all(&mut burst);
                }
            }
            // Receive until the ring is empty (a few bursts at most), so that a long transmit
            // burst does not leave the receive ring to overflow.
            for _ in 0..8 {
                let n = self.rx.recv(&mut rxb, 64);
                if n == 0 {
                    break;
                }
                let now_ns = start.elapsed().as_nanos() as u64;
                for m in &rxb {
                    match parse(m.data(), now_ns) {
                        Some((_, s, lat)) => {
                            t.received += 1;
                            if any && s < top {
                                t.reordered += 1;
                            } else {
                                top = s;
                                any = true;
                            }
                            t.latency_ns.saturating_record(lat);
                        }
                        None => t.foreign += 1,
                    }
                }
                Mbuf::free_all(&mut rxb);
                if n < 64 {
                    break;
                }
            }
            // Ahead of a slow rate: sleep until the next burst is nearly due instead of
            // spinning (a test's flood at 50,000 a second otherwise takes a whole core from
            // the routers and load balancers it shares two cores with). At rates where a
            // burst is due within 200 µs this never sleeps.
            if rate > 0 && drain_until.is_none() {
                let next = (t.sent + skipped + a.burst as u64) as f64 / rate as f64;
                let wait = next - start.elapsed().as_secs_f64();
                if wait > 200e-6 {
                    std::thread::sleep(Duration::from_secs_f64(wait - 100e-6));
                }
            }
        }
        t
    }
}

fn check(a: &GenArgs, size: usize) -> Result<(), ToolError> {
    let min = if a.is_tcp() { 54 + TCP_PAYLOAD } else { 42 + UDP_PAYLOAD };
    if !(60..=9000).contains(&size) || size < min {
        return Err(ToolError::Usage(format!("frame size: {} is out of range 64..=9004 on the wire", size + 4)));
    }
    if a.flows == 0 {
        return Err(ToolError::Usage("--flows: at least 1".into()));
    }
    Ok(())
}

pub fn run(a: &GenArgs) -> Result<serde_json::Value, ToolError> {
    check(a, a.size)?;
    if !(a.seconds > 0.0 && a.seconds <= 86_400.0) {
        return Err(ToolError::Usage(format!("--seconds: {} is out of range (0, 86400]", a.seconds)));
    }
    let mut g = Gen::open(a, a.size)?;
    Ok(g.trial(a, a.size, a.rate, a.seconds).json(a.flows))
}

#[derive(Args, Debug, Clone)]
pub struct Rfc2544Args {
    #[command(flatten)]
    pub gen: GenArgs,
    /// Frame sizes on the wire (with FCS).
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024,1280,1518")]
    pub sizes: Vec<usize>,
    /// Seconds per trial.
    #[arg(long, default_value_t = 2.0)]
    pub trial_seconds: f64,
    /// Stop the search when the bounds are this close, as a fraction of the offered rate.
    #[arg(long, default_value_t = 0.02)]
    pub resolution: f64,
    /// Loss ratio allowed for PDR (0.00001 = 0.001 %).
    #[arg(long, default_value_t = 0.00001)]
    pub pdr_loss: f64,
    /// Whole searches per frame size; the report gives each and their medians.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Trials again at a rate whose trial lost too much, up to this many times; the rate passes
    /// if any of them passes. 0 is RFC 2544's single trial; 1 or 2 keep a host's scheduling
    /// stalls (loss at any rate, now and then) from dragging a search down, while a rate above
    /// the device's capacity still fails every time.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=5))]
    pub retries: u8,
}

struct Search<'a> {
    g: &'a mut Gen,
    a: &'a Rfc2544Args,
    size: usize,
    trials: Vec<serde_json::Value>,
    /// The highest received rate seen in any trial (pps).
    best_rx: f64,
}

impl Search<'_> {
    fn trial(&mut self, rate: u64) -> Trial {
        let t = self.g.trial(&self.a.gen, self.size, rate, self.a.trial_seconds);
        self.best_rx = self.best_rx.max(t.received as f64 / t.seconds);
        let offered = if rate == 0 { "full".to_string() } else { format!("{:.3}", rate as f64 / 1e6) };
        eprintln!(
            "  rfc2544 {} B: trial {:>2}, offered {offered} Mpps, received {:.3} Mpps, loss {:.2e}",
            self.size + 4,
            self.trials.len() + 1,
            t.received as f64 / t.seconds / 1e6,
            t.loss_ratio()
        );
        t
    }

    /// Whether `rate` loses at most `allowed`, in one trial or, failing that, one of
    /// `--retries` more; every trial is recorded.
    fn passes(&mut self, rate: u64, allowed: f64, confirm: bool) -> bool {
        for attempt in 0..=self.a.retries {
            let t = self.trial(rate);
            let ok = t.loss_ratio() <= allowed;
            self.trials.push(json!({
                "size": self.size + 4, "rate_pps": rate, "allowed": allowed, "loss_ratio": t.loss_ratio(),
                "pass": ok, "confirm": confirm, "attempt": attempt,
            }));
            if ok {
                return true;
            }
        }
        false
    }

    /// The highest rate (pps) whose loss ratio is at most `allowed`: a binary search between
    /// `floor` (a rate known to pass) and `top`, then the result confirmed by a second trial; a rate that fails its confirmation
    /// is lowered by one step and tried again (up to three times). Returns (rate, confirmed).
    fn rate(&mut self, floor: u64, top: u64, allowed: f64) -> (u64, bool) {
        let (mut lo, mut hi) = (floor.min(top), top);
        let step = ((top as f64) * self.a.resolution).max(1000.0) as u64;
        while hi - lo > step {
            let mid = (lo + hi) / 2;
            if self.passes(mid, allowed, false) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for _ in 0..3 {
            if lo == 0 {
                return (0, false);
            }
            if self.passes(lo, allowed, true) {
                return (lo, true);
            }
            lo = lo.saturating_sub(step);
        }
        (lo, false)
    }
}

/// RFC 2544 throughput per frame size: MAX (the highest received rate of any trial, full offered
/// load included), NDR (no loss) and PDR (loss at most `--pdr-loss`), each the median of
/// `--repeat` searches, and the latency at NDR; one JSON object per size.
pub fn rfc2544(a: &Rfc2544Args) -> Result<Vec<serde_json::Value>, ToolError> {
    let sizes: Vec<usize> = a.sizes.iter().map(|s| s.saturating_sub(4)).collect();
    for &s in &sizes {
        check(&a.gen, s)?;
    }
    if !(a.trial_seconds > 0.0 && a.trial_seconds <= 600.0) {
        return Err(ToolError::Usage(format!("--trial-seconds: {} is out of range (0, 600]", a.trial_seconds)));
    }
    if !(a.resolution > 0.0 && a.resolution < 1.0) {
        return Err(ToolError::Usage(format!("--resolution: {} is out of range (0, 1)", a.resolution)));
    }
    if a.repeat == 0 {
        return Err(ToolError::Usage("--repeat: at least 1".into()));
    }
    let mut g = Gen::open(&a.gen, sizes.iter().copied().max().unwrap_or(60))?;
    let mut out = Vec::new();
    let med = |v: &[f64]| vectorlb_bench::median(v);
    for &size in &sizes {
        let mut s = Search { g: &mut g, a, size, trials: Vec::new(), best_rx: 0.0 };
        let (mut offered, mut maxs, mut ndrs, mut pdrs, mut confirmed) = (vec![], vec![], vec![], vec![], true);
        for _ in 0..a.repeat {
            let full = s.trial(0);
            let top = (full.sent as f64 / a.trial_seconds) as u64;
            offered.push(top as f64);
            let (ndr, c1) = s.rate(0, top, 0.0);
            // PDR allows more loss than NDR: its search starts at NDR.
            let (pdr, c2) = s.rate(ndr, top, a.pdr_loss);
            confirmed &= c1 && c2;
            ndrs.push(ndr as f64);
            pdrs.push(pdr.max(ndr) as f64);
            maxs.push(s.best_rx);
            s.best_rx = 0.0;
        }
        let (ndr, max) = (med(&ndrs), med(&maxs));
        let trials = std::mem::take(&mut s.trials);
        let at_ndr = g.trial(&a.gen, size, (ndr as u64).max(1), a.trial_seconds);
        let mpps = |v: &[f64]| v.iter().map(|x| x / 1e6).collect::<Vec<_>>();
        out.push(json!({
            "bench": "rfc2544", "frame_bytes": size + 4, "proto": format!("{:?}", a.gen.proto).to_lowercase(),
            "flows": a.gen.flows, "trial_seconds": a.trial_seconds, "resolution": a.resolution, "repeat": a.repeat, "retries": a.retries,
            "offered_mpps": med(&offered) / 1e6, "max_mpps": max / 1e6,
            "ndr_mpps": ndr / 1e6, "pdr_mpps": med(&pdrs) / 1e6, "pdr_loss": a.pdr_loss, "confirmed": confirmed,
            "max_gbps": max * (size + 4 + 20) as f64 * 8.0 / 1e9,
            "ndr_gbps": ndr * (size + 4 + 20) as f64 * 8.0 / 1e9,
            "max_mpps_each": mpps(&maxs), "ndr_mpps_each": mpps(&ndrs), "pdr_mpps_each": mpps(&pdrs),
            "ndr_latency_us": at_ndr.json(a.gen.flows)["latency_us"].clone(),
            "trials": trials,
        }));
    }
    Ok(out)
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
        for proto in ["udp", "tcp"] {
            let a = T::parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01", "--proto", proto, "--flows", "8"]).g;
            for size in [60, 64, 1500, 9000] {
                let mut f = vec![0u8; size];
                build(&mut f, &a, [2; 6], [4; 6], 7, 123_456_789, 42);
                assert_eq!(parse(&f, 142), Some((7, 123_456_789, 100)), "{proto} size {size}");
                let info = vectorlb_packet::parse_frame(&f).unwrap();
                assert_eq!((info.proto, info.end), (if proto == "tcp" { 6 } else { 17 }, size));
                assert_eq!(checksum::checksum(&f[14..34]), 0);
                if proto == "tcp" {
                    let acc = checksum::pseudo_v4(a.src_ip.octets(), a.dst_ip.octets(), 6, (size - 34) as u16);
                    assert_eq!(checksum::finish(checksum::accumulate(acc, &f[34..])), 0, "TCP checksum, size {size}");
                    assert_eq!(f[47], 0x10, "ACK after the first packet of each flow");
                    build(&mut f, &a, [2; 6], [4; 6], 7, 3, (1 << 32) - 5);
                    assert_eq!(f[47], 0x02, "SYN first");
                    // The send time wraps at 32 bits: latency across the wrap.
                    assert_eq!(parse(&f, (1 << 32) - 5 + 1000).map(|p| p.2), Some(1000));
                }
            }
            let mut f = vec![0u8; 60];
            build(&mut f, &a, [2; 6], [4; 6], 1, 1, 1);
            f[if proto == "tcp" { 54 } else { 42 }] ^= 0xff;
            assert_eq!(parse(&f, 1), None, "not our marker");
        }
    }

    #[test]
    fn a_syn_flood_is_syns_from_many_sources_inside_the_prefix_with_valid_checksums() {
        let a = T::parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01", "--syn-flood", "--flood-src", "198.18.7.9/16", "--dst-port", "80"]).g;
        assert_eq!(a.flood_src, (Ipv4Addr::new(198, 18, 0, 0), 16));
        let mut sources = std::collections::HashSet::new();
        let mut ports = std::collections::HashSet::new();
        let mut f = vec![0u8; 60];
        for seq in 0..4096u64 {
            build(&mut f, &a, [2; 6], [4; 6], 0, seq, seq * 1000);
            let src = [f[26], f[27], f[28], f[29]];
            assert_eq!(&src[..2], &[198, 18], "inside the prefix");
            assert_eq!(f[23], 6, "TCP");
            assert_eq!(f[47], 0x02, "SYN only, every packet");
            assert_eq!(u16::from_be_bytes([f[36], f[37]]), 80);
            assert_eq!(checksum::checksum(&f[14..34]), 0);
            assert_eq!(u16::from_be_bytes([f[16], f[17]]), 40, "no payload");
            let acc = checksum::pseudo_v4(src, a.dst_ip.octets(), 6, 20);
            assert_eq!(checksum::finish(checksum::accumulate(acc, &f[34..54])), 0);
            assert!(f[54..].iter().all(|b| *b == 0), "padding");
            sources.insert(src);
            ports.insert(u16::from_be_bytes([f[34], f[35]]));
        }
        // 4,096 draws from 65,536 addresses: almost all distinct.
        assert!(sources.len() > 3900 && ports.len() > 3900, "{} sources, {} ports", sources.len(), ports.len());
        for bad in ["198.18.0.0", "198.18.0.0/7", "198.18.0.0/33", "x/16", "1.2.3.4/y"] {
            assert!(parse_prefix(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_prefix("10.1.2.3/32"), Ok((Ipv4Addr::new(10, 1, 2, 3), 32)));
        // The ACK flood: the same segments with ACK alone.
        let a = T::parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01", "--ack-flood", "--dst-port", "80"]).g;
        for seq in 0..64u64 {
            build(&mut f, &a, [2; 6], [4; 6], 0, seq, seq * 1000);
            assert_eq!(f[47], 0x10, "ACK only, every packet");
            let src = [f[26], f[27], f[28], f[29]];
            let acc = checksum::pseudo_v4(src, a.dst_ip.octets(), 6, 20);
            assert_eq!(checksum::finish(checksum::accumulate(acc, &f[34..54])), 0);
        }
        assert!(T::try_parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01", "--ack-flood", "--syn-flood"]).is_err());
    }

    #[test]
    fn parse_never_panics_on_mutated_or_cut_frames() {
        let mut rng = vectorlb_bench::Rng(0x0bad_5eed_1234_5678);
        for proto in ["udp", "tcp"] {
            let a = T::parse_from(["t", "--tx", "x", "--dst-mac", "02:00:00:00:00:01", "--proto", proto]).g;
            let mut f = vec![0u8; 80];
            build(&mut f, &a, [2; 6], [4; 6], 3, 99, 7);
            for _ in 0..20_000 {
                let mut g = f.clone();
                for _ in 0..=rng.below(6) {
                    let at = rng.below(g.len() as u64) as usize;
                    g[at] = rng.next_u64() as u8;
                }
                g.truncate(rng.below(g.len() as u64 + 1) as usize);
                let _ = parse(&g, rng.next_u64());
            }
        }
    }
}
