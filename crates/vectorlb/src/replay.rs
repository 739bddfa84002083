//! `vectorlb replay`: runs the packets of a pcap through the pipeline and writes what would
//! leave each port, plus a summary of verdicts.
//!
//! Packets are processed in arrival order, in batches of consecutive packets that share a
//! millisecond timestamp (up to the configured batch size), so the worker clock follows the
//! capture and session timeouts behave as they would have live.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use vectorlb_config::Config;
use vectorlb_lb::{Control, DropReason, HeapBuf, PacketBuf, Verdict, Worker};
use vectorlb_pcap::{Reader, Writer};

#[derive(Debug, Serialize)]
pub struct Summary {
    pub packets: u64,
    /// Packets sent, per egress port name.
    pub tx: BTreeMap<String, u64>,
    pub kernel: u64,
    pub dropped: u64,
    pub drop_reasons: BTreeMap<&'static str, u64>,
    pub sessions_created: u64,
    pub sessions_live: u32,
    /// Packets sent to each backend ("service -> backend").
    pub backends: BTreeMap<String, u64>,
    pub icmp_echo_replies: u64,
    pub icmp_errors_sent: u64,
    pub icmp_errors_translated: u64,
    pub outputs: Vec<PathBuf>,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Config(#[from] vectorlb_config::Error),
    #[error("{path}: {source}")]
    Model { path: PathBuf, source: vectorlb_lb::ConfigError },
    #[error("cannot allocate sessions: {0}")]
    Table(std::io::Error),
    #[error("{path}: {source}")]
    File { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Pcap { path: PathBuf, source: vectorlb_pcap::Error },
}

fn sock(a: std::net::IpAddr, p: u16) -> String {
    match a {
        std::net::IpAddr::V4(x) => format!("{x}:{p}"),
        std::net::IpAddr::V6(x) => format!("[{x}]:{p}"),
    }
}

pub fn run(config: &Path, input: &Path, out_dir: &Path) -> Result<Summary, ReplayError> {
    let file_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReplayError::File { path, source }
    };
    let pcap_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReplayError::Pcap { path, source }
    };
    let cfg = Config::load(config)?;
    cfg.check_memory()?;
    let control = Control::new(&cfg.spec).map_err(|source| ReplayError::Model { path: config.to_path_buf(), source })?;
    let mut worker = Worker::new(control, cfg.worker_config(0, 1)).map_err(ReplayError::Table)?;
    let file = File::open(input).map_err(file_err(input))?;
    let mut reader = Reader::new(BufReader::new(file)).map_err(pcap_err(input))?;
    std::fs::create_dir_all(out_dir).map_err(file_err(out_dir))?;

    let open = |name: &str| -> Result<(PathBuf, Writer<BufWriter<File>>), ReplayError> {
        let p = out_dir.join(format!("{name}.pcap"));
        let f = File::create(&p).map_err(file_err(&p))?;
        Ok((p.clone(), Writer::new(BufWriter::new(f)).map_err(file_err(&p))?))
    };
    let mut ports = Vec::new();
    for p in &cfg.spec.ports {
        ports.push(open(&p.name)?);
    }
    let (kernel_path, mut kernel) = open("kernel")?;

    let batch = cfg.engine.batch;
    let mut pending: Vec<(u64, Vec<u8>)> = Vec::with_capacity(batch);
    let mut first_ts = None;
    let mut tx_counts = vec![0u64; ports.len()];
    let mut packets = 0u64;
    let mut kernel_count = 0u64;

    let mut flush = |pending: &mut Vec<(u64, Vec<u8>)>,
                     worker: &mut Worker,
                     ports: &mut Vec<(PathBuf, Writer<BufWriter<File>>)>,
                     kernel: &mut Writer<BufWriter<File>>,
                     now: u32|
     -> Result<(), ReplayError> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut bufs: Vec<HeapBuf> = pending.iter().map(|(_, d)| HeapBuf::from_frame(d)).collect();
        let mut verdicts = vec![Verdict::Kernel; bufs.len()];
        worker.process(&mut bufs, &mut verdicts, now);
        for ((b, v), (ts, _)) in bufs.iter().zip(&verdicts).zip(pending.iter()) {
            match v {
                Verdict::Tx(p) => {
                    let (path, w) = &mut ports[*p as usize];
                    w.write(*ts, b.data()).map_err(file_err(path))?;
                    tx_counts[*p as usize] += 1;
                }
                Verdict::Kernel => {
                    kernel.write(*ts, b.data()).map_err(file_err(&kernel_path))?;
                    kernel_count += 1;
                }
                Verdict::Drop(_) | Verdict::Handoff(_) => {}
            }
        }
        pending.clear();
        Ok(())
    };

    let mut batch_ms = None;
    loop {
        let rec = reader.next_record().map_err(pcap_err(input))?;
        let Some(rec) = rec else { break };
        packets += 1;
        let t0 = *first_ts.get_or_insert(rec.ts_ns);
        // Worker clock: milliseconds since the first packet, starting at 1.
        let ms = (rec.ts_ns.saturating_sub(t0) / 1_000_000) as u32 + 1;
        if batch_ms != Some(ms) || pending.len() == batch {
            if let Some(prev) = batch_ms {
                flush(&mut pending, &mut worker, &mut ports, &mut kernel, prev)?;
            }
            batch_ms = Some(ms);
        }
        pending.push((rec.ts_ns, rec.data));
    }
    if let Some(prev) = batch_ms {
        flush(&mut pending, &mut worker, &mut ports, &mut kernel, prev)?;
    }
    let mut outputs = Vec::new();
    for (p, mut w) in ports {
        w.flush().map_err(file_err(&p))?;
        outputs.push(p);
    }
    kernel.flush().map_err(file_err(&kernel_path))?;
    outputs.push(kernel_path);

    let c = &worker.flows.counters;
    let snap = worker.snapshot().clone();
    let mut backends = BTreeMap::new();
    for b in snap.backends() {
        let n = c.backends.get(vectorlb_lb::service::backend_slot(b.id) as usize).map_or(0, |x| x.packets);
        let svc = snap.service(b.svc).map(|s| sock(s.spec.vip, s.spec.port)).unwrap_or_default();
        backends.insert(format!("{svc} -> {}", sock(b.addr, b.port)), n);
    }
    Ok(Summary {
        backends,
        packets,
        tx: cfg.spec.ports.iter().zip(&tx_counts).map(|(p, n)| (p.name.clone(), *n)).collect(),
        kernel: kernel_count,
        dropped: c.total_drops(),
        drop_reasons: DropReason::ALL.iter().filter(|r| c.dropped(**r) > 0).map(|r| (r.name(), c.dropped(*r))).collect(),
        sessions_created: c.events.sessions_created,
        sessions_live: worker.flows.table.len(),
        icmp_echo_replies: c.events.icmp_echo_replies,
        icmp_errors_sent: c.events.icmp_errors_sent,
        icmp_errors_translated: c.events.icmp_errors_translated,
        outputs,
    })
}
