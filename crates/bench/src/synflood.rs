//! A SYN flood through the pipeline: spoofed SYNs (random sources in 198.18.0.0/15 or
//! 2001:db8:f::/48, random ports and sequence numbers, a Linux SYN's options) at a TCP service,
//! with the SYN proxy on (each answered with a cookie, nothing stored) or off (each opens a
//! session within the half-open budget). With `ack`, the same flood of bare ACKs at a service
//! with stateless continuation (maglev): each opens a continued session within the
//! continuation budget, the cost of a packet that finds no session on a cluster node. Every
//! verdict is checked: a SYN the proxy does not answer, or a segment the LB does not forward,
//! counts as an error.

use crate::pipeline::{round3, sock};
use crate::{median, topo, BenchError, Rng};
use serde::Serialize;
use std::time::{Duration, Instant};
use vectorlb_lb::{Control, HeapBuf, Mode, SynProxy, Timeouts, Verdict, Worker, WorkerConfig};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::{ACK, SYN};

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub v6: bool,
    pub synproxy: bool,
    pub seconds: f64,
    pub rounds: usize,
    pub batch: usize,
    /// Sessions the table holds (the budget is its default share).
    pub sessions: u32,
    /// Bare ACKs at a continuation service instead of SYNs.
    pub ack: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { mode: Mode::Fnat, v6: false, synproxy: true, seconds: 5.0, rounds: 5, batch: 256, sessions: 1 << 20, ack: false }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: &'static str,
    pub mode: &'static str,
    pub family: u8,
    pub synproxy: &'static str,
    /// Median over rounds, pipeline time only: SYN cookies sent (proxy on) or SYNs forwarded.
    pub syns_per_second: f64,
    pub rounds: Vec<f64>,
    pub ns_per_syn: f64,
    pub syns: u64,
    pub syncookies_sent: u64,
    pub sessions_left: u32,
    pub half_open: u32,
    pub half_open_evicted: u64,
    /// With `ack`: continued sessions opened, and ended to stay within the budget.
    pub continued: u64,
    pub continued_evicted: u64,
    pub errors: u64,
}

/// Distinct frames drawn from (they differ in source address, port and sequence number).
const FRAMES: usize = 1 << 16;

pub fn run(o: &Options) -> Result<Report, BenchError> {
    if o.ack && !matches!(o.mode, Mode::Nat | Mode::Dr | Mode::Tun) {
        return Err(BenchError::Option("an ACK flood measures continuation: nat, dr or tun".into()));
    }
    if !o.ack && !matches!(o.mode, Mode::Nat | Mode::Fnat) {
        return Err(BenchError::Option("synflood measures nat or fnat (the modes the SYN proxy serves)".into()));
    }
    let v6 = o.v6;
    let batch = o.batch.clamp(1, 1024);
    // ACKs: a table no larger than the frames replayed, so that its continuation budget (a
    // tenth) has evicted a frame's session before the frame comes round again: every segment
    // finds no session, as a flood's do.
    let sessions = if o.ack { o.sessions.min(FRAMES as u32) } else { o.sessions };
    let mut spec = topo::spec(o.mode, v6, proto::TCP, sessions as u64, Timeouts::default());
    spec.services[0].synproxy = if o.synproxy && !o.ack { SynProxy::On } else { SynProxy::Off };
    if o.ack {
        spec.services[0].scheduler = vectorlb_sched::Algorithm::parse("maglev").ok_or_else(|| BenchError::Option("maglev".into()))?;
        spec.services[0].continuation = true;
    }
    let control = Control::new(&spec)?;
    let mut cfg = WorkerConfig::new(sessions.max(1024));
    cfg.batch = batch;
    let mut w = Worker::new(control, cfg)?;
    let mut rng = Rng(0x5eed_f100d);
    let vip = sock(topo::vip(v6), 80);
    // A Linux SYN's options: MSS 1460, SACK permitted, timestamp, window scale 7.
    let opts = [2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7];
    let frames: Vec<Vec<u8>> = (0..FRAMES)
        .map(|_| {
            let r = rng.next_u64();
            let src = if v6 {
                format!("[2001:db8:f::{:x}:{:x}]:{}", (r >> 16) as u16, r as u16, 1024 + (r >> 40) as u16 % 64000)
            } else {
                let a = 0xc612_0000u32 | (r as u32 & 0x1_ffff);
                format!("{}:{}", std::net::Ipv4Addr::from(a), 1024 + (r >> 40) as u16 % 64000)
            };
            if o.ack {
                Builder::tcp(&src, &vip, ACK).seq((r >> 17) as u32).macs(topo::ROUTER_MAC, topo::EXT_MAC).build()
            } else {
                Builder::tcp(&src, &vip, SYN).seq((r >> 17) as u32).tcp_options(&opts).macs(topo::ROUTER_MAC, topo::EXT_MAC).build()
            }
        })
        .collect();
    let want = if o.synproxy && !o.ack { Verdict::Tx(0) } else { Verdict::Tx(1) };
    let mut bufs: Vec<HeapBuf> = (0..batch).map(|_| HeapBuf::new(128, 256)).collect();
    let mut verdicts = vec![Verdict::Kernel; batch];
    let rounds = o.rounds.max(1);
    let per_round = Duration::from_secs_f64((o.seconds / rounds as f64).max(0.05));
    let (mut now, mut next, mut errors, mut syns) = (1u32, 0usize, 0u64, 0u64);
    let mut rates = Vec::new();
    let mut pipe_total = Duration::ZERO;
    for _ in 0..rounds {
        let start = Instant::now();
        let (mut pipe, mut n) = (Duration::ZERO, 0u64);
        loop {
            for b in bufs.iter_mut() {
                b.load(&frames[next]);
                next = (next + 1) % FRAMES;
            }
            let t = Instant::now();
            crate::timed_process(&mut w, &mut bufs, &mut verdicts, now);
            pipe += t.elapsed();
            now = now.wrapping_add(1);
            errors += verdicts.iter().filter(|v| **v != want).count() as u64;
            n += batch as u64;
            if n.is_multiple_of(64 * batch as u64) && start.elapsed() >= per_round {
                break;
            }
        }
        syns += n;
        pipe_total += pipe;
        rates.push(n as f64 / pipe.as_secs_f64());
    }
    Ok(Report {
        bench: if o.ack { "ackflood" } else { "synflood" },
        mode: o.mode.name(),
        family: if v6 { 6 } else { 4 },
        synproxy: if o.synproxy && !o.ack { "on" } else { "off" },
        syns_per_second: median(&rates).round(),
        rounds: rates.iter().map(|x| x.round()).collect(),
        ns_per_syn: round3(pipe_total.as_secs_f64() * 1e9 / syns as f64),
        syns,
        syncookies_sent: w.flows.counters.events.syncookies_sent,
        sessions_left: w.flows.table.len(),
        half_open: w.flows.table.half_open(),
        half_open_evicted: w.flows.counters.events.half_open_evicted,
        continued: w.flows.counters.events.continued,
        continued_evicted: w.flows.counters.events.continued_evicted,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syn_is_answered_or_forwarded_and_the_proxy_stores_nothing() {
        for v6 in [false, true] {
            let on = run(&Options { v6, seconds: 0.1, rounds: 2, sessions: 4096, ..Default::default() }).unwrap();
            assert_eq!(on.errors, 0, "{on:?}");
            assert_eq!((on.syncookies_sent, on.sessions_left), (on.syns, 0), "{on:?}");
            let off = run(&Options { v6, synproxy: false, seconds: 0.1, rounds: 2, sessions: 4096, ..Default::default() }).unwrap();
            assert_eq!(off.errors, 0, "{off:?}");
            assert_eq!(off.half_open, 1024, "the budget: a quarter of 4096: {off:?}");
            assert!(off.half_open_evicted > 0 && off.syncookies_sent == 0, "{off:?}");
            // ACKs: each forwarded, each a continued session, the table within the budget.
            for mode in [Mode::Dr, Mode::Nat] {
                let ack = run(&Options { v6, mode, ack: true, seconds: 0.1, rounds: 2, sessions: 4096, ..Default::default() }).unwrap();
                assert_eq!(ack.errors, 0, "{ack:?}");
                assert_eq!(ack.continued, ack.syns, "{ack:?}");
                assert!(ack.sessions_left <= 410 && ack.continued_evicted >= ack.syns - 410, "the budget: a tenth of 4096: {ack:?}");
            }
        }
    }
}
