//! An open-loop memcached load client (`vectorlb-tools memcache-load`), for the queue-set
//! experiment of seed 002 (memcached's tail latency under background traffic).
//!
//! Requests are due at fixed intervals (`--rate`), spread round robin over `--connections`
//! connections (the seed: 4 clients x 2 connections), and each is written when it is due,
//! whether or not the connection's earlier requests were answered (memcached's text protocol
//! answers a connection's requests in order, so requests pipeline). A request's latency runs
//! from its intended time to the end of its response: a server that falls behind shows in the
//! latency instead of slowing the client down (rpc-perf's closed loop hides that). Keys are
//! `--key-size` bytes, values `--value-size` bytes, gets and sets `--get-ratio` to the rest; the
//! keys are stored once before the run so that gets hit. Percentiles to P99.99 from HDR
//! histograms (1 µs to 60 s, 3 significant digits).

use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::httpload::{histogram, xorshift};

#[derive(clap::Args, Debug, Clone)]
pub struct MemcacheLoadArgs {
    /// The server, ADDRESS:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// Requests per second in all (open loop).
    #[arg(long)]
    pub rate: f64,
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds at the start whose requests are sent but not counted.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Connections (the seed's 4 clients x 2 connections).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u32,
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Share of gets (the rest are sets): the seed's 4:1 is 0.8.
    #[arg(long, default_value_t = 0.8)]
    pub get_ratio: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

/// A request written and not answered yet.
struct Pending {
    due: Instant,
    get: bool,
    counted: bool,
}

/// What a response was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Hit,
    Miss,
    Stored,
    /// `ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`, `NOT_STORED`, or anything else.
    Error,
}

/// Reads one response (of a get: `VALUE <key> <flags> <bytes>` + data, then `END`; of a set:
/// one line) from `r`; at most `max_value` bytes of data.
pub fn read_reply(r: &mut impl BufRead, line: &mut String, max_value: usize) -> std::io::Result<Reply> {
    fn bad(m: &str) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string())
    }
    fn next(r: &mut impl BufRead, line: &mut String) -> std::io::Result<()> {
        line.clear();
        // A line is short; a server sending megabytes without a newline is broken.
        let n = r.by_ref().take(1024).read_line(line)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        if !line.ends_with("\r\n") {
            return Err(bad("a response line without CRLF, or above 1 KiB"));
        }
        line.truncate(line.len() - 2);
        Ok(())
    }
    next(r, line)?;
    match line.as_str() {
        "END" => return Ok(Reply::Miss),
        "STORED" => return Ok(Reply::Stored),
        l if !l.starts_with("VALUE ") => return Ok(Reply::Error),
        _ => {}
    }
    let bytes: usize = line.rsplit(' ').next().and_then(|b| b.parse().ok()).ok_or_else(|| bad("VALUE line without a length"))?;
    if bytes > max_value {
        return Err(bad("a value longer than asked for"));
    }
    let mut data = vec![0u8; bytes + 2];
    r.read_exact(&mut data)?;
    if &data[bytes..] != b"\r\n" {
        return Err(bad("a value not followed by CRLF"));
    }
    next(r, line)?;
    if line != "END" {
        return Err(bad("a get answered with more than one value"));
    }
    Ok(Reply::Hit)
}

fn key(i: u32, size: usize) -> String {
    format!("{i:0size$}")
}

/// What one connection recorded.
#[derive(Default)]
struct Tally {
    get: Option<Histogram<u64>>,
    set: Option<Histogram<u64>>,
    hits: u64,
    misses: u64,
    errors: u64,
    /// Requests never answered (connection lost, or past the grace).
    lost: u64,
}

/// Stores every key once (closed loop), so that the run's gets hit.
fn preload(a: &MemcacheLoadArgs, value: &[u8]) -> Result<(), String> {
    let s = TcpStream::connect_timeout(&a.target, Duration::from_secs(5)).map_err(|e| format!("memcache-load: {}: {e}", a.target))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // In batches of 100 pipelined sets.
    let mut i = 0;
    while i < a.keys {
        let n = (a.keys - i).min(100);
        let mut req = Vec::new();
        for k in i..i + n {
            req.extend_from_slice(format!("set {} 0 0 {}\r\n", key(k, a.key_size), value.len()).as_bytes());
            req.extend_from_slice(value);
            req.extend_from_slice(b"\r\n");
        }
        w.write_all(&req).map_err(|e| format!("memcache-load: preload: {e}"))?;
        for _ in 0..n {
            match read_reply(&mut r, &mut line, value.len()) {
                Ok(Reply::Stored) => {}
                Ok(other) => return Err(format!("memcache-load: preload: a set was answered {other:?} ({line})")),
                Err(e) => return Err(format!("memcache-load: preload: {e}")),
            }
        }
        i += n;
    }
    Ok(())
}

/// Runs the load; one JSON object.
pub fn run(a: &MemcacheLoadArgs) -> Result<serde_json::Value, String> {
    if !(a.rate.is_finite() && a.rate > 0.0 && a.rate <= 10_000_000.0) {
        return Err(format!("--rate {}: not in (0, 10000000]", a.rate));
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0 && a.seconds <= 3600.0 && a.warmup.is_finite() && a.warmup >= 0.0 && a.warmup < a.seconds) {
        return Err("--seconds must be in (0, 3600] and --warmup in [0, seconds)".into());
    }
    if !(1..=1024).contains(&a.connections) {
        return Err(format!("--connections {}: not in 1..=1024", a.connections));
    }
    if !(1..=10_000_000).contains(&a.keys) || !(1..=250).contains(&a.key_size) || a.key_size < a.keys.to_string().len() || a.value_size > 1_000_000 {
        return Err("--keys in 1..=10000000, --key-size in 1..=250 and long enough to number them, --value-size at most 1000000".into());
    }
    if !(0.0..=1.0).contains(&a.get_ratio) {
        return Err(format!("--get-ratio {}: not in [0, 1]", a.get_ratio));
    }
    let value: Vec<u8> = (0..a.value_size).map(|i| b'a' + (i % 26) as u8).collect();
    preload(a, &value)?;
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs_f64(a.seconds);
    let counted_from = start + Duration::from_secs_f64(a.warmup);
    let grace = Duration::from_secs(5);
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for c in 0..a.connections {
        let s = TcpStream::connect_timeout(&a.target, Duration::from_secs(5)).map_err(|e| format!("memcache-load: {}: {e}", a.target))?;
        let _ = s.set_nodelay(true);
        let mut w = s.try_clone().map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel::<(Instant, u32, bool)>();
        senders.push(tx);
        // In flight on this connection, oldest first: the writer adds before it writes, the
        // reader takes as responses come (in order).
        let (pend_tx, pend_rx) = mpsc::channel::<Pending>();
        let (key_size, value) = (a.key_size, value.clone());
        let writer = std::thread::spawn(move || {
            // Sleeps to each request's time end within a microsecond or so of it, not within
            // the default 50 µs of timer slack (which would show as latency).
            // SAFETY: prctl with an integer argument changes only this thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            let mut req = Vec::with_capacity(128 + value.len());
            for (due, k, get) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                req.clear();
                if get {
                    req.extend_from_slice(format!("get {}\r\n", key(k, key_size)).as_bytes());
                } else {
                    req.extend_from_slice(format!("set {} 0 0 {}\r\n", key(k, key_size), value.len()).as_bytes());
                    req.extend_from_slice(&value);
                    req.extend_from_slice(b"\r\n");
                }
                if pend_tx.send(Pending { due, get, counted: due >= counted_from }).is_err() || w.write_all(&req).is_err() {
                    break;
                }
            }
            // Closing the write half tells memcached we are done once it has answered.
            let _ = w.shutdown(std::net::Shutdown::Write);
        });
        let max_value = a.value_size;
        let reader = std::thread::spawn(move || {
            let mut t = Tally::default();
            // One timeout for the whole run: a read cut short would lose the stream's place.
            let _ = s.set_read_timeout(Some((end + grace).saturating_duration_since(Instant::now()).max(Duration::from_millis(100))));
            let mut r = BufReader::new(s);
            let mut line = String::new();
            let mut waiting: VecDeque<Pending> = VecDeque::new();
            loop {
                while let Ok(p) = pend_rx.try_recv() {
                    waiting.push_back(p);
                }
                if waiting.is_empty() {
                    match pend_rx.recv_timeout(Duration::from_millis(50)) {
                        Ok(p) => waiting.push_back(p),
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    }
                }
                if Instant::now() > end + grace {
                    t.lost += waiting.len() as u64;
                    break;
                }
                let reply = read_reply(&mut r, &mut line, max_value);
                let done = Instant::now();
                match reply {
                    Err(_) => {
                        // The connection is gone, speaks nonsense or is past its time: what
                        // waits is lost, and so is whatever the writer adds from now on.
                        t.lost += waiting.len() as u64;
                        t.lost += pend_rx.iter().count() as u64;
                        break;
                    }
                    Ok(reply) => {
                        let p = waiting.pop_front().expect("a request waits for each reply");
                        if !p.counted {
                            continue;
                        }
                        let us = done.saturating_duration_since(p.due).as_micros().max(1) as u64;
                        match (p.get, reply) {
                            (true, Reply::Hit) | (true, Reply::Miss) | (false, Reply::Stored) => {
                                if reply == Reply::Hit {
                                    t.hits += 1;
                                } else if reply == Reply::Miss {
                                    t.misses += 1;
                                }
                                let h = if p.get { &mut t.get } else { &mut t.set };
                                let _ = h.get_or_insert_with(histogram).record(us.min(60_000_000));
                            }
                            _ => t.errors += 1,
                        }
                    }
                }
            }
            t
        });
        threads.push((writer, reader, c));
    }
    // The schedule: request i is due at start + i / rate, on connection i mod connections.
    let interval = 1.0 / a.rate;
    let mut seq = a.seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1;
    let mut scheduled = 0u64;
    let ahead = Duration::from_millis(2);
    loop {
        let due = start + Duration::from_secs_f64(scheduled as f64 * interval);
        if due >= end {
            break;
        }
        // Hand each request to its connection's writer a little before it is due; the writer
        // waits for the exact time.
        let now = Instant::now();
        if due > now + ahead {
            std::thread::sleep(due - now - ahead);
        }
        let x = xorshift(&mut seq);
        let get = (x % 1_000_000) as f64 / 1_000_000.0 < a.get_ratio;
        let k = ((x >> 20) % a.keys as u64) as u32;
        let _ = senders[(scheduled % a.connections as u64) as usize].send((due, k, get));
        scheduled += 1;
    }
    drop(senders);
    let (mut get, mut set) = (histogram(), histogram());
    let (mut hits, mut misses, mut errors, mut lost) = (0, 0, 0, 0);
    for (w, r, _) in threads {
        let _ = w.join();
        let t = r.join().map_err(|_| "a connection thread panicked".to_string())?;
        if let Some(h) = &t.get {
            get.add(h).map_err(|e| e.to_string())?;
        }
        if let Some(h) = &t.set {
            set.add(h).map_err(|e| e.to_string())?;
        }
        hits += t.hits;
        misses += t.misses;
        errors += t.errors;
        lost += t.lost;
    }
    let measured = a.seconds - a.warmup;
    let mut all = histogram();
    all.add(&get).map_err(|e| e.to_string())?;
    all.add(&set).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "bench": "memcache_load",
        "rate": a.rate,
        "achieved_rps": (all.len() as f64 / measured * 10.0).round() / 10.0,
        "seconds": a.seconds,
        "warmup": a.warmup,
        "connections": a.connections,
        "scheduled": scheduled,
        "hits": hits,
        "misses": misses,
        "errors": errors,
        "lost": lost,
        "total": summary(&all),
        "get": summary(&get),
        "set": summary(&set),
    }))
}

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let q = |p: f64| if h.is_empty() { serde_json::Value::Null } else { serde_json::json!(h.value_at_quantile(p)) };
    serde_json::json!({
        "requests": h.len(),
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "p999_us": q(0.999),
        "p9999_us": q(0.9999),
        "max_us": if h.is_empty() { serde_json::Value::Null } else { serde_json::json!(h.max()) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn replies_parse_and_nonsense_is_an_error_not_a_panic() {
        let mut line = String::new();
        let mut r = Cursor::new(b"VALUE 00000001 0 3\r\nabc\r\nEND\r\nEND\r\nSTORED\r\nSERVER_ERROR out of memory\r\n".to_vec());
        assert_eq!(read_reply(&mut r, &mut line, 64).unwrap(), Reply::Hit);
        assert_eq!(read_reply(&mut r, &mut line, 64).unwrap(), Reply::Miss);
        assert_eq!(read_reply(&mut r, &mut line, 64).unwrap(), Reply::Stored);
        assert_eq!(read_reply(&mut r, &mut line, 64).unwrap(), Reply::Error);
        assert!(read_reply(&mut r, &mut line, 64).is_err(), "end of stream");
        for bad in [&b"VALUE k 0 999999\r\n"[..], b"VALUE k 0 x\r\n", b"VALUE k 0 3\r\nabcXY", b"VALUE k 0 3\r\nabc\r\nVALUE", b"STORED", b"VALUE k 0 3\r\nab"] {
            assert!(read_reply(&mut Cursor::new(bad.to_vec()), &mut line, 64).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        // A line that never ends is cut at 1 KiB.
        assert!(read_reply(&mut Cursor::new(vec![b'x'; 5000]), &mut line, 64).is_err());
        // Every cut of a good stream: an error or a reply, never a panic.
        let good = b"VALUE 00000001 0 3\r\nabc\r\nEND\r\nSTORED\r\n";
        for n in 0..good.len() {
            let mut c = Cursor::new(good[..n].to_vec());
            while read_reply(&mut c, &mut line, 64).is_ok() {}
        }
    }

    /// Debian's memcached on a free port, for as long as the guard lives; None without it.
    struct Memcached(std::process::Child, SocketAddr);

    impl Drop for Memcached {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn memcached() -> Option<Memcached> {
        let bin = ["/usr/bin/memcached", "/usr/sbin/memcached"].into_iter().find(|p| std::path::Path::new(p).exists())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "64", "-t", "1"]);
        // memcached refuses to run as root without -u.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "nobody"]);
        }
        let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().ok()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
        let t = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if t.elapsed() > Duration::from_secs(5) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Memcached(child, addr))
    }

    fn args(target: SocketAddr) -> MemcacheLoadArgs {
        MemcacheLoadArgs { target, rate: 2000.0, seconds: 1.5, warmup: 0.5, connections: 8, keys: 1000, key_size: 8, value_size: 64, get_ratio: 0.8, seed: 3, json: true }
    }

    #[test]
    fn open_loop_against_debians_memcached() {
        let m = memcached().expect("memcached is installed by scripts/setup.sh");
        let r = run(&args(m.1)).unwrap();
        assert_eq!(r["scheduled"], 3000, "1.5 s at 2000/s");
        assert_eq!((r["errors"].as_u64(), r["lost"].as_u64(), r["misses"].as_u64()), (Some(0), Some(0), Some(0)), "{r}");
        let (gets, sets) = (r["get"]["requests"].as_u64().unwrap(), r["set"]["requests"].as_u64().unwrap());
        assert!((1990..=2010).contains(&(gets + sets)), "the counted second: {gets} + {sets}");
        assert!(gets > 3 * sets && sets > 250, "4:1: {gets} : {sets}");
        assert_eq!(r["hits"].as_u64(), Some(gets), "the preloaded keys hit");
        assert!(r["total"]["p9999_us"].as_u64().unwrap() >= r["total"]["p50_us"].as_u64().unwrap());
    }

    #[test]
    fn a_server_that_is_not_there_or_bad_arguments_say_why() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(run(&args(dead)).unwrap_err().contains(&dead.to_string()));
        let mut a = args(dead);
        a.rate = 0.0;
        assert!(run(&a).unwrap_err().contains("--rate"));
        let mut a = args(dead);
        a.keys = 1_000_000_000;
        assert!(run(&a).is_err());
        let mut a = args(dead);
        a.key_size = 2;
        assert!(run(&a).unwrap_err().contains("--key-size"));
    }
}
