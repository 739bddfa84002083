//! Interoperability with a memif nobody here wrote: DPDK's `net_memif` in `dpdk-testpmd`
//! (io forwarding: every frame it receives goes back out unchanged), in both roles, two queue
//! pairs, with a secret, DPDK's zero-copy client, and a testpmd restart in the middle.
//!
//! Needs root, huge pages and dpdk-testpmd (scripts/setup.sh installs and reserves them). The
//! tests take turns: each testpmd busy-polls a core.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_io::mem::Pool;
use vectorlb_io::{Copier, PacketBuf, PacketPool, RxQueue, TxQueue};
use vectorlb_memif::*;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Testpmd {
    child: Child,
    log: PathBuf,
}

impl Testpmd {
    fn start(tag: &str, vdev: &str, eal: &[&str], app: &[&str]) -> Testpmd {
        let log = std::env::temp_dir().join(format!("vectorlb-testpmd-{tag}-{}.log", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("dpdk-testpmd")
            .args(["-l", "0,1", "--no-pci", "--log-level", "*:notice", "--vdev", vdev])
            .args(eal)
            .args(["--", "--forward-mode=io", "--stats-period=1", "--total-num-mbufs=8192", "--nb-cores=1"])
            .args(app)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("dpdk-testpmd: {e} (scripts/setup.sh installs it)"));
        Testpmd { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until testpmd forwards: it drains its receive queues when forwarding starts, and
    /// frames that arrive before would be eaten by that.
    fn wait_forwarding(&self) {
        let t = Instant::now();
        while !self.log().contains("forwards packets on") {
            assert!(t.elapsed() < Duration::from_secs(20), "testpmd does not start forwarding:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop_inner();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

fn until(what: &str, secs: u64, tp: &Testpmd, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}\ntestpmd log:\n{}", tp.log());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn frame(len: usize, q: u16, i: u32) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(7).wrapping_add(i as u8)).collect();
    f[0..2].copy_from_slice(&q.to_be_bytes());
    f[2..6].copy_from_slice(&i.to_be_bytes());
    f
}

fn sizes(i: u32) -> usize {
    [60, 64, 128, 512, 1000, 1514][i as usize % 6]
}

/// Sends `n` frames on each of `queues` queues through the server, and checks that each comes
/// back (testpmd forwards queue i to queue i) unchanged.
fn server_round(link: &Arc<Link>, queues: u16, n: u32, tp: &Testpmd) {
    let pool = Pool::default();
    let copier: SharedCopier = Arc::new(Mutex::new(Copier::cpu()));
    let mut got: BTreeMap<(u16, u32), Vec<u8>> = BTreeMap::new();
    let mut rxs: Vec<_> = (0..queues).map(|q| ServerRx::new(link.clone(), q, 0, pool.clone(), copier.clone(), 2048)).collect();
    let mut txs: Vec<_> = (0..queues).map(|q| ServerTx::<vectorlb_io::mem::MemPacket>::new(link.clone(), q, copier.clone())).collect();
    for (q, tx) in txs.iter_mut().enumerate() {
        let mut pkts: Vec<_> = (0..n).map(|i| pool.alloc_frame(0, &frame(sizes(i), q as u16, i)).unwrap()).collect();
        until("frames sent", 10, tp, || {
            tx.send(&mut pkts);
            pkts.is_empty()
        });
    }
    until("frames back", 15, tp, || {
        for (q, rx) in rxs.iter_mut().enumerate() {
            let mut v = Vec::new();
            rx.recv(&mut v, 256);
            for p in v {
                let d = p.data();
                let (fq, i) = (u16::from_be_bytes([d[0], d[1]]), u32::from_be_bytes([d[2], d[3], d[4], d[5]]));
                assert_eq!(fq as usize, q, "frame of queue {fq} came back on queue {q}");
                got.insert((fq, i), d.to_vec());
            }
        }
        got.len() == (queues as u32 * n) as usize
    });
    for ((q, i), d) in &got {
        assert_eq!(d, &frame(sizes(*i), *q, *i), "frame {i} of queue {q} changed");
    }
    drop((rxs, txs)); // receive queues keep spare buffers
    assert_eq!(pool.stats().in_use(), 0);
}

#[test]
fn our_server_with_testpmd_as_client_two_queues_secret_and_restart() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let name = format!("vectorlb-tp-srv-{}", std::process::id());
    let addr = SocketAddr::Abstract(name.as_bytes().to_vec());
    let iface = InterfaceConfig { id: 4, queues: 2, secret: Some(b"pod-secret".to_vec()), ..Default::default() };
    let (server, links) = Server::bind(&addr, 0o600, vec![iface]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let th = server.spawn(stop.clone()).unwrap();
    let link = links[0].clone();
    let vdev = format!("net_memif0,role=client,id=4,socket={name},socket-abstract=yes,secret=pod-secret,rsize=9");
    for round in 0..2 {
        let tp = Testpmd::start(&format!("c{round}"), &vdev, &["--in-memory"], &["--rxq=2", "--txq=2"]);
        until("testpmd connects", 20, &tp, || link.is_up());
        tp.wait_forwarding();
        let st = link.state();
        assert_eq!(st.rings, (2, 2), "two queue pairs");
        assert!(st.peer.starts_with("DPDK"), "{}", st.peer);
        server_round(&link, 2, 300, &tp);
        tp.stop();
        let t = Instant::now();
        while link.is_up() {
            assert!(t.elapsed() < Duration::from_secs(10), "the link goes down when testpmd leaves");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(link.state().connects, 2);
    let s = link.queues[0].snapshot();
    assert_eq!((s.bad_desc, s.bad_ring), (0, 0));
    // A wrong secret: testpmd is refused, and says so.
    let tp = Testpmd::start("bad", &vdev.replace("secret=pod-secret", "secret=wrong"), &["--in-memory"], &["--rxq=2", "--txq=2"]);
    until("refusal recorded", 20, &tp, || link.state().last_reason == "Incorrect secret");
    assert!(!link.is_up());
    tp.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    th.join().unwrap();
}

#[test]
fn our_server_with_dpdks_zero_copy_client() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // DPDK's zero-copy client shares its mbuf memory: huge page files, which cannot be sealed
    // against shrinking. Refused by default (the client could truncate them under us); taken
    // when the interface trusts its peer.
    for trust in [false, true] {
        let name = format!("vectorlb-tp-zc-{trust}-{}", std::process::id());
        let addr = SocketAddr::Abstract(name.as_bytes().to_vec());
        let (server, links) = Server::bind(&addr, 0o600, vec![InterfaceConfig { trust_unsealed: trust, ..Default::default() }]).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let th = server.spawn(stop.clone()).unwrap();
        let prefix = format!("vlzc{}", std::process::id());
        let vdev = format!("net_memif0,role=client,id=0,socket={name},zero-copy=yes");
        let tp = Testpmd::start("zc", &vdev, &["--single-file-segments", "--file-prefix", &prefix], &[]);
        if !trust {
            until("refused", 20, &tp, || !links[0].state().last_reason.is_empty());
            assert!(links[0].state().last_reason.contains("not sealed against shrinking"), "{}", links[0].state().last_reason);
            assert!(!links[0].is_up());
        } else {
            until("testpmd connects", 20, &tp, || links[0].is_up());
            tp.wait_forwarding();
            let conn = links[0].connection().unwrap();
            assert!(conn.regions.len() >= 2, "rings in region 0, mbufs in regions 1..: {}", conn.regions.len());
            drop(conn);
            server_round(&links[0], 1, 300, &tp);
        }
        tp.stop();
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{prefix}"));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        th.join().unwrap();
    }
}

#[test]
fn our_client_with_testpmd_as_server_two_queues_secret_and_restart() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let name = format!("vectorlb-tp-cli-{}", std::process::id());
    let addr = SocketAddr::Abstract(name.as_bytes().to_vec());
    let vdev = format!("net_memif0,role=server,id=2,socket={name},socket-abstract=yes,secret=s3cret");
    let cfg = ClientConfig { id: 2, queues: 2, log2_ring: 9, secret: Some(b"s3cret".to_vec()), ..Default::default() };
    for round in 0..2 {
        let tp = Testpmd::start(&format!("s{round}"), &vdev, &["--in-memory"], &["--rxq=2", "--txq=2"]);
        let mut client = None;
        until("connected to testpmd", 20, &tp, || {
            client = Client::connect(&addr, &cfg).ok();
            client.is_some()
        });
        let mut client = client.unwrap();
        tp.wait_forwarding();
        assert!(client.server_name.starts_with("DPDK"), "{}", client.server_name);
        assert_eq!(client.queues.len(), 2);
        let n = 300u32;
        let mut got: BTreeMap<(u16, u32), Vec<u8>> = BTreeMap::new();
        let mut next = [0u32; 2];
        let mut buf = Vec::new();
        until("frames back from testpmd", 20, &tp, || {
            for q in 0..2u16 {
                let cq = &mut client.queues[q as usize];
                while next[q as usize] < n && cq.send_copy(&frame(sizes(next[q as usize]), q, next[q as usize])) {
                    next[q as usize] += 1;
                }
                cq.recv_copy(256, &mut buf, |d| {
                    let (fq, i) = (u16::from_be_bytes([d[0], d[1]]), u32::from_be_bytes([d[2], d[3], d[4], d[5]]));
                    assert_eq!(fq, q);
                    got.insert((fq, i), d.to_vec());
                });
            }
            got.len() == 2 * n as usize
        });
        for ((q, i), d) in &got {
            assert_eq!(d, &frame(sizes(*i), *q, *i));
        }
        assert_eq!(client.queues[0].bad + client.queues[1].bad, 0);
        client.check().expect("still connected");
        tp.stop();
        let t = Instant::now();
        while client.check().is_ok() {
            assert!(t.elapsed() < Duration::from_secs(10), "the client notices testpmd left");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // A wrong secret is refused with DPDK's reason.
    let tp = Testpmd::start("sbad", &vdev, &["--in-memory"], &["--rxq=2", "--txq=2"]);
    let bad = ClientConfig { secret: Some(b"nope".to_vec()), ..cfg.clone() };
    let mut why = String::new();
    until("refused", 20, &tp, || match Client::connect(&addr, &bad) {
        // Until testpmd has started its port, it answers "ID not found".
        Err(ClientError::Refused(w)) if w != "ID not found" => {
            why = w;
            true
        }
        _ => false,
    });
    assert_eq!(why, "Incorrect secret");
    tp.stop();
}
