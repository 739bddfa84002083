//! One daemon per data-plane interface and per API endpoint, and no collateral damage from a
//! start that fails: the locks are taken before anything is touched (no XDP program attached,
//! no socket replaced), so a second `vectorlb run` on the same interfaces stops at the lock and
//! the first keeps serving. A start after a crash finds the locks free, and clears what the
//! dead instance left: its XDP programs (recognised by name) and its files in `run_dir`.

use crate::error::DaemonError;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use vectorlb_dpdk::xdp;

/// Where the locks live: tmpfs, shared by every instance whatever its `run_dir`.
pub const LOCK_DIR: &str = "/run/lock/vectorlb";

/// The locks this process holds; released when it exits (or dies).
pub struct Locks {
    _files: Vec<File>,
}

/// What one lock guards, for the file name and the messages.
pub enum Guarded<'a> {
    /// A data-plane device: its kernel interface, PCI address or DPDK name.
    Device { index: usize, name: &'a str },
    /// The control API's endpoint.
    Api(&'a str),
}

/// The network namespace this process runs in: interface names and TCP ports are per
/// namespace, so two namespaces' `eth0` are different interfaces.
fn netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0)
}

fn file_name(g: &Guarded<'_>) -> String {
    let clean = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect::<String>();
    match g {
        Guarded::Device { name, .. } => format!("dev-{}-{}.lock", netns(), clean(name)),
        // A unix socket path is the same file from every namespace; a relative one names the
        // socket in the working directory (two daemons started from one file in two
        // directories have two sockets).
        Guarded::Api(a) if a.starts_with("unix:") => format!("api-{}.lock", clean(&absolute(&a[5..], &std::env::current_dir().unwrap_or_default()))),
        Guarded::Api(a) => format!("api-{}-{}.lock", netns(), clean(a)),
    }
}

/// `path` from `cwd` when it is relative.
fn absolute(path: &str, cwd: &Path) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        cwd.join(path).display().to_string()
    }
}

/// Takes every lock, or none: the first one held by another process is an error naming what
/// it guards and that process.
pub fn lock(guarded: &[Guarded<'_>], dir: &Path) -> Result<Locks, DaemonError> {
    std::fs::create_dir_all(dir).map_err(|source| DaemonError::Lock { path: dir.to_path_buf(), source })?;
    let mut files = Vec::new();
    for g in guarded {
        let path = dir.join(file_name(g));
        let mut f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|source| DaemonError::Lock { path: path.clone(), source })?;
        // SAFETY: flock on a file descriptor this process owns; it only takes an advisory lock.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let what = match g {
                Guarded::Device { index, name } => format!("ports[{index}]: {name}"),
                Guarded::Api(a) => format!("runtime.api: {a}"),
            };
            return Err(DaemonError::InUse { what, pid: pid.trim().to_string() });
        }
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = write!(f, "{}", std::process::id());
        files.push(f);
    }
    Ok(Locks { _files: files })
}

/// The interface, PCI address or device name that identifies a device string.
pub fn device_key(dev: &str) -> &str {
    dev.split(',').find_map(|kv| kv.strip_prefix("iface=")).unwrap_or_else(|| vectorlb_dpdk::device_name(dev))
}

/// Clears an XDP program a dead instance left on `iface` (ours, by name; the lock proves its
/// owner is gone). A program that is not vectorlb's is someone else's: an error, untouched.
pub fn clear_stale_xdp(index: usize, iface: &str) -> Result<(), DaemonError> {
    let found = match xdp::attached(iface) {
        // No such interface: DPDK says so, with its hint, when it opens the port.
        Err(vectorlb_dpdk::Error::Xdp { source, .. }) if source.raw_os_error() == Some(libc::ENODEV) => return Ok(()),
        r => r.map_err(|source| DaemonError::Port { index, name: iface.to_string(), source })?,
    };
    match found {
        None => Ok(()),
        Some(a) if a.is_ours() => {
            xdp::detach(iface).map_err(|source| DaemonError::Port { index, name: iface.to_string(), source })?;
            tracing::warn!("ports[{index}]: removed the XDP program (id {}) that a stopped vectorlb left on {iface}", a.id);
            Ok(())
        }
        Some(a) => Err(DaemonError::ForeignXdp { index, iface: iface.to_string(), id: a.id, name: a.name }),
    }
}

/// Removes the XDP objects (`vectorlb_xdp.PID.o`) of processes that are gone.
pub fn clear_stale_files(run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(run_dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("vectorlb_xdp.").and_then(|r| r.strip_suffix(".o")) else { continue };
        if pid.parse::<u32>().is_ok_and(|p| p != std::process::id() && !alive(p)) {
            let path: PathBuf = e.path();
            if std::fs::remove_file(&path).is_ok() {
                tracing::info!("removed {}, left by a process that is gone", path.display());
            }
        }
    }
}

/// Whether process `pid` runs (a zombie, dead but not yet reaped, does not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Every address the host kernel holds (in this namespace): the flow director leaves traffic
/// to them to the kernel.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list it allocates; we walk it read-only and free
    // it with freeifaddrs once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() {
                match (*a).sa_family as i32 {
                    libc::AF_INET => {
                        let sin = a as *const libc::sockaddr_in;
                        out.push(IpAddr::from(u32::from_be((*sin).sin_addr.s_addr).to_be_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = a as *const libc::sockaddr_in6;
                        out.push(IpAddr::from((*sin6).sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_socket_path_is_the_working_directorys() {
        assert_eq!(absolute("api.sock", Path::new("/srv/a")), "/srv/a/api.sock");
        assert_ne!(absolute("api.sock", Path::new("/srv/a")), absolute("api.sock", Path::new("/srv/b")));
        assert_eq!(absolute("/run/x.sock", Path::new("/srv/a")), "/run/x.sock");
    }

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = std::env::temp_dir().join(format!("vectorlb-locks-{}", std::process::id()));
        let g = [Guarded::Device { index: 0, name: "veth-test" }, Guarded::Api("unix:/tmp/x.sock")];
        let held = lock(&g, &dir).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        let e = lock(&g[..1], &dir).err().expect("the device is locked").to_string();
        assert!(e.contains("ports[0]: veth-test") && e.contains(&std::process::id().to_string()), "{e}");
        let e = lock(&g[1..], &dir).err().expect("the API is locked").to_string();
        assert!(e.contains("runtime.api: unix:/tmp/x.sock"), "{e}");
        drop(held);
        lock(&g, &dir).expect("free again once the holder is gone");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(device_key("net_af_xdp0,iface=ext0,queue_count=2"), "ext0");
        assert_eq!(device_key("0000:3b:00.0"), "0000:3b:00.0");
        assert!(host_addresses().contains(&IpAddr::from([127, 0, 0, 1])), "loopback is the host's");
    }
}
