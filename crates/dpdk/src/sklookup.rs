//! The mesh's socket lookup program (`csrc/vectorlb_mesh.c`): inside the node proxy's network
//! namespace, every new TCP connection goes to the proxy's outbound listener, or to its inbound
//! one when it is for the tunnel port, whatever its address (docs/mesh.md).

use crate::ffi;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// The compiled program.
pub static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vectorlb_mesh.o"));

/// The program attached to a namespace; detached when dropped (or when the process ends).
pub struct SkLookup {
    handle: *mut libc::c_void,
}

// SAFETY: the handle is only passed back to libbpf's destroy call, once, on drop.
unsafe impl Send for SkLookup {}
// SAFETY: nothing reads or writes through the handle while it is shared (only drop uses it).
unsafe impl Sync for SkLookup {}

impl SkLookup {
    /// Attaches the program to the network namespace `netns` (a descriptor of `/proc/self/ns/net`
    /// or `/var/run/netns/NAME`), handing TCP connections that arrive on interface `ifindex`
    /// (0: any) for `tunnel_port` to `inbound` and all others to `outbound` (both listening TCP
    /// sockets).
    pub fn attach(netns: &impl AsRawFd, outbound: RawFd, inbound: RawFd, tunnel_port: u16, ifindex: u32) -> io::Result<SkLookup> {
        let mut err = 0;
        // SAFETY: OBJECT is a valid buffer for its length; the descriptors are the caller's and
        // only read (the kernel takes its own references); `err` is a valid out pointer.
        let handle = unsafe { ffi::vl_sklookup_attach(OBJECT.as_ptr().cast(), OBJECT.len(), netns.as_raw_fd(), outbound, inbound, tunnel_port as u32, ifindex, &mut err) };
        if handle.is_null() {
            return Err(io::Error::from_raw_os_error(-err));
        }
        Ok(SkLookup { handle })
    }
}

impl Drop for SkLookup {
    fn drop(&mut self) {
        // SAFETY: the handle came from vl_sklookup_attach and is destroyed once.
        unsafe { ffi::vl_sklookup_detach(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// Brings `lo` up in the calling thread's namespace.
    fn lo_up() {
        // SAFETY: a plain socket and an ifreq of the right size for SIOCGIFFLAGS/SIOCSIFFLAGS.
        unsafe {
            let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            assert!(s >= 0);
            let mut ifr: libc::ifreq = std::mem::zeroed();
            ifr.ifr_name[..2].copy_from_slice(&[b'l' as libc::c_char, b'o' as libc::c_char]);
            assert_eq!(libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr), 0);
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            assert_eq!(libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr), 0);
            libc::close(s);
        }
    }

    #[test]
    fn every_new_tcp_connection_reaches_the_proxys_listeners_with_its_destination() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (a network namespace and a BPF program)");
            return;
        }
        // A namespace of this thread's own.
        std::thread::spawn(|| {
            // SAFETY: unshare affects this thread only (a new network namespace for it).
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "{}", io::Error::last_os_error());
            lo_up();
            let netns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            let outbound = TcpListener::bind("127.0.0.1:0").unwrap();
            let inbound = TcpListener::bind("127.0.0.1:0").unwrap();
            // Restricted to another interface than lo: a connection over lo goes where it is
            // addressed (nowhere here).
            let other = SkLookup::attach(&netns, outbound.as_raw_fd(), inbound.as_raw_fd(), 15008, 999).unwrap();
            assert!(TcpStream::connect("127.0.0.9:8080").is_err());
            drop(other);
            let steer = SkLookup::attach(&netns, outbound.as_raw_fd(), inbound.as_raw_fd(), 15008, 1).unwrap();
            for (to, via) in [("127.0.0.9:8080", &outbound), ("127.0.0.1:443", &outbound), ("127.0.0.5:15008", &inbound)] {
                let mut c = TcpStream::connect(to).unwrap();
                let (mut s, _) = via.accept().unwrap();
                assert_eq!(s.local_addr().unwrap().to_string(), to, "the accepted socket's own address is the destination");
                c.write_all(b"x").unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
            }
            // Detached: nothing listens on those ports any more.
            drop(steer);
            assert!(TcpStream::connect("127.0.0.9:8080").is_err());
            // A listener that closed is not a lookup result either.
            let steer = SkLookup::attach(&netns, outbound.as_raw_fd(), inbound.as_raw_fd(), 15008, 0).unwrap();
            drop(outbound);
            assert!(TcpStream::connect("127.0.0.9:8080").is_err());
            drop(steer);
        })
        .join()
        .unwrap();
    }
}
