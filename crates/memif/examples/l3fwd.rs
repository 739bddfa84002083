//! An L3 forwarder behind a memif interface (the role VPP's L3FWD plays in Intel's Calico VPP
//! memif measurements): every frame received goes back out of the queue it came in on with its
//! Ethernet and IPv4 addresses swapped. It busy-polls every queue pair, and by default works
//! on the shared buffers themselves (zero-copy: a received buffer is rewritten and sent as is);
//! `--copy` copies each frame out and back in instead.
//!
//!   l3fwd --socket /run/vectorlb/memif.sock --seconds 10
//!
//! At the end it prints one JSON line: frames forwarded, seconds, and the client's counters.

use clap::Parser;
use std::time::{Duration, Instant};
use vectorlb_memif::{Buf, Client, ClientConfig, SocketAddr};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    socket: String,
    #[arg(long, default_value_t = 0)]
    id: u32,
    #[arg(long)]
    secret: Option<String>,
    /// Queue pairs.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// log2 of the slots per ring.
    #[arg(long, default_value_t = 10)]
    log2_ring: u8,
    /// Bytes per shared buffer (larger frames are chained).
    #[arg(long, default_value_t = 2048)]
    buffer_size: u32,
    /// Copy each frame out of the shared memory and back (instead of forwarding the buffer).
    #[arg(long)]
    copy: bool,
    /// Run this long, then print the counts and exit.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Count only after this many seconds (the rings fill, caches warm).
    #[arg(long, default_value_t = 0.0)]
    warmup_s: f64,
    /// Send this many frames per queue at the start (a benchmark's traffic, which then
    /// circulates between the forwarder and the server).
    #[arg(long, default_value_t = 0)]
    inject: usize,
    /// Size of the injected frames, bytes (Ethernet header included, no FCS).
    #[arg(long, default_value_t = 64)]
    size: usize,
}

/// An Ethernet + IPv4 + UDP frame of `size` bytes.
fn frame(size: usize, n: usize) -> Vec<u8> {
    let size = size.max(42);
    let mut f = vec![0u8; size];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (size - 14) as u16;
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 1, (n % 250) as u8 + 1]);
    let mut sum: u32 = f[14..34].chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f[34..36].copy_from_slice(&(1024 + (n % 1000) as u16).to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f
}

/// Swaps the Ethernet addresses, and the IPv4 ones when the frame is IPv4 (the header
/// checksum is unchanged by a swap).
fn swap(f: &mut [u8]) {
    if f.len() < 14 {
        return;
    }
    for i in 0..6 {
        f.swap(i, 6 + i);
    }
    if f.len() >= 34 && f[12..14] == [0x08, 0x00] {
        for i in 0..4 {
            f.swap(26 + i, 30 + i);
        }
    }
}

fn main() {
    let a = Args::parse();
    let addr = SocketAddr::parse(&a.socket).unwrap_or_else(|e| panic!("--socket: {e}"));
    let cfg = ClientConfig {
        id: a.id,
        name: "l3fwd".into(),
        secret: a.secret.map(String::into_bytes),
        queues: a.queues,
        log2_ring: a.log2_ring,
        buffer_size: a.buffer_size,
        hugepages: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let mut c = loop {
        match Client::connect(&addr, &cfg) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("l3fwd: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("l3fwd: {e}"),
        }
    };
    for q in c.queues.iter_mut() {
        for n in 0..a.inject {
            let mut t = 0;
            while !q.send_copy(&frame(a.size, n)) {
                t += 1;
                assert!(t < 10_000_000, "l3fwd: cannot inject: the pool or ring is full");
                let mut none = Vec::new();
                q.recv(&mut none, 0);
            }
        }
    }
    let mut start = Instant::now();
    let warm = start + Duration::from_secs_f64(a.warmup_s);
    let mut warming = a.warmup_s > 0.0;
    let mut frames = 0u64;
    let mut bufs: Vec<Vec<Buf>> = (0..c.queues.len()).map(|_| Vec::with_capacity(256)).collect();
    let mut frame = Vec::with_capacity(16384);
    let mut polls = 0u32;
    'run: loop {
        for (q, held) in c.queues.iter_mut().zip(bufs.iter_mut()) {
            if a.copy {
                let mut out: Vec<Vec<u8>> = Vec::new();
                q.recv_copy(64, &mut frame, |f| {
                    let mut f = f.to_vec();
                    swap(&mut f);
                    out.push(f);
                });
                for f in &out {
                    while !q.send_copy(f) {}
                    frames += 1;
                }
            } else {
                // Whatever the last call could not send goes first.
                if held.is_empty() {
                    q.recv(held, 256);
                    let mut i = 0;
                    while i < held.len() {
                        // The first buffer of each frame holds its headers.
                        let b = held[i];
                        swap(&mut q.data_mut(b)[..b.len as usize]);
                        while held[i].more {
                            i += 1;
                        }
                        i += 1;
                    }
                }
                let ends = |v: &[Buf]| v.iter().filter(|b| !b.more).count() as u64;
                let before = ends(held);
                q.send(held);
                frames += before - ends(held);
            }
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) {
            let now = Instant::now();
            if warming && now >= warm {
                warming = false;
                frames = 0;
                start = now;
            }
            if now >= deadline {
                break 'run;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bad: u64 = c.queues.iter().map(|q| q.bad).sum();
    println!("{{\"frames\": {frames}, \"seconds\": {secs:.3}, \"mode\": \"{}\", \"bad\": {bad}}}", if a.copy { "copy" } else { "zero-copy" });
}
