//! Session-sync capacity on one core: how many full-NAT sessions a second a node can send to
//! its peers (export from the table, encode in messages of 16 records, seal with AES-256-GCM)
//! and how many it can take in (expand the sender's key, open, decode, install in its table). The wire work only: the UDP
//! sockets' cost is the kernel's.

use crate::{median, topo, BenchError, Rng};
use serde::Serialize;
use std::time::Instant;
use vectorlb_lb::session::state;
use vectorlb_lb::sync::SyncRecord;
use vectorlb_lb::{Control, Mode, Timeouts, Worker, WorkerConfig};
use vectorlb_packet::proto;
use vectorlb_sync::{decode, encode, Message, Sealer, Secret, KIND_RECORDS, MAX_RECORDS};

#[derive(Debug, Clone)]
pub struct Options {
    pub v6: bool,
    /// Sessions per round.
    pub sessions: u32,
    pub rounds: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { v6: false, sessions: 200_000, rounds: 5 }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: &'static str,
    pub family: u8,
    /// Medians over rounds, sessions a second on one core.
    pub send_per_second: f64,
    pub receive_per_second: f64,
    pub send_rounds: Vec<f64>,
    pub receive_rounds: Vec<f64>,
    pub sessions: u32,
    /// Bytes on the wire per session (headers and MACs shared by 16).
    pub bytes_per_session: f64,
    pub errors: u64,
}

const KEY: &[u8] = b"bench-sync-key-0123456789";

pub fn run(o: &Options) -> Result<Report, BenchError> {
    let v6 = o.v6;
    let n = o.sessions.max(MAX_RECORDS as u32);
    let spec = topo::spec(Mode::Fnat, v6, proto::TCP, n as u64 * 2, Timeouts::default());
    let laddrs = spec.services[0].local_addrs.clone();
    let mut rng = Rng(0x5eed_5ec5);
    let records: Vec<SyncRecord> = (0..n as u64)
        .map(|i| {
            let (client, cport) = topo::client(v6, i);
            let l = laddrs[(i / topo::PORTS_PER_LADDR) as usize];
            SyncRecord {
                proto: proto::TCP,
                vip: topo::vip(v6),
                vport: 80,
                client,
                cport,
                backend: topo::backend(v6, (rng.next_u64() % topo::BACKENDS as u64) as u32),
                bport: 8080,
                local: Some((l, 1024 + (i % topo::PORTS_PER_LADDR) as u16)),
                state: state::ESTABLISHED,
                flags: 0,
                expire_in: 600_000,
                adj: Default::default(),
            }
        })
        .collect();
    let new_worker = || -> Result<Worker, BenchError> {
        let control = Control::new(&spec)?;
        let mut cfg = WorkerConfig::new(n * 2);
        cfg.table.index_entries = n * 4;
        Ok(Worker::new(control, cfg)?)
    };
    let (mut send, mut receive, mut errors, mut bytes) = (Vec::new(), Vec::new(), 0u64, 0usize);
    let secret = Secret::new(KEY);
    for round in 0..o.rounds.max(1) {
        // Receive: the messages a peer sent (built untimed), opened, decoded and installed.
        let peer = Sealer::new(&secret).map_err(|_| BenchError::Random)?;
        let wire: Vec<Vec<u8>> = records
            .chunks(MAX_RECORDS)
            .enumerate()
            .map(|(i, c)| {
                encode(
                    &Message { kind: KIND_RECORDS, epoch: 1 + round as u64, seq: i as u64 + 1, ack: 0, request: 0, time_ms: 0, records: c.iter().map(|r| (0u8, *r)).collect() },
                    &peer,
                )
            })
            .collect();
        bytes = wire.iter().map(Vec::len).sum();
        let mut w = new_worker()?;
        let t = Instant::now();
        for m in &wire {
            match decode(m, &secret) {
                Ok(msg) => {
                    for (_, r) in &msg.records {
                        errors += w.install(r, 1).is_err() as u64;
                    }
                }
                Err(_) => errors += MAX_RECORDS as u64,
            }
        }
        receive.push(n as f64 / t.elapsed().as_secs_f64());
        // Send: the same sessions exported from the table, encoded and sealed.
        let sealer = Sealer::new(&secret).map_err(|_| BenchError::Random)?;
        let t = Instant::now();
        let (mut out, mut start, mut sent, mut seq) = (Vec::with_capacity(MAX_RECORDS), Some(0usize), 0u64, 0u64);
        let mut len = 0usize;
        while let Some(s) = start {
            out.clear();
            start = w.export(v6, vectorlb_lb::sync::Export::All, s, MAX_RECORDS, 2, &mut out);
            if out.is_empty() {
                continue;
            }
            seq += 1;
            sent += out.len() as u64;
            len += encode(&Message { kind: KIND_RECORDS, epoch: 1, seq, ack: 0, request: 0, time_ms: 0, records: out.iter().map(|r| (0u8, *r)).collect() }, &sealer).len();
        }
        send.push(sent as f64 / t.elapsed().as_secs_f64());
        if sent != n as u64 {
            eprintln!("sync bench: exported {sent} of {n}");
            errors += 1;
        }
        std::hint::black_box(len);
    }
    Ok(Report {
        bench: "sync",
        family: if v6 { 6 } else { 4 },
        send_per_second: median(&send).round(),
        receive_per_second: median(&receive).round(),
        send_rounds: send.iter().map(|x| x.round()).collect(),
        receive_rounds: receive.iter().map(|x| x.round()).collect(),
        sessions: n,
        bytes_per_session: (bytes as f64 / n as f64 * 10.0).round() / 10.0,
        errors,
    })
}
