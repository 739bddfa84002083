//! `vectorlb-tools tun-forward`: the least a user-space data plane on tun interfaces can do.
//! It makes two tun interfaces (plain: no virtio-net header, as the pods port opens them with
//! offloads off) and moves every packet read from one into the other, untouched: a `read` and a
//! `write` per packet, nothing looked at. `make bench-pods` measures pod-to-pod UDP through it,
//! beside the pods port and the bridge, as the ceiling of any data plane built on tun
//! interfaces on that machine.

use crate::ToolError;
use clap::Args;
use serde_json::json;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TunForwardArgs {
    /// The first interface's name (made by the tool; move it where it is wanted).
    #[arg(long)]
    pub a: String,
    /// The second interface's name.
    #[arg(long)]
    pub b: String,
    /// How long to forward, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub duration_s: f64,
}

/// Packets read from one interface before the other is looked at.
const BURST: usize = 64;
const FRAME: usize = 65536;

fn open(name: &str) -> Result<OwnedFd, ToolError> {
    let io = |context: String| move |source| ToolError::Io { context, source };
    // SAFETY: a path that is a NUL-terminated C string; flags only.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io("/dev/net/tun".into())(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which lives for the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) } < 0 {
        return Err(io(format!("TUNSETIFF {name}"))(std::io::Error::last_os_error()));
    }
    Ok(fd)
}

pub fn run(a: &TunForwardArgs) -> Result<serde_json::Value, ToolError> {
    if !(a.duration_s > 0.0 && a.duration_s <= 86_400.0) {
        return Err(ToolError::Usage(format!("--duration-s {}: above 0, at most 86400", a.duration_s)));
    }
    for name in [&a.a, &a.b] {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(ToolError::Usage(format!("interface name {name:?}: 1 to {} bytes", libc::IFNAMSIZ - 1)));
        }
    }
    let fds = [open(&a.a)?, open(&a.b)?];
    println!("{}", json!({"tun_forward": "ready", "a": a.a, "b": a.b}));
    let mut buf = vec![0u8; FRAME];
    let (mut moved, mut failed) = ([0u64; 2], [0u64; 2]);
    let end = Instant::now() + Duration::from_secs_f64(a.duration_s);
    while Instant::now() < end {
        let mut p = [libc::pollfd { fd: fds[0].as_raw_fd(), events: libc::POLLIN, revents: 0 }, libc::pollfd { fd: fds[1].as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        // SAFETY: two valid pollfds; a bounded timeout.
        unsafe { libc::poll(p.as_mut_ptr(), 2, 100) };
        for s in 0..2 {
            for _ in 0..BURST {
                // SAFETY: reads at most buf.len() bytes into `buf`; the descriptor is open.
                let n = unsafe { libc::read(fds[s].as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    break;
                }
                // SAFETY: writes the n bytes just read; the descriptor is open.
                if unsafe { libc::write(fds[1 - s].as_raw_fd(), buf.as_ptr().cast(), n as usize) } < 0 {
                    failed[s] += 1;
                } else {
                    moved[s] += 1;
                }
            }
        }
    }
    Ok(json!({"tun_forward": "done", "a_to_b": moved[0], "b_to_a": moved[1], "write_failed": failed[0] + failed[1]}))
}
