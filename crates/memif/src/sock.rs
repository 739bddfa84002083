//! The control socket: `AF_UNIX` `SOCK_SEQPACKET`, at a path or in the abstract namespace,
//! one 128-byte message per datagram, at most one file descriptor per message (`SCM_RIGHTS`).

use crate::proto::MSG_LEN;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// Where the control socket lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketAddr {
    /// A file system path.
    Path(PathBuf),
    /// A name in the abstract namespace (no file; DPDK's default, `/run/memif.sock`).
    Abstract(Vec<u8>),
}

impl SocketAddr {
    /// `@NAME` or `abstract:NAME` for the abstract namespace, anything else a path.
    pub fn parse(s: &str) -> Result<SocketAddr, String> {
        let a = if let Some(n) = s.strip_prefix('@').or_else(|| s.strip_prefix("abstract:")) {
            SocketAddr::Abstract(n.as_bytes().to_vec())
        } else {
            SocketAddr::Path(PathBuf::from(s))
        };
        let len = match &a {
            SocketAddr::Abstract(n) => n.len() + 1,
            SocketAddr::Path(p) => p.as_os_str().len(),
        };
        if len <= 1 || len > 107 || s.contains('\0') {
            return Err(format!("'{s}': a socket path or @name of 1..=106 bytes"));
        }
        Ok(a)
    }

    fn raw(&self) -> (libc::sockaddr_un, libc::socklen_t) {
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let base = std::mem::size_of::<libc::sa_family_t>();
        let (bytes, start): (&[u8], usize) = match self {
            SocketAddr::Path(p) => (p.as_os_str().as_encoded_bytes(), 0),
            SocketAddr::Abstract(n) => (n, 1),
        };
        let n = bytes.len().min(sa.sun_path.len() - 1 - start);
        for (i, b) in bytes[..n].iter().enumerate() {
            sa.sun_path[start + i] = *b as libc::c_char;
        }
        let len = match self {
            SocketAddr::Path(_) => std::mem::size_of::<libc::sockaddr_un>(),
            SocketAddr::Abstract(_) => base + 1 + n,
        };
        (sa, len as libc::socklen_t)
    }
}

impl std::fmt::Display for SocketAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SocketAddr::Path(p) => write!(f, "{}", p.display()),
            SocketAddr::Abstract(n) => write!(f, "@{}", String::from_utf8_lossy(n)),
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: creating a socket; the result is a fresh descriptor we own.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) })?;
    // SAFETY: fd is fresh and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Listens on `addr`. A path that holds a socket nobody accepts on (left by a process that
/// died) is replaced; one that answers is an error, as is any other file.
pub fn listen(addr: &SocketAddr, mode: u32) -> io::Result<OwnedFd> {
    if let SocketAddr::Path(p) = addr {
        if let Ok(md) = std::fs::symlink_metadata(p) {
            use std::os::unix::fs::FileTypeExt;
            if !md.file_type().is_socket() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists and is not a socket", p.display())));
            }
            if connect(addr).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use: another process listens on it", p.display())));
            }
            std::fs::remove_file(p)?;
        }
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let fd = socket()?;
    let (sa, len) = addr.raw();
    // SAFETY: a valid socket and address of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    if let SocketAddr::Path(p) = addr {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    }
    // SAFETY: a bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 16) })?;
    Ok(fd)
}

/// Connects to `addr` (blocking connect, then non-blocking).
pub fn connect(addr: &SocketAddr) -> io::Result<OwnedFd> {
    // SAFETY: creating a socket; fresh descriptor.
    let raw = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (sa, len) = addr.raw();
    // SAFETY: a valid socket and address.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, len) })?;
    set_nonblocking(&fd)?;
    Ok(fd)
}

pub fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a valid descriptor.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) })?;
    Ok(())
}

/// Accepts one connection; `None` when none is waiting.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: accept4 on a listening socket; NULL address pointers are allowed.
    let r = unsafe { libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: a fresh descriptor from accept4.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

/// The peer's process id and user id (`SO_PEERCRED`), for logs.
pub fn peer_cred(fd: &OwnedFd) -> Option<(i32, u32)> {
    // SAFETY: ucred is plain data.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket and out buffer of `len` bytes.
    let r = unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, &mut c as *mut _ as *mut libc::c_void, &mut len) };
    (r == 0).then_some((c.pid, c.uid))
}

/// Sends one message, with `fd` attached when given.
pub fn send(sock: &OwnedFd, msg: &[u8; MSG_LEN], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: MSG_LEN };
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let mut cbuf = [0u64; 4];
    if let Some(fd) = fd {
        mh.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is a size computation.
        mh.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
        // SAFETY: msg_control points at cbuf (32 bytes ≥ CMSG_SPACE(4)); CMSG_FIRSTHDR returns
        // a header inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
        }
    }
    // The control socket is non-blocking; a full socket buffer cannot happen in a lockstep
    // exchange of 128-byte messages, so a short wait covers it.
    for _ in 0..100 {
        // SAFETY: a valid socket and message header.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(io::Error::new(io::ErrorKind::TimedOut, "the peer does not read its control socket"))
}

/// What one `recv` got.
pub enum Recv {
    /// A datagram of `len` bytes (a valid message has 128; longer ones are cut, with `len`
    /// their true length) and the descriptor it carried, if any.
    Msg { buf: [u8; MSG_LEN], len: usize, fd: Option<OwnedFd> },
    /// Nothing waiting.
    WouldBlock,
    /// The peer closed the connection.
    Closed,
}

/// Receives one message. Every descriptor a message carries is taken (and all but the first
/// closed), so a peer cannot fill the process's descriptor table through us.
pub fn recv(sock: &OwnedFd) -> io::Result<Recv> {
    let mut buf = [0u8; MSG_LEN];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: MSG_LEN };
    // SAFETY: plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let mut cbuf = [0u64; 32];
    mh.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: a valid socket and header; MSG_TRUNC makes the result the datagram's true size.
    let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC | libc::MSG_TRUNC) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Recv::WouldBlock),
            io::ErrorKind::ConnectionReset => Ok(Recv::Closed),
            _ => Err(e),
        };
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf, as CMSG_* define.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let n = ((*c).cmsg_len as usize - (data as usize - c as usize)) / 4;
                for i in 0..n {
                    let fd = std::ptr::read_unaligned((data as *const i32).add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if r == 0 && fds.is_empty() {
        return Ok(Recv::Closed);
    }
    let fd = if fds.is_empty() { None } else { Some(fds.swap_remove(0)) };
    Ok(Recv::Msg { buf, len: r as usize, fd })
}

/// Waits until `fd` is readable or `timeout_ms` passes; true when readable (or hung up).
pub fn wait_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    r > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(SocketAddr::parse("@/run/memif.sock").unwrap(), SocketAddr::Abstract(b"/run/memif.sock".to_vec()));
        assert_eq!(SocketAddr::parse("abstract:x").unwrap(), SocketAddr::Abstract(b"x".to_vec()));
        assert_eq!(SocketAddr::parse("/run/x.sock").unwrap(), SocketAddr::Path("/run/x.sock".into()));
        assert!(SocketAddr::parse("@").is_err());
        assert!(SocketAddr::parse(&format!("/{}", "x".repeat(200))).is_err());
        let (_, len) = SocketAddr::parse("@/run/memif.sock").unwrap().raw();
        assert_eq!(len as usize, 2 + 1 + 15, "DPDK's abstract address length");
    }

    #[test]
    fn messages_and_descriptors_cross_and_extra_descriptors_are_closed() {
        let name = format!("@vectorlb-memif-sock-test-{}", std::process::id());
        let addr = SocketAddr::parse(&name).unwrap();
        let l = listen(&addr, 0o600).unwrap();
        let c = connect(&addr).unwrap();
        let s = loop {
            if let Some(s) = accept(&l).unwrap() {
                break s;
            }
        };
        let msg = crate::proto::Msg::Ack.encode();
        // SAFETY: creating an eventfd.
        let efd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, 0)) };
        send(&c, &msg, Some(efd.as_raw_fd())).unwrap();
        assert!(wait_readable(s.as_raw_fd(), 1000));
        match recv(&s).unwrap() {
            Recv::Msg { buf, len, fd } => {
                assert_eq!(len, 128);
                assert_eq!(buf, msg);
                assert!(fd.is_some());
            }
            _ => panic!("no message"),
        }
        assert!(matches!(recv(&s).unwrap(), Recv::WouldBlock));
        drop(c);
        // A child another test thread forks holds a copy of `c` until it execs (the socket
        // is close-on-exec): wait for the hang-up rather than expect it at once.
        assert!(wait_readable(s.as_raw_fd(), 5000));
        assert!(matches!(recv(&s).unwrap(), Recv::Closed));
    }
}
