//! Tun interfaces in other network namespaces, for pods: created (or taken back after a
//! restart) from a short-lived thread that entered the pod's namespace, configured there by
//! ioctl (link up, MTU, addresses, default routes through the interface), and kept as a file
//! descriptor the workers read and write. Interfaces are persistent: a daemon that stops or
//! dies leaves its pods' interfaces (and their addresses and routes) in place, and the next
//! one attaches to them again by name.

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUNGETFEATURES: libc::c_ulong = 0x8004_54cf;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
/// TUNSETOFFLOAD's flags (linux/if_tun.h): what the interface lets its kernel leave to us.
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;

/// `statfs`'s type of the namespace file system (linux/magic.h).
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Opens the network namespace at `netns` (a path such as `/var/run/netns/NAME` or
/// `/proc/PID/ns/net`) without trusting the path: what is not a regular file there (a FIFO,
/// a device, a socket, a directory) is refused before it is opened, the open never blocks, and
/// the descriptor must be a namespace's (nsfs) other than the daemon's own (whose routes a
/// "pod" would otherwise take over).
pub fn open_netns(netns: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_string());
    if !std::fs::metadata(netns)?.is_file() {
        return Err(invalid("not a network namespace (not a namespace file)"));
    }
    let ns = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(netns)?;
    // SAFETY: a zeroed statfs is a valid out-parameter; the descriptor is open.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatfs(ns.as_raw_fd(), &mut fs) } != 0 || fs.f_type as i64 != NSFS_MAGIC {
        return Err(invalid("not a network namespace (not on nsfs)"));
    }
    let (m, own) = (ns.metadata()?, std::fs::metadata("/proc/self/ns/net")?);
    if (m.dev(), m.ino()) == (own.dev(), own.ino()) {
        return Err(invalid("the daemon's own network namespace, not a pod's"));
    }
    Ok(ns)
}

/// Runs `f` on a thread that entered the network namespace at `netns` ([`open_netns`]). Only
/// that thread changes namespace; it ends with `f`.
pub fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = open_netns(netns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a file descriptor we own; it changes only this thread's network
            // namespace, and the thread ends right after `f`.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(e.kind(), format!("not a network namespace ({e})")));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[repr(C)]
struct IfReqInt {
    name: [u8; libc::IFNAMSIZ],
    value: libc::c_int,
    _pad: [u8; 20],
}

#[repr(C)]
struct IfReqAddr {
    name: [u8; libc::IFNAMSIZ],
    addr: libc::sockaddr_in,
    _pad: [u8; 8],
}

#[repr(C)]
struct In6IfReq {
    addr: libc::in6_addr,
    prefixlen: u32,
    ifindex: libc::c_int,
}

#[repr(C)]
struct In6RtMsg {
    dst: libc::in6_addr,
    src: libc::in6_addr,
    gateway: libc::in6_addr,
    kind: u32,
    dst_len: u16,
    src_len: u16,
    metric: u32,
    info: libc::c_ulong,
    flags: u32,
    ifindex: libc::c_int,
}

fn name_bytes(name: &str) -> io::Result<[u8; libc::IFNAMSIZ]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.iter().any(|&c| c == 0 || c == b'/' || c == b' ' || c == b':') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("'{name}' is not an interface name (1..=15 bytes, no '/', ':' or spaces)")));
    }
    let mut n = [0u8; libc::IFNAMSIZ];
    n[..b.len()].copy_from_slice(b);
    Ok(n)
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Opens (creating it if needed) the persistent tun interface `name` in the calling thread's
/// network namespace, non-blocking: IP packets without a header, or, with `offloads` where
/// the kernel has them, each after a virtio-net header (`IFF_VNET_HDR`), the interface
/// offering its kernel checksum offload and TCP segmentation for both families (its TCP then
/// hands over up to 64 KB at once, with the checksum left to us). Whether it has offloads is
/// returned; an interface taken back from an earlier run gets this run's choice.
pub fn open(name: &str, offloads: bool) -> io::Result<(OwnedFd, bool)> {
    let n = name_bytes(name)?;
    // SAFETY: a NUL-terminated path; the returned descriptor is checked and then owned.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    check(fd, "open /dev/net/tun")?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut features: libc::c_uint = 0;
    // SAFETY: TUNGETFEATURES writes an unsigned int.
    let vnet = offloads && unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETFEATURES, &mut features) } == 0 && features & IFF_VNET_HDR as libc::c_uint != 0;
    let flags = IFF_TUN | IFF_NO_PI | if vnet { IFF_VNET_HDR } else { 0 };
    let mut req = IfReqFlags { name: n, flags, _pad: [0; 22] };
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReqFlags lays out (40 bytes).
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) }, "TUNSETIFF")?;
    // SAFETY: TUNSETPERSIST takes its argument by value.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) }, "TUNSETPERSIST")?;
    let vnet = vnet && {
        let size: libc::c_int = vectorlb_packet::vnet::HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int; TUNSETOFFLOAD takes its flags by value.
        unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ, &size) == 0 && libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) == 0 }
    };
    if !vnet {
        // No offloads: none may stay on from an earlier run (the kernel would hand over
        // packets longer than the MTU, with no header to say so).
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, 0 as libc::c_ulong) } != 0 && offloads {
            tracing::debug!("{name}: TUNSETOFFLOAD 0: {}", io::Error::last_os_error());
        }
        if flags & IFF_VNET_HDR != 0 {
            // Asked for and refused: open it again without the header.
            drop(fd);
            return open(name, false);
        }
    }
    Ok((fd, vnet))
}

/// Makes the interface behind `fd` go away when its last descriptor closes.
pub fn unpersist(fd: &OwnedFd) {
    // SAFETY: TUNSETPERSIST takes its argument by value; `fd` is a tun descriptor.
    unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST, 0 as libc::c_ulong) };
}

/// Whether the interface `name` exists in the calling thread's network namespace.
pub fn exists(name: &str) -> bool {
    CString::new(name).is_ok_and(|c| {
        // SAFETY: a NUL-terminated name.
        unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
    })
}

/// Writes an IPv4 socket address where the kernel's structure has a generic one.
fn put_sin(dst: &mut libc::sockaddr, v: libc::sockaddr_in) {
    const _: () = assert!(std::mem::size_of::<libc::sockaddr_in>() == std::mem::size_of::<libc::sockaddr>());
    // SAFETY: sockaddr_in and sockaddr have the same size (checked above) and `dst` is a valid,
    // exclusively borrowed sockaddr; an unaligned write needs no alignment.
    unsafe { std::ptr::write_unaligned(dst as *mut libc::sockaddr as *mut libc::sockaddr_in, v) };
}

fn socket(family: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is checked and then owned.
    let s = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    check(s, "socket")?;
    // SAFETY: just created, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// Configures the interface `name` in the calling thread's namespace: MTU, up, each address
/// (a host address: /32, /128) and a default route of each family through the interface.
/// Existing addresses and routes are left as they are, so this can run again after a restart.
pub fn configure(name: &str, mtu: u16, addrs: &[IpAddr]) -> io::Result<()> {
    let n = name_bytes(name)?;
    let s4 = socket(libc::AF_INET)?;
    let mut mreq = IfReqInt { name: n, value: mtu as libc::c_int, _pad: [0; 20] };
    // SAFETY: SIOCSIFMTU reads a struct ifreq with ifr_mtu (IfReqInt's layout).
    check(unsafe { libc::ioctl(s4.as_raw_fd(), libc::SIOCSIFMTU, &mut mreq) }, "set the MTU")?;
    let mut f = IfReqFlags { name: n, flags: 0, _pad: [0; 22] };
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS read and write ifr_flags of a struct ifreq.
    check(unsafe { libc::ioctl(s4.as_raw_fd(), libc::SIOCGIFFLAGS, &mut f) }, "read the flags")?;
    f.flags |= libc::IFF_UP as libc::c_short;
    // SAFETY: as above.
    check(unsafe { libc::ioctl(s4.as_raw_fd(), libc::SIOCSIFFLAGS, &mut f) }, "set the link up")?;
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) } as libc::c_int;
    for a in addrs {
        match a {
            IpAddr::V4(v4) => {
                let sin = |a: [u8; 4]| libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 0,
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a) },
                    sin_zero: [0; 8],
                };
                let mut r = IfReqAddr { name: n, addr: sin(v4.octets()), _pad: [0; 8] };
                // SAFETY: SIOCSIFADDR reads a struct ifreq with a sockaddr_in (IfReqAddr).
                check(unsafe { libc::ioctl(s4.as_raw_fd(), libc::SIOCSIFADDR, &mut r) }, "add the IPv4 address")?;
                let mut m = IfReqAddr { name: n, addr: sin([255; 4]), _pad: [0; 8] };
                // SAFETY: as above, the netmask.
                check(unsafe { libc::ioctl(s4.as_raw_fd(), libc::SIOCSIFNETMASK, &mut m) }, "set the IPv4 netmask")?;
                add_route(name, IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0)?;
            }
            IpAddr::V6(v6) => {
                let s6 = socket(libc::AF_INET6)?;
                let mut r = In6IfReq { addr: libc::in6_addr { s6_addr: v6.octets() }, prefixlen: 128, ifindex };
                // SAFETY: SIOCSIFADDR on an AF_INET6 socket reads a struct in6_ifreq.
                let ret = unsafe { libc::ioctl(s6.as_raw_fd(), libc::SIOCSIFADDR, &mut r) };
                if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                    check(ret, "add the IPv6 address")?;
                }
                add_route(name, IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0)?;
            }
        }
    }
    Ok(())
}

/// Adds a route to `prefix/len` through interface `name` in the calling thread's namespace
/// (the host's routes to its pods' networks); an existing one is kept.
pub fn add_route(name: &str, prefix: IpAddr, len: u8) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) } as libc::c_int;
    if ifindex == 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {name}")));
    }
    let ret = match prefix {
        IpAddr::V4(p) => {
            let s = socket(libc::AF_INET)?;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            let sin = |a: u32| libc::sockaddr_in { sin_family: libc::AF_INET as libc::sa_family_t, sin_port: 0, sin_addr: libc::in_addr { s_addr: a.to_be() }, sin_zero: [0; 8] };
            // SAFETY: an all-zero rtentry is a valid value (null pointers, zero fields).
            let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
            put_sin(&mut rt.rt_dst, sin(u32::from(p) & mask));
            put_sin(&mut rt.rt_genmask, sin(mask));
            rt.rt_flags = libc::RTF_UP;
            rt.rt_dev = c.as_ptr() as *mut libc::c_char;
            // SAFETY: SIOCADDRT reads a struct rtentry.
            unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCADDRT, &mut rt) }
        }
        IpAddr::V6(p) => {
            let s = socket(libc::AF_INET6)?;
            let zero = libc::in6_addr { s6_addr: [0; 16] };
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            let dst = libc::in6_addr { s6_addr: (u128::from(p) & mask).to_be_bytes() };
            let mut rt = In6RtMsg { dst, src: zero, gateway: zero, kind: 0, dst_len: len as u16, src_len: 0, metric: 1024, info: 0, flags: libc::RTF_UP as u32, ifindex };
            // SAFETY: SIOCADDRT on an AF_INET6 socket reads a struct in6_rtmsg.
            unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCADDRT, &mut rt) }
        }
    };
    if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        check(ret, &format!("add the route to {prefix}/{len} through {name}"))?;
    }
    Ok(())
}
