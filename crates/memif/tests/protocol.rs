//! Our client against our server, both in this process: the handshake, frames of every size
//! both ways over several queue pairs (chained buffers for jumbo frames), the secret, refusals,
//! reconnection, interrupt mode.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_io::mem::Pool;
use vectorlb_io::{Copier, Packet, PacketBuf, RxQueue, TxQueue};
use vectorlb_memif::*;

fn addr(tag: &str) -> SocketAddr {
    SocketAddr::parse(&format!("@vectorlb-memif-test-{tag}-{}", std::process::id())).unwrap()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Running {
    links: Vec<Arc<Link>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn serve(a: &SocketAddr, ifaces: Vec<InterfaceConfig>) -> Running {
    let (server, links) = Server::bind(a, 0o600, ifaces).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = Some(server.spawn(stop.clone()).unwrap());
    Running { links, stop, thread }
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn frames_of_every_size_cross_both_ways_on_every_queue() {
    let a = addr("sizes");
    let srv = serve(&a, vec![InterfaceConfig { id: 3, queues: 2, ..Default::default() }]);
    let cfg = ClientConfig { id: 3, queues: 2, log2_ring: 8, ..Default::default() };
    let mut client = Client::connect(&a, &cfg).unwrap();
    assert_eq!(client.queues.len(), 2);
    let link = srv.links[0].clone();
    until("link up", || link.is_up());
    let pool = Pool::new(128, 10240);
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    for q in 0..2u16 {
        let mut rx = ServerRx::new(link.clone(), q, 0, pool.clone(), copier.clone(), 9216);
        let mut tx = ServerTx::new(link.clone(), q, copier.clone());
        let sizes = [14usize, 60, 64, 1500, 2048, 2049, 4400, 9000];
        for (i, &n) in sizes.iter().enumerate() {
            assert!(client.queues[q as usize].send_copy(&frame(n, i as u8 + q as u8)), "send {n}");
        }
        let mut got = Vec::new();
        until("server receives", || {
            rx.recv(&mut got, 64);
            got.len() == sizes.len()
        });
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p.data(), &frame(sizes[i], i as u8 + q as u8)[..], "queue {q} frame {i} to the server");
        }
        // And back.
        assert_eq!(tx.send(&mut got), sizes.len());
        let mut back = Vec::new();
        let mut buf = Vec::new();
        until("client receives", || {
            client.queues[q as usize].recv_copy(64, &mut buf, |f| back.push(f.to_vec()));
            back.len() == sizes.len()
        });
        for (i, f) in back.iter().enumerate() {
            assert_eq!(f, &frame(sizes[i], i as u8 + q as u8), "queue {q} frame {i} to the client");
        }
        drop((rx, tx)); // the receive queue keeps spare buffers
        assert_eq!(pool.stats().in_use(), 0, "every server buffer returned");
    }
    let s = link.queues[1].snapshot();
    assert_eq!((s.rx_packets, s.tx_packets, s.bad_desc, s.bad_ring), (8, 8, 0, 0));
    assert_eq!(client.queues[0].bad, 0);
    // A frame larger than the server takes is dropped and counted, the next one passes.
    let mut rx = ServerRx::new(link.clone(), 0, 0, pool.clone(), copier.clone(), 1514);
    assert!(client.queues[0].send_copy(&frame(4000, 1)));
    assert!(client.queues[0].send_copy(&frame(100, 2)));
    let mut got = Vec::new();
    until("the small one", || {
        rx.recv(&mut got, 64);
        !got.is_empty()
    });
    assert_eq!(got[0].data(), &frame(100, 2)[..]);
    assert_eq!(link.queues[0].snapshot().too_long, 1);
}

#[test]
fn zero_copy_forwarding_returns_every_buffer() {
    let a = addr("zc");
    let srv = serve(&a, vec![InterfaceConfig { id: 0, ..Default::default() }]);
    let mut client = Client::connect(&a, &ClientConfig { log2_ring: 6, ..Default::default() }).unwrap();
    let link = srv.links[0].clone();
    until("link up", || link.is_up());
    let pool = Pool::default();
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut rx = ServerRx::new(link.clone(), 0, 0, pool.clone(), copier.clone(), 2048);
    let mut tx = ServerTx::new(link.clone(), 0, copier.clone());
    let q = &mut client.queues[0];
    let total = q.free_buffers() + 64; // what the ring holds posted
                                       // The server sends 1000 frames; the client forwards each buffer it receives back as is.
    let mut sent = 0;
    let mut returned = 0;
    let mut bufs = Vec::new();
    let mut pkts = Vec::new();
    let t = Instant::now();
    while returned < 1000 {
        assert!(t.elapsed() < Duration::from_secs(10));
        while sent < 1000 && pkts.len() < 32 {
            pkts.push(vectorlb_io::PacketPool::alloc_frame(&pool, 0, &frame(60, sent as u8)).unwrap());
            sent += 1;
        }
        tx.send(&mut pkts);
        q.recv(&mut bufs, 64);
        for b in bufs.iter_mut() {
            let d = q.data_mut(*b);
            d.swap(0, 6); // rewrite in place
        }
        q.send(&mut bufs);
        let mut got = Vec::new();
        rx.recv(&mut got, 64);
        for p in &got {
            assert_eq!(p.data()[6], frame(60, returned as u8)[0]);
            returned += 1;
        }
    }
    // Every client buffer is back in the pool or posted.
    until("buffers back", || {
        let mut none = Vec::new();
        q.recv(&mut none, 64);
        q.free_buffers() + 64 == total
    });
}

#[test]
fn secret_id_mode_and_one_client_per_interface() {
    let a = addr("refusals");
    let srv = serve(&a, vec![InterfaceConfig { id: 1, secret: Some(b"pod-secret".to_vec()), ..Default::default() }, InterfaceConfig { id: 2, ..Default::default() }]);
    let refused = |cfg: ClientConfig| match Client::connect(&a, &cfg) {
        Err(ClientError::Refused(why)) => why,
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(refused(ClientConfig { id: 1, ..Default::default() }), "Secret required");
    assert_eq!(refused(ClientConfig { id: 1, secret: Some(b"pod-secreT".to_vec()), ..Default::default() }), "Incorrect secret");
    assert_eq!(refused(ClientConfig { id: 1, secret: Some(b"pod-secret-longer".to_vec()), ..Default::default() }), "Incorrect secret");
    assert_eq!(refused(ClientConfig { id: 9, ..Default::default() }), "ID not found");
    assert!(refused(ClientConfig { id: 2, mode: Mode::Ip, ..Default::default() }).starts_with("Mode mismatch"));
    let c = Client::connect(&a, &ClientConfig { id: 1, secret: Some(b"pod-secret".to_vec()), ..Default::default() }).unwrap();
    assert_eq!(refused(ClientConfig { id: 1, secret: Some(b"pod-secret".to_vec()), ..Default::default() }), "Already connected");
    until("up", || srv.links[0].is_up());
    assert_eq!(srv.links[0].state().last_reason, "Already connected");
    // The client leaves; the interface takes the next one.
    c.disconnect("bye");
    until("down", || !srv.links[0].is_up());
    assert!(srv.links[0].state().last_reason.contains("bye"));
    let _c = Client::connect(&a, &ClientConfig { id: 1, secret: Some(b"pod-secret".to_vec()), ..Default::default() }).unwrap();
    until("up again", || srv.links[0].is_up());
    assert_eq!(srv.links[0].state().connects, 2);
}

#[test]
fn a_client_that_goes_away_is_replaced_and_traffic_resumes() {
    let a = addr("reconnect");
    let srv = serve(&a, vec![InterfaceConfig::default()]);
    let link = srv.links[0].clone();
    let pool = Pool::default();
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut rx = ServerRx::new(link.clone(), 0, 0, pool.clone(), copier.clone(), 2048);
    for round in 0..3u8 {
        let mut c = Client::connect(&a, &ClientConfig::default()).unwrap();
        until("up", || link.is_up());
        for i in 0..100u8 {
            assert!(c.queues[0].send_copy(&frame(64, i ^ round)));
        }
        let mut got = Vec::new();
        until("100 frames", || {
            rx.recv(&mut got, 256);
            got.len() == 100
        });
        assert_eq!(got[99].data(), &frame(64, 99 ^ round)[..]);
        drop(c); // no DISCONNECT: the socket just closes, as DPDK's client does
        until("down", || !link.is_up());
        let mut none = Vec::new();
        assert_eq!(rx.recv(&mut none, 64), 0, "nothing after the link went down");
    }
    assert_eq!(link.state().connects, 3);
    drop(rx);
    assert_eq!(pool.stats().in_use(), 0);
}

#[test]
fn interrupt_mode_wakes_the_client() {
    let a = addr("irq");
    let srv = serve(&a, vec![InterfaceConfig::default()]);
    let mut c = Client::connect(&a, &ClientConfig::default()).unwrap();
    let link = srv.links[0].clone();
    until("up", || link.is_up());
    let pool = Pool::default();
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut tx = ServerTx::new(link.clone(), 0, copier);
    let t = Instant::now();
    assert!(!c.queues[0].wait(100), "nothing to wake for");
    assert!(t.elapsed() >= Duration::from_millis(90));
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let mut p = vec![vectorlb_io::PacketPool::alloc_frame(&pool, 0, &frame(64, 0)).unwrap()];
        tx.send(&mut p);
    });
    let t = Instant::now();
    assert!(c.queues[0].wait(5000), "woken by the server's signal");
    assert!(t.elapsed() < Duration::from_millis(2000));
    sender.join().unwrap();
    let mut buf = Vec::new();
    assert_eq!(c.queues[0].recv_copy(8, &mut buf, |_| {}), 1);
}

#[test]
fn the_data_plane_as_client_reconnects_when_the_server_comes_back() {
    let a = addr("dpclient");
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ClientConfig { id: 5, queues: 2, log2_ring: 8, ..Default::default() };
    // The client starts first and keeps trying.
    let (clink, slots, th) = vectorlb_memif::clientport::spawn(a.clone(), cfg, stop.clone()).unwrap();
    let pool = Pool::new(128, 10240);
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut crx: Vec<_> = (0..2u16).map(|q| ClientRx::new(clink.clone(), slots[q as usize].clone(), q, 1, pool.clone(), copier.clone(), 9216)).collect();
    let mut ctx: Vec<_> = (0..2u16).map(|q| ClientTx::new(clink.clone(), slots[q as usize].clone(), q, copier.clone())).collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!clink.is_up());
    assert!(clink.state().last_reason.contains("connecting to"), "{}", clink.state().last_reason);
    for round in 0..2u8 {
        let srv = serve(&a, vec![InterfaceConfig { id: 5, queues: 2, ..Default::default() }]);
        let slink = srv.links[0].clone();
        until("both ends up", || clink.is_up() && slink.is_up());
        let spool = Pool::new(128, 10240);
        let scopier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
        for q in 0..2u16 {
            let mut srx = ServerRx::new(slink.clone(), q, 0, spool.clone(), scopier.clone(), 9216);
            let mut stx = ServerTx::new(slink.clone(), q, scopier.clone());
            // Client to server, then back, sizes up to a jumbo frame.
            let sizes = [60usize, 1500, 9000];
            let mut pkts: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| vectorlb_io::PacketPool::alloc_frame(&pool, 1, &frame(n, i as u8 ^ round)).unwrap()).collect();
            assert_eq!(ctx[q as usize].send(&mut pkts), 3);
            let mut got = Vec::new();
            until("server receives", || {
                srx.recv(&mut got, 64);
                got.len() == 3
            });
            for (i, p) in got.iter().enumerate() {
                assert_eq!(p.data(), &frame(sizes[i], i as u8 ^ round)[..]);
            }
            assert_eq!(stx.send(&mut got), 3);
            let mut back = Vec::new();
            until("client receives", || {
                crx[q as usize].recv(&mut back, 64);
                back.len() == 3
            });
            for (i, p) in back.iter().enumerate() {
                assert_eq!(p.data(), &frame(sizes[i], i as u8 ^ round)[..]);
                assert_eq!(p.meta().queue, q);
            }
        }
        drop(srv); // the server goes away; the client notices and tries again
        until("client down", || !clink.is_up());
    }
    assert_eq!(clink.state().connects, 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    th.join().unwrap();
    drop((crx, ctx));
    assert_eq!(pool.stats().in_use(), 0);
}

/// A server that moves a ring's tail past the buffers the client posted (DPDK 22.11's server
/// does, given more chained frames than its ring holds): the library says why instead of
/// going quiet, and the data plane's client port drops the connection and connects again.
#[test]
fn a_server_that_breaks_a_ring_is_left_and_reconnected() {
    let a = addr("broken");
    let srv = serve(&a, vec![InterfaceConfig { id: 6, ..Default::default() }]);
    let slink = srv.links[0].clone();
    // The library alone.
    let mut c = Client::connect(&a, &ClientConfig { id: 6, log2_ring: 6, ..Default::default() }).unwrap();
    until("server up", || slink.is_up());
    let s2c = &slink.connection().unwrap().s2c[0].ring;
    s2c.set_tail(s2c.head().wrapping_add(5));
    let mut got = Vec::new();
    assert_eq!(c.queues[0].recv(&mut got, 64), 0);
    let why = c.queues[0].broken().expect("the broken ring is reported").to_string();
    assert!(why.contains("server-to-client ring 0"), "{why}");
    drop(c);
    until("server down", || !slink.is_up());

    // The data plane as client.
    let stop = Arc::new(AtomicBool::new(false));
    let (clink, slots, th) = vectorlb_memif::clientport::spawn(a.clone(), ClientConfig { id: 6, ..Default::default() }, stop.clone()).unwrap();
    let pool = Pool::new(128, 4096);
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut crx = ClientRx::new(clink.clone(), slots[0].clone(), 0, 1, pool.clone(), copier, 2048);
    until("client up", || clink.is_up() && slink.is_up());
    let s2c = &slink.connection().unwrap().s2c[0].ring;
    s2c.set_tail(s2c.head().wrapping_add(7));
    let mut out = Vec::new();
    until("the client port leaves and comes back", || {
        crx.recv(&mut out, 64);
        clink.state().connects == 2 && clink.is_up()
    });
    assert!(clink.state().last_reason.contains("server-to-client ring 0"), "{}", clink.state().last_reason);
    assert_eq!(clink.queues[0].snapshot().bad_ring, 1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    th.join().unwrap();
    drop(crx);
    drop(srv);
}
