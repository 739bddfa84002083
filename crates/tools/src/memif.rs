//! memif benchmarks: a memif server that forwards (io mode: every frame received on queue *q*
//! goes back out of queue *q*) with vectorlb's memif queues over DPDK mbufs, and the benchmark
//! that runs it, or DPDK's `net_memif` in `dpdk-testpmd`, against the L3 forwarder example (a
//! zero-copy or copying memif client) on the other core, by frame size, engine and queue
//! pairs. One worker core per side, as in Intel's Calico VPP memif measurements.

use crate::ToolError;
use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_dpdk::{Eal, Mbuf, Mempool};
use vectorlb_io::copy::cycles;
use vectorlb_io::{Copier, RxQueue, TxQueue};
use vectorlb_memif::{InterfaceConfig, Server, ServerRx, ServerTx, SharedCopier, SocketAddr};

#[derive(Args, Debug, Clone)]
pub struct FwdArgs {
    /// The control socket to listen on (a path, or @name).
    #[arg(long)]
    pub socket: String,
    #[arg(long, default_value_t = 0)]
    pub id: u32,
    /// Queue pairs.
    #[arg(long, default_value_t = 1)]
    pub queues: u16,
    /// `cpu` or `dma`.
    #[arg(long, default_value = "cpu")]
    pub copy: String,
    /// The dmadev for `--copy dma` (dma_skeleton* is DPDK's software device).
    #[arg(long, default_value = "dma_skeleton0")]
    pub dma_device: String,
    /// Copies shorter than this stay on the CPU with `--copy dma`.
    #[arg(long, default_value_t = vectorlb_config::DEFAULT_DMA_THRESHOLD)]
    pub threshold: u32,
    /// The largest frame (sizes the packet buffers): 1518 or 9018, say.
    #[arg(long, default_value_t = 2048)]
    pub max_frame: usize,
    /// The CPU the forwarding loop runs on (its EAL core).
    #[arg(long, default_value_t = 1)]
    pub cpu: usize,
    /// Seconds to forward after the client connects.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Seconds before counting starts.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// Frames received per burst at most.
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Time the copies of one burst in 32 (the share of time spent copying; the clock reads
    /// cost a few cycles per frame of their own).
    #[arg(long)]
    pub time_copies: bool,
    /// Connects a zero-copy client in this thread and bounces `--inject` frames of `--size`
    /// bytes between it and the server on one core: no cross-core traffic, so the figure is
    /// the instruction cost of both sides (for comparing builds of the server queues).
    #[arg(long)]
    pub loopback: bool,
    #[arg(long, default_value_t = 256)]
    pub inject: usize,
    #[arg(long, default_value_t = 64)]
    pub size: usize,
}

/// What two back-to-back clock reads measure (the median of many): the cost that timing one
/// copy adds to it.
fn clock_pair_cycles() -> f64 {
    let mut v: Vec<u64> = (0..1001)
        .map(|_| {
            let t = cycles();
            cycles() - t
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// One burst in this many has its copies timed with `--time-copies`.
const SAMPLE: u64 = 32;

fn tsc_hz() -> f64 {
    let (t0, c0) = (Instant::now(), cycles());
    std::thread::sleep(Duration::from_millis(100));
    (cycles() - c0) as f64 / t0.elapsed().as_secs_f64()
}

/// The memif server's forwarding loop; prints one JSON line.
pub fn fwd(a: &FwdArgs) -> Result<Value, ToolError> {
    let fail = |what: &str, e: String| ToolError::Failed(format!("{what}: {e}"));
    let mut devs = Vec::new();
    let mut eal_args: Vec<String> = ["-l", &a.cpu.to_string(), "--in-memory", "--log-level", "*:warning"].iter().map(|s| s.to_string()).collect();
    if a.copy == "dma" {
        eal_args.push("--iova-mode=va".into());
        if a.dma_device.starts_with("dma_skeleton") {
            // The software device's copy thread on another CPU than ours.
            devs.push(format!("{},lcore={}", a.dma_device, if a.cpu == 0 { 1 } else { 0 }));
        }
    }
    let eal = Eal::init(&eal_args, &devs).map_err(|e| fail("EAL", e.to_string()))?;
    let room = (a.max_frame + 128).next_multiple_of(64).min(65535) as u16;
    let pool = Arc::new(Mempool::new(&eal, "memif_fwd", 16383, 256, room).map_err(|e| fail("mempool", e.to_string()))?);
    let copier = match a.copy.as_str() {
        "cpu" => Copier::cpu(),
        "dma" => {
            let e = vectorlb_dpdk::dma::DmaEngine::open(&eal, &a.dma_device, 1024).map_err(|e| fail("dmadev", e.to_string()))?;
            Copier::new(Box::new(e), a.threshold)
        }
        o => return Err(ToolError::Failed(format!("--copy: '{o}' is not cpu or dma"))),
    };
    let copier: SharedCopier = Arc::new(Mutex::new(copier));
    let addr = SocketAddr::parse(&a.socket).map_err(|e| fail("--socket", e))?;
    let (server, links) = Server::bind(&addr, 0o600, vec![InterfaceConfig { id: a.id, queues: a.queues, ..Default::default() }]).map_err(|e| fail("memif", e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let th = server.spawn(stop.clone()).map_err(|e| fail("memif thread", e.to_string()))?;
    let link = links[0].clone();
    let mut rx: Vec<ServerRx<Mbuf, Arc<Mempool>>> = (0..a.queues).map(|q| ServerRx::new(link.clone(), q, 0, pool.clone(), copier.clone(), a.max_frame)).collect();
    let mut tx: Vec<ServerTx<Mbuf>> = (0..a.queues).map(|q| ServerTx::new(link.clone(), q, copier.clone())).collect();
    let t = Instant::now();
    while !a.loopback && !link.is_up() {
        if t.elapsed() > Duration::from_secs(30) {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = th.join();
            return Err(ToolError::Failed("no memif client connected in 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut lo = if a.loopback {
        let cfg = vectorlb_memif::ClientConfig { id: a.id, name: "loopback".into(), queues: a.queues, log2_ring: 10, buffer_size: 2048, ..Default::default() };
        let mut c = vectorlb_memif::Client::connect(&addr, &cfg).map_err(|e| fail("loopback client", e.to_string()))?;
        let frame = vec![0x5au8; a.size.clamp(14, 9000)];
        for q in c.queues.iter_mut() {
            for _ in 0..a.inject.min(512) {
                if !q.send_copy(&frame) {
                    break;
                }
            }
        }
        Some((c, Vec::with_capacity(256)))
    } else {
        None
    };
    let t = Instant::now();
    while !link.is_up() {
        if t.elapsed() > Duration::from_secs(5) {
            return Err(ToolError::Failed("the memif link did not come up".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let hz = tsc_hz();
    let warm_until = Instant::now() + Duration::from_secs_f64(a.warmup_s);
    let mut counting = false;
    let (mut frames, mut bytes, mut dropped, mut bursts, mut empty) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut pkts: Vec<Mbuf> = Vec::with_capacity(64);
    let (mut c0, mut t0, mut sampled, mut copy_cycles, mut timed_copies, mut counted_bursts) = (cycles(), Instant::now(), 0u64, 0u64, 0u64, 0u64);
    let mut deadline = warm_until + Duration::from_secs_f64(a.seconds);
    loop {
        for q in 0..a.queues as usize {
            // One burst in SAMPLE is timed (reading the clock around every copy costs more
            // than a small copy).
            let sample = a.time_copies && counting && bursts.is_multiple_of(SAMPLE);
            let before = if sample {
                let mut c = copier.lock().unwrap_or_else(|e| e.into_inner());
                c.set_timing(true);
                (c.stats.cycles, c.stats.cpu)
            } else {
                (0, 0)
            };
            let n = rx[q].recv(&mut pkts, a.burst.clamp(1, 256));
            if n > 0 {
                let len: u64 = pkts.iter().map(|p| vectorlb_io::PacketBuf::data(p).len() as u64).sum();
                let sent = tx[q].send(&mut pkts);
                if counting {
                    frames += sent as u64;
                    bytes += len;
                    dropped += pkts.len() as u64;
                }
                pkts.clear();
            } else {
                if counting {
                    empty += 1;
                }
                tx[q].poll();
            }
            if let Some((c, held)) = lo.as_mut() {
                let cq = &mut c.queues[q];
                if held.is_empty() {
                    cq.recv(held, 256);
                }
                cq.send(held);
            }
            if sample {
                let mut c = copier.lock().unwrap_or_else(|e| e.into_inner());
                c.set_timing(false);
                copy_cycles += c.stats.cycles - before.0;
                timed_copies += c.stats.cpu - before.1;
                sampled += 1;
            }
            bursts += 1;
            if counting {
                counted_bursts += 1;
            }
        }
        if bursts.is_multiple_of(256) {
            let now = Instant::now();
            if !counting && now >= warm_until {
                counting = true;
                (c0, t0) = (cycles(), now);
                deadline = now + Duration::from_secs_f64(a.seconds);
            }
            if now >= deadline || !link.is_up() {
                break;
            }
        }
    }
    let total_cycles = cycles() - c0;
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = th.join();
    let st = link
        .queues
        .iter()
        .map(|q| q.snapshot())
        .fold((0, 0, 0, 0, 0), |acc, c| (acc.0 + c.copies_cpu, acc.1 + c.copies_dma, acc.2 + c.copies_cpu_fallback, acc.3 + c.bad_desc, acc.4 + c.no_buffer));
    // The timed bursts' copy time, less the clock reads' own cost (one pair per CPU copy),
    // scaled to all bursts.
    let copy_cycles = (copy_cycles as f64 - timed_copies as f64 * clock_pair_cycles()).max(0.0);
    let copy_share = if total_cycles > 0 && sampled > 0 { (copy_cycles * counted_bursts as f64 / sampled as f64 / total_cycles as f64).min(1.0) } else { 0.0 };
    Ok(json!({
        "frames": frames, "bytes": bytes, "dropped": dropped, "seconds": (secs * 1000.0).round() / 1000.0,
        "mpps": (frames as f64 / secs / 1e6 * 1000.0).round() / 1000.0,
        "cycles_per_frame": if frames > 0 { (total_cycles as f64 / frames as f64).round() } else { 0.0 },
        "copy_share": (copy_share * 1000.0).round() / 1000.0,
        "tsc_ghz": (hz / 1e9 * 100.0).round() / 100.0,
        "copies_cpu": st.0, "copies_dma": st.1, "copies_cpu_fallback": st.2, "bad_desc": st.3, "no_buffer": st.4,
        "copy": a.copy, "threshold": a.threshold, "queues": a.queues,
        "empty_polls": empty, "frames_per_burst": if bursts > empty { ((frames as f64 / (bursts - empty) as f64) * 10.0).round() / 10.0 } else { 0.0 },
    }))
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Seconds measured per point (after a one-second warm-up).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Frame sizes at MTU 1500.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "64,128,256,512,1024,1500")]
    pub sizes: Vec<usize>,
    /// Frame sizes at MTU 9000 (none: the flag alone).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "64,1500,4400,9000")]
    pub jumbo_sizes: Vec<usize>,
    /// Sizes for the CPU / DMA crossover (every copy on the CPU against every copy on DMA).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "64,256,512,1024,1500")]
    pub crossover_sizes: Vec<usize>,
    /// Only the smallest set: 64 and 1500 B, one queue pair (CI and quick checks).
    #[arg(long)]
    pub quick: bool,
    /// Only the head-to-head points: vectorlb's cpu engine and testpmd, zero-copy client, one
    /// queue pair, at `--sizes` (MTU 1500); for many rounds of the comparison.
    #[arg(long)]
    pub focus: bool,
    /// Rounds over every point (interleaved, so a noisy minute of a shared host falls on both
    /// peers alike); a summary line per point gives the median.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// The L3 forwarder example (default: beside this binary, examples/l3fwd).
    #[arg(long)]
    pub l3fwd: Option<PathBuf>,
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One measured point.
#[derive(Clone)]
struct Point {
    server: &'static str,
    copy: &'static str,
    threshold: u32,
    client: &'static str,
    queues: u16,
    mtu: u32,
    size: usize,
    /// Copies timed (`--time-copies`): the share of time spent copying, at a small cost of its
    /// own, so these points are apart from the throughput comparison.
    timed: bool,
}

fn l3fwd_path(a: &BenchArgs) -> PathBuf {
    a.l3fwd.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap_or_default();
        exe.parent().map(|d| d.join("examples/l3fwd")).unwrap_or_default()
    })
}

fn run_point(a: &BenchArgs, p: &Point, n: usize) -> Result<Value, ToolError> {
    let sock = format!("/tmp/vectorlb-bench-memif-{}-{n}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let total = a.seconds + 1.0;
    let bsize = 2048u32;
    let max_frame = if p.mtu > 1500 { 9018 } else { 1518 };
    // The server under test, on CPU 1.
    let mut server_out = None;
    let server = if p.server == "vectorlb" {
        let exe = std::env::current_exe().map_err(|e| ToolError::Failed(e.to_string()))?;
        let c = Command::new(exe)
            .args(["memif-fwd", "--socket", &sock, "--queues", &p.queues.to_string(), "--copy", p.copy, "--threshold", &p.threshold.to_string()])
            .args(["--max-frame", &max_frame.to_string(), "--cpu", "1", "--seconds", &a.seconds.to_string(), "--warmup-s", "1"])
            .args(p.timed.then_some("--time-copies"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ToolError::Failed(format!("memif-fwd: {e}")))?;
        Proc(c)
    } else {
        let vdev = format!("net_memif0,role=server,id=0,socket={sock},socket-abstract=no,bsize={bsize}");
        let mut c = Command::new("dpdk-testpmd");
        c.args(["-l", "0,1", "--main-lcore", "0", "--no-pci", "--in-memory", "--log-level", "*:error", "--vdev", &vdev, "--"]);
        c.args(["--forward-mode=io", "--nb-cores=1", "--stats-period=1", "--total-num-mbufs=16383", &format!("--rxq={}", p.queues), &format!("--txq={}", p.queues)]);
        // No --max-pkt-len: net_memif reports 1518 as its largest frame and refuses more, but
        // receives and sends chained frames of any length (in chained mbufs).
        Proc(c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| ToolError::Failed(format!("dpdk-testpmd: {e}")))?)
    };
    // Wait for the socket.
    let t = Instant::now();
    while !std::path::Path::new(&sock).exists() {
        if t.elapsed() > Duration::from_secs(20) {
            return Err(ToolError::Failed(format!("{}: no socket in 20 s", p.server)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if p.server == "testpmd" {
        // testpmd drains its queues when it starts forwarding: inject after that.
        std::thread::sleep(Duration::from_millis(1500));
    }
    // 512 frames in flight per queue pair, or as many as fill three quarters of a 1,024-slot
    // ring when frames are chains (DPDK 22.11's server, given more chained frames than its
    // ring holds, moves the ring's tail past the buffers the client posted).
    let inject = (768 / p.size.div_ceil(bsize as usize)).min(512);
    let mut client = Command::new(l3fwd_path(a));
    client.args(["--socket", &sock, "--queues", &p.queues.to_string(), "--inject", &inject.to_string(), "--size", &p.size.to_string()]);
    client.args(["--buffer-size", &bsize.to_string(), "--seconds", &format!("{}", total.ceil() as u64), "--warmup-s", "1"]);
    if p.client == "copy" {
        client.arg("--copy");
    }
    let out = Command::new("taskset")
        .args(["-c", "0"])
        .arg(client.get_program())
        .args(client.get_args())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| ToolError::Failed(format!("l3fwd: {e}")))?;
    let line = String::from_utf8_lossy(&out.stdout).lines().rev().find(|l| l.starts_with('{')).map(str::to_string);
    let cl: Value = line.as_deref().and_then(|l| serde_json::from_str(l).ok()).ok_or_else(|| ToolError::Failed(format!("l3fwd printed no result ({})", out.status)))?;
    let mut server = server;
    if p.server == "vectorlb" {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if server.0.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut s = String::new();
        if let Some(mut o) = server.0.stdout.take() {
            use std::io::Read;
            let _ = o.read_to_string(&mut s);
        }
        server_out = s.lines().rev().find(|l| l.starts_with('{')).and_then(|l| serde_json::from_str::<Value>(l).ok());
    }
    drop(server);
    let _ = std::fs::remove_file(&sock);
    let frames = cl["frames"].as_f64().unwrap_or(0.0);
    let secs = cl["seconds"].as_f64().unwrap_or(1.0).max(1e-9);
    let pps = frames / secs;
    let mut v = json!({
        "bench": "memif", "server": p.server, "copy": p.copy, "client": p.client, "queues": p.queues, "mtu": p.mtu,
        "frame_bytes": p.size, "mpps": (pps / 1e6 * 1000.0).round() / 1000.0,
        "gbps": (pps * p.size as f64 * 8.0 / 1e9 * 100.0).round() / 100.0,
        "gbps_l1": (pps * (p.size + 20) as f64 * 8.0 / 1e9 * 100.0).round() / 100.0,
        "seconds": (secs * 100.0).round() / 100.0,
    });
    if p.copy == "dma" {
        v["threshold"] = json!(p.threshold);
    }
    if p.timed {
        v["timed"] = json!(true);
    }
    if let Some(s) = server_out {
        for k in ["cycles_per_frame", "copy_share", "copies_cpu", "copies_dma", "copies_cpu_fallback", "dropped", "bad_desc"] {
            v[k] = s[k].clone();
        }
    }
    Ok(v)
}

/// Runs every point; prints each as it is measured.
pub fn bench(a: &BenchArgs) -> Result<(), ToolError> {
    if !std::path::Path::new(&l3fwd_path(a)).exists() {
        return Err(ToolError::Failed(format!("{} is missing: cargo build --release --examples", l3fwd_path(a).display())));
    }
    let mut points = Vec::new();
    let (sizes, jumbo, cross): (Vec<usize>, Vec<usize>, Vec<usize>) =
        if a.quick { (vec![64, 1500], vec![], vec![]) } else { (a.sizes.clone(), a.jumbo_sizes.clone(), a.crossover_sizes.clone()) };
    let t = vectorlb_config::DEFAULT_DMA_THRESHOLD;
    if a.focus {
        for &size in &sizes {
            for server in ["vectorlb", "testpmd"] {
                points.push(Point { server, copy: "cpu", threshold: t, client: "zero-copy", queues: 1, mtu: 1500, size, timed: false });
            }
        }
    }
    for &size in sizes.iter().filter(|_| !a.focus) {
        for (server, copy) in [("vectorlb", "cpu"), ("vectorlb", "dma"), ("testpmd", "cpu")] {
            points.push(Point { server, copy, threshold: t, client: "zero-copy", queues: 1, mtu: 1500, size, timed: false });
        }
    }
    for &size in jumbo.iter().filter(|_| !a.focus) {
        for (server, copy) in [("vectorlb", "cpu"), ("vectorlb", "dma"), ("testpmd", "cpu")] {
            points.push(Point { server, copy, threshold: t, client: "zero-copy", queues: 1, mtu: 9000, size, timed: false });
        }
    }
    for &size in sizes.iter().filter(|s| !a.focus && [64, 1500].contains(*s)) {
        points.push(Point { server: "vectorlb", copy: "cpu", threshold: t, client: "copy", queues: 1, mtu: 1500, size, timed: false });
        points.push(Point { server: "testpmd", copy: "cpu", threshold: t, client: "copy", queues: 1, mtu: 1500, size, timed: false });
        if !a.quick {
            points.push(Point { server: "vectorlb", copy: "cpu", threshold: t, client: "zero-copy", queues: 2, mtu: 1500, size, timed: false });
            points.push(Point { server: "testpmd", copy: "cpu", threshold: t, client: "zero-copy", queues: 2, mtu: 1500, size, timed: false });
        }
    }
    // The crossover: every copy on DMA (threshold 0) against the CPU engine, per size.
    for &size in cross.iter().filter(|_| !a.focus) {
        points.push(Point { server: "vectorlb", copy: "dma", threshold: 0, client: "zero-copy", queues: 1, mtu: 1500, size, timed: false });
    }
    // Where the time goes (seed 001's Table 6): copies timed, per engine.
    let timed: Vec<(u32, usize)> = if a.focus {
        vec![]
    } else if a.quick {
        vec![(1500, 1500)]
    } else {
        vec![(1500, 64), (1500, 1500), (9000, 4400), (9000, 9000)]
    };
    for (mtu, size) in timed {
        for copy in ["cpu", "dma"] {
            points.push(Point { server: "vectorlb", copy, threshold: t, client: "zero-copy", queues: 1, mtu, size, timed: true });
        }
    }
    let reps = a.reps.clamp(1, 100);
    let mut results: Vec<Vec<Value>> = vec![Vec::new(); points.len()];
    for rep in 0..reps {
        for (n, p) in points.iter().enumerate() {
            let mut v = run_point(a, p, n).unwrap_or_else(|e| {
                json!({"bench": "memif", "server": p.server, "copy": p.copy, "client": p.client, "queues": p.queues, "mtu": p.mtu, "frame_bytes": p.size, "error": e.to_string()})
            });
            v["rep"] = json!(rep);
            println!("{}", if a.json { v.to_string() } else { serde_json::to_string_pretty(&v).unwrap_or_default() });
            results[n].push(v);
        }
    }
    for line in summarize(&points, &results) {
        println!("{}", if a.json { line.to_string() } else { serde_json::to_string_pretty(&line).unwrap_or_default() });
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One line per point with the median over its rounds, then one per (client, queues, MTU,
/// size) comparing vectorlb's cpu and dma engines with testpmd.
fn summarize(points: &[Point], results: &[Vec<Value>]) -> Vec<Value> {
    let med = |n: usize, k: &str| median(results[n].iter().filter_map(|v| v[k].as_f64()).collect());
    let mut out = Vec::new();
    for (n, p) in points.iter().enumerate() {
        let mut v = json!({
            "bench": "memif_median", "server": p.server, "copy": p.copy, "client": p.client, "queues": p.queues, "mtu": p.mtu,
            "frame_bytes": p.size, "runs": results[n].iter().filter(|v| v["mpps"].is_number()).count(),
        });
        if p.copy == "dma" {
            v["threshold"] = json!(p.threshold);
        }
        if p.timed {
            v["timed"] = json!(true);
        }
        for k in ["mpps", "gbps", "cycles_per_frame", "copy_share"] {
            if let Some(m) = med(n, k) {
                v[k] = json!(r3(m));
            }
        }
        out.push(v);
    }
    let find = |q: &Point, server: &str, copy: &str, threshold: u32| {
        points.iter().position(|p| {
            !p.timed
                && p.server == server
                && p.copy == copy
                && (copy == "cpu" || p.threshold == threshold)
                && p.client == q.client
                && p.queues == q.queues
                && p.mtu == q.mtu
                && p.size == q.size
        })
    };
    let t = vectorlb_config::DEFAULT_DMA_THRESHOLD;
    for (n, p) in points.iter().enumerate() {
        if p.server != "testpmd" || p.timed {
            continue;
        }
        let Some(ours) = find(p, "vectorlb", "cpu", t) else { continue };
        let (Some(tp), Some(vl)) = (med(n, "mpps"), med(ours, "mpps")) else { continue };
        let mut v = json!({
            "bench": "memif_vs_testpmd", "client": p.client, "queues": p.queues, "mtu": p.mtu, "frame_bytes": p.size,
            "vectorlb_cpu_mpps": r3(vl), "testpmd_mpps": r3(tp), "cpu_vs_testpmd": r3(vl / tp.max(1e-9)),
        });
        if let Some(d) = find(p, "vectorlb", "dma", t).and_then(|d| med(d, "mpps")) {
            v["vectorlb_dma_mpps"] = json!(r3(d));
            v["dma_vs_cpu"] = json!(r3(d / vl.max(1e-9)));
        }
        out.push(v);
    }
    // The crossover: per size, every copy on DMA (threshold 0) against the CPU engine.
    for (n, p) in points.iter().enumerate() {
        if !(p.copy == "dma" && p.threshold == 0) || p.timed {
            continue;
        }
        let Some(cpu) = find(p, "vectorlb", "cpu", 0).and_then(|c| med(c, "mpps")) else { continue };
        let Some(dma) = med(n, "mpps") else { continue };
        out.push(json!({"bench": "memif_crossover", "frame_bytes": p.size, "cpu_mpps": r3(cpu), "dma_all_mpps": r3(dma), "dma_vs_cpu": r3(dma / cpu.max(1e-9))}));
    }
    // Time per frame copying against the rest.
    for (n, p) in points.iter().enumerate() {
        if !p.timed {
            continue;
        }
        let (Some(share), Some(cpf)) = (med(n, "copy_share"), med(n, "cycles_per_frame")) else { continue };
        out.push(json!({
            "bench": "memif_copy_time", "copy": p.copy, "mtu": p.mtu, "frame_bytes": p.size, "cycles_per_frame": cpf.round(),
            "copy_cycles_per_frame": (share * cpf).round(), "other_cycles_per_frame": ((1.0 - share) * cpf).round(), "copy_share": r3(share),
        }));
    }
    out
}
