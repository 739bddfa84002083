//! A hostile client against our server: broken handshakes of every kind, descriptors outside
//! the regions, huge lengths, unknown regions, endless chains, descriptors rewritten while the
//! server reads them, ring indexes that jump. The server must refuse or count each, never read
//! or write outside the shared memory, and keep serving the next (honest) client.
//!
//! `make test` also runs this file in an AddressSanitizer build (scripts/asan-memif.sh), where
//! the server's buffers are heap buffers ASan watches and the peer's regions sit between guard
//! pages.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_io::mem::Pool;
use vectorlb_io::{Copier, PacketBuf, PacketPool, RxQueue, TxQueue};
use vectorlb_memif::proto::{self, AddRegion, AddRing, Init, Msg};
use vectorlb_memif::region::Region;
use vectorlb_memif::ring::{ring_len, Desc, Ring, DESC_FLAG_NEXT};
use vectorlb_memif::sock::{self, Recv};
use vectorlb_memif::*;

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Srv {
    addr: SocketAddr,
    link: Arc<Link>,
    stop: Arc<AtomicBool>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Srv {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.th.take().unwrap().join().unwrap();
    }
}

fn serve(tag: &str) -> Srv {
    let addr = SocketAddr::parse(&format!("@vectorlb-hostile-{tag}-{}", std::process::id())).unwrap();
    let (server, links) = Server::bind(&addr, 0o600, vec![InterfaceConfig { queues: 1, max_log2_ring: 10, ..Default::default() }]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let th = Some(server.spawn(stop.clone()).unwrap());
    Srv { addr, link: links[0].clone(), stop, th }
}

/// The next message from the server, or the reason it disconnected.
fn next(fd: &OwnedFd) -> Result<Msg, String> {
    let t = Instant::now();
    loop {
        match sock::recv(fd).unwrap() {
            Recv::Msg { buf, .. } => {
                return match Msg::decode(&buf).unwrap() {
                    Msg::Disconnect { reason, .. } => Err(reason),
                    m => Ok(m),
                }
            }
            Recv::Closed => return Err("closed".into()),
            Recv::WouldBlock => {
                assert!(t.elapsed() < Duration::from_secs(10), "no answer");
                sock::wait_readable(fd.as_raw_fd(), 100);
            }
        }
    }
}

fn send(fd: &OwnedFd, m: &Msg, attach: Option<i32>) {
    sock::send(fd, &m.encode(), attach).unwrap();
}

fn eventfd() -> OwnedFd {
    // SAFETY: a fresh eventfd.
    unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) }
}

fn init() -> Msg {
    Msg::Init(Init { version: proto::VERSION, id: 0, mode: 0, secret: vec![], name: "hostile".into() })
}

/// Connects, reads HELLO, and runs `steps`; returns the server's reason for disconnecting.
fn refused(srv: &Srv, steps: impl FnOnce(&OwnedFd) -> Result<(), String>) -> String {
    let fd = sock::connect(&srv.addr).unwrap();
    assert!(matches!(next(&fd), Ok(Msg::Hello(_))));
    match steps(&fd) {
        Err(why) => why,
        Ok(()) => next(&fd).err().unwrap_or_else(|| "accepted".into()),
    }
}

fn ack(fd: &OwnedFd) -> Result<(), String> {
    match next(fd)? {
        Msg::Ack => Ok(()),
        m => Err(format!("{} instead of ACK", m.name())),
    }
}

#[test]
fn broken_handshakes_are_refused_with_a_reason_and_the_server_carries_on() {
    let srv = serve("hs");
    let region = Region::create("good", 1 << 20, false).unwrap();
    Ring::new(&region, 0, 8).unwrap().init();
    Ring::new(&region, 8192, 8).unwrap().init();
    let rfd = || region.fd();
    type Steps<'a> = Box<dyn FnOnce(&OwnedFd) -> Result<(), String> + 'a>;
    let cases: Vec<(&str, Steps)> = vec![
        (
            "Invalid message size",
            Box::new(|fd| {
                // SAFETY: a 64-byte datagram on a valid socket.
                unsafe { libc::send(fd.as_raw_fd(), [3u8; 64].as_ptr().cast(), 64, 0) };
                Ok(())
            }),
        ),
        (
            "Unknown message type",
            Box::new(|fd| {
                let mut b = [0u8; 128];
                b[0] = 99;
                sock::send(fd, &b, None).unwrap();
                Ok(())
            }),
        ),
        (
            "Unexpected message ADD_REGION",
            Box::new(|fd| {
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 4096 }), Some(region.fd()));
                Ok(())
            }),
        ),
        (
            "Incompatible memif version",
            Box::new(|fd| {
                send(fd, &Msg::Init(Init { version: 0x0100, id: 0, mode: 0, secret: vec![], name: "x".into() }), None);
                Ok(())
            }),
        ),
        (
            "Missing region fd",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 4096 }), None);
                Ok(())
            }),
        ),
        (
            "smaller than the",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 30 }), Some(rfd()));
                Ok(())
            }),
        ),
        (
            "Invalid region index",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 3, size: 4096 }), Some(rfd()));
                Ok(())
            }),
        ),
        (
            "not sealed against shrinking",
            Box::new(|fd| {
                // SAFETY: creating a memfd we own.
                let m = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"unsealed".as_ptr(), 0)) };
                // SAFETY: a valid descriptor.
                unsafe { libc::ftruncate(m.as_raw_fd(), 1 << 20) };
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(m.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "smaller than the",
            Box::new(|fd| {
                // A character device (/dev/zero) is not a file to map.
                let z = std::fs::File::open("/dev/zero").unwrap();
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 4096 }), Some(z.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "Interrupt fd is not an eventfd",
            Box::new(|fd| {
                let mut p = [0i32; 2];
                // SAFETY: creating a pipe (a blocking fd we could hang on if we wrote to it).
                unsafe { libc::pipe(p.as_mut_ptr()) };
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(rfd()));
                ack(fd)?;
                send(fd, &Msg::AddRing(AddRing { flags: 1, index: 0, region: 0, offset: 0, log2_size: 8, private_hdr_size: 0 }), Some(p[1]));
                // SAFETY: closing our pipe ends.
                unsafe {
                    libc::close(p[0]);
                    libc::close(p[1]);
                }
                Ok(())
            }),
        ),
        (
            "does not fit its region",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(rfd()));
                ack(fd)?;
                let e = eventfd();
                send(fd, &Msg::AddRing(AddRing { flags: 1, index: 0, region: 0, offset: (1 << 20) - 64, log2_size: 8, private_hdr_size: 0 }), Some(e.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "Invalid ring size 2^15",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(rfd()));
                ack(fd)?;
                let e = eventfd();
                send(fd, &Msg::AddRing(AddRing { flags: 1, index: 0, region: 0, offset: 0, log2_size: 15, private_hdr_size: 0 }), Some(e.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "Invalid ring region",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(rfd()));
                ack(fd)?;
                let e = eventfd();
                send(fd, &Msg::AddRing(AddRing { flags: 1, index: 0, region: 7, offset: 0, log2_size: 8, private_hdr_size: 0 }), Some(e.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "Invalid ring index",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(rfd()));
                ack(fd)?;
                let e = eventfd();
                send(fd, &Msg::AddRing(AddRing { flags: 1, index: 40, region: 0, offset: 0, log2_size: 8, private_hdr_size: 0 }), Some(e.as_raw_fd()));
                Ok(())
            }),
        ),
        (
            "No client-to-server ring",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::Connect { if_name: "x".into() }, None);
                Ok(())
            }),
        ),
        (
            "Wrong ring",
            Box::new(|fd| {
                let bad = Region::create("bad cookie", 1 << 20, false).unwrap();
                send(fd, &init(), None);
                ack(fd)?;
                send(fd, &Msg::AddRegion(AddRegion { index: 0, size: 1 << 20 }), Some(bad.fd()));
                ack(fd)?;
                for (flags, off) in [(1, 0), (0, 8192)] {
                    let e = eventfd();
                    send(fd, &Msg::AddRing(AddRing { flags, index: 0, region: 0, offset: off, log2_size: 8, private_hdr_size: 0 }), Some(e.as_raw_fd()));
                    ack(fd)?;
                }
                send(fd, &Msg::Connect { if_name: "x".into() }, None);
                Ok(())
            }),
        ),
        (
            "Unexpected message HELLO",
            Box::new(|fd| {
                send(fd, &init(), None);
                ack(fd)?;
                send(
                    fd,
                    &Msg::Hello(proto::Hello { name: "x".into(), min_version: 0, max_version: 0, max_region: 0, max_s2c_ring: 0, max_c2s_ring: 0, max_log2_ring_size: 0 }),
                    None,
                );
                Ok(())
            }),
        ),
    ];
    for (want, steps) in cases {
        let why = refused(&srv, steps);
        assert!(why.contains(want), "want `{want}`, got `{why}`");
    }
    assert!(!srv.link.is_up());
    // The interface is free again, and an honest client gets through.
    let _c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
    until("up", || srv.link.is_up());
}

#[test]
fn idle_connections_cannot_lock_the_interface() {
    let srv = serve("idle");
    // Connections that say nothing: at most 16 wait for their handshake; the rest are told.
    let mut idle = Vec::new();
    for _ in 0..16 {
        let fd = sock::connect(&srv.addr).unwrap();
        assert!(matches!(next(&fd), Ok(Msg::Hello(_))));
        idle.push(fd);
    }
    let fd = sock::connect(&srv.addr).unwrap();
    assert_eq!(next(&fd).unwrap_err(), "Too many pending connections");
    // Within the handshake deadline they are dropped, and an honest client connects.
    for fd in &idle {
        assert_eq!(next(fd).unwrap_err(), "Handshake timeout");
    }
    let _c = Client::connect(&srv.addr, &ClientConfig::default()).unwrap();
    until("up", || srv.link.is_up());
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8) ^ seed).collect()
}

#[test]
fn descriptors_outside_the_memory_are_counted_and_never_followed() {
    let srv = serve("desc");
    let c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
    until("up", || srv.link.is_up());
    let pool = Pool::new(128, 2048);
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut rx = ServerRx::new(srv.link.clone(), 0, 0, pool.clone(), copier.clone(), 2048);
    let mut tx = ServerTx::new(srv.link.clone(), 0, copier.clone());
    let conn = c.connection().clone();
    let c2s = conn.c2s[0].ring;
    let region_len = conn.regions[0].len() as u32;
    // Client-to-server: bad descriptors posted directly, then one honest frame.
    let bad = [
        Desc { flags: 0, region: 0, length: 64, offset: region_len, metadata: 0 },
        Desc { flags: 0, region: 0, length: 64, offset: region_len - 32, metadata: 0 },
        Desc { flags: 0, region: 0, length: u32::MAX, offset: 0, metadata: 0 },
        Desc { flags: 0, region: 5, length: 64, offset: 0, metadata: 0 },
        Desc { flags: 0, region: u16::MAX, length: 64, offset: 0, metadata: 0 },
        Desc { flags: 0, region: 0, length: 0x20, offset: u32::MAX - 0x10, metadata: 0 },
    ];
    for (i, d) in bad.iter().enumerate() {
        c2s.set_desc(i as u16, *d);
    }
    // A chain longer than the server follows (100 buffers of 64 bytes).
    for i in 0..100u16 {
        c2s.set_desc(6 + i, Desc { flags: if i < 99 { DESC_FLAG_NEXT } else { 0 }, region: 0, length: 64, offset: 0, metadata: 0 });
    }
    c2s.set_head(106);
    let mut got = Vec::new();
    until("bad ones consumed", || {
        rx.recv(&mut got, 256);
        c2s.tail() == 106
    });
    assert!(got.is_empty(), "nothing delivered from bad descriptors");
    let s = srv.link.queues[0].snapshot();
    assert_eq!(s.bad_desc, 7, "{s:?}");
    // The client's pool bookkeeping no longer matches what we posted by hand: use a fresh
    // client for the honest frame and the server-to-client attacks.
    drop(c);
    until("down", || !srv.link.is_up());
    let mut c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
    until("up again", || srv.link.is_up());
    assert!(c.queues[0].send_copy(&frame(300, 1)));
    let mut got = Vec::new();
    until("honest frame", || {
        rx.recv(&mut got, 256);
        !got.is_empty()
    });
    assert_eq!(got[0].data(), &frame(300, 1)[..]);
    drop(got);

    // Server-to-client: the client posts buffers outside its region, of absurd sizes.
    let conn = c.connection().clone();
    let s2c = conn.s2c[0].ring;
    let region_len = conn.regions[0].len() as u32;
    let base = s2c.head();
    let posted = [
        Desc { flags: 0, region: 0, length: 2048, offset: region_len, metadata: 0 },
        Desc { flags: 0, region: 0, length: u32::MAX, offset: 4096, metadata: 0 },
        Desc { flags: 0, region: 9, length: 2048, offset: 0, metadata: 0 },
        Desc { flags: 0, region: 0, length: 0, offset: 4096, metadata: 0 },
    ];
    // Overwrite the first posted (not yet used) slots.
    let tail = s2c.tail();
    for (i, d) in posted.iter().enumerate() {
        s2c.set_desc(tail.wrapping_add(i as u16), *d);
    }
    let mut pkts = vec![pool.alloc_frame(0, &frame(1000, 2)).unwrap()];
    assert_eq!(tx.send(&mut pkts), 1);
    let s = srv.link.queues[0].snapshot();
    assert_eq!(s.bad_desc, 7 + 4, "four bad buffers skipped: {s:?}");
    assert_eq!(s2c.tail(), tail.wrapping_add(5), "the frame went into the fifth");
    assert_eq!(s2c.head(), base);
    drop((rx, tx)); // the receive queue keeps spare buffers
    assert_eq!(pool.stats().in_use(), 0);
}

#[test]
fn descriptors_rewritten_while_the_server_reads_them() {
    let srv = serve("race");
    let c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
    until("up", || srv.link.is_up());
    let pool = Pool::new(128, 2048);
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut rx = ServerRx::new(srv.link.clone(), 0, 0, pool.clone(), copier.clone(), 2048);
    let conn = c.connection().clone();
    let region_len = conn.regions[0].len() as u32;
    let stop = Arc::new(AtomicBool::new(false));
    // A thread scribbles every descriptor with random values, and keeps moving head a ring
    // ahead of tail, as fast as it can.
    let scribbler = {
        let conn = conn.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ring = conn.c2s[0].ring;
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            while !stop.load(Ordering::Relaxed) {
                for slot in 0..256u16 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let d = Desc {
                        flags: (x & 1) as u16,
                        region: ((x >> 8) & 3) as u16,
                        length: (x >> 16) as u32 % (region_len * 2),
                        offset: (x >> 40) as u32 % (region_len + 4096),
                        metadata: 0,
                    };
                    ring.set_desc(slot, d);
                }
                ring.set_head(ring.tail().wrapping_add(256));
            }
        })
    };
    let t = Instant::now();
    let mut frames = 0;
    while t.elapsed() < Duration::from_secs(2) {
        let mut got = Vec::new();
        rx.recv(&mut got, 256);
        for p in &got {
            assert!(p.data().len() <= 2048);
        }
        frames += got.len();
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    let s = srv.link.queues[0].snapshot();
    assert!(s.bad_desc > 0, "{s:?}");
    eprintln!("descriptor race: {frames} frames delivered, {s:?}");
    drop(rx); // it keeps spare buffers
    assert_eq!(pool.stats().in_use(), 0);
}

#[test]
fn a_ring_head_that_jumps_ends_the_connection() {
    for c2s in [true, false] {
        let srv = serve(if c2s { "jump-c2s" } else { "jump-s2c" });
        let c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
        until("up", || srv.link.is_up());
        let pool = Pool::default();
        let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
        let mut rx = ServerRx::new(srv.link.clone(), 0, 0, pool.clone(), copier.clone(), 2048);
        let mut tx = ServerTx::new(srv.link.clone(), 0, copier.clone());
        let conn = c.connection().clone();
        let ring = if c2s { conn.c2s[0].ring } else { conn.s2c[0].ring };
        ring.set_head(ring.tail().wrapping_add(5000));
        if c2s {
            assert_eq!(rx.recv(&mut Vec::new(), 64), 0);
        } else {
            let mut pkts = vec![pool.alloc_frame(0, &frame(64, 0)).unwrap()];
            assert_eq!(tx.send(&mut pkts), 0);
        }
        until("disconnected", || !srv.link.is_up());
        let st = srv.link.state();
        assert!(st.last_reason.contains("slots ahead"), "{}", st.last_reason);
        assert_eq!(srv.link.queues[0].snapshot().bad_ring, 1);
        assert!(c.check().is_err(), "the client was told");
        // Nothing more from that connection, and the next client works.
        assert_eq!(rx.recv(&mut Vec::new(), 64), 0);
        drop(c);
        let mut c = Client::connect(&srv.addr, &ClientConfig { log2_ring: 8, ..Default::default() }).unwrap();
        until("up again", || srv.link.is_up());
        assert!(c.queues[0].send_copy(&frame(64, 3)));
        let mut got = Vec::new();
        until("frame", || {
            rx.recv(&mut got, 64);
            !got.is_empty()
        });
        assert_eq!(got[0].data(), &frame(64, 3)[..]);
    }
}

#[test]
fn a_sealed_region_cannot_be_shrunk_under_the_server() {
    let srv = serve("shrink");
    let c = Client::connect(&srv.addr, &ClientConfig::default()).unwrap();
    until("up", || srv.link.is_up());
    let fd = c.connection().regions[0].fd();
    // SAFETY: a valid descriptor; the seal makes this fail.
    let r = unsafe { libc::ftruncate(fd, 4096) };
    assert_ne!(r, 0, "F_SEAL_SHRINK holds");
    let _ = ring_len(1);
}
