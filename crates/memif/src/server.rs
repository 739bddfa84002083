//! The server role: listen on a control socket, take clients through the handshake, map what
//! they share after checking it, and publish the connection to the interface's queues.
//!
//! One [`Server`] serves every interface on one socket (told apart by `id`). It is driven by
//! [`Server::poll`], from a control thread ([`Server::spawn`]); workers never block on it. A
//! client is untrusted: every message is checked, any violation ends its connection with a
//! DISCONNECT giving the reason (DPDK's reason strings where DPDK has one), a handshake must
//! finish within [`HANDSHAKE_TIMEOUT`], and at most [`MAX_PENDING`] handshakes run at once.

use crate::conn::{Connection, Link, RingHandle};
use crate::proto::{self, AddRing, Hello, Init, Mode, Msg, MSG_LEN};
use crate::region::{Region, MAX_REGION};
use crate::ring::{Ring, RING_FLAG_MASK_INT};
use crate::sock::{self, Recv, SocketAddr};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client has this long from connecting to CONNECT.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; further connections are refused.
pub const MAX_PENDING: usize = 16;

/// One interface a server offers.
#[derive(Debug, Clone)]
pub struct InterfaceConfig {
    pub id: u32,
    /// Our name, sent in HELLO and CONNECTED.
    pub name: String,
    /// The shared secret a client must present (at most 23 bytes).
    pub secret: Option<Vec<u8>>,
    pub mode: Mode,
    /// Queue pairs: the most rings per direction a client may add.
    pub queues: u16,
    /// The largest ring a client may add, log2 of its slots (≤ 14).
    pub max_log2_ring: u8,
    /// The most regions a client may add.
    pub max_regions: u16,
    /// Map regions that are not sealed against shrinking (only for a peer that is trusted).
    pub trust_unsealed: bool,
}

impl Default for InterfaceConfig {
    fn default() -> Self {
        InterfaceConfig {
            id: 0,
            name: "vectorlb".into(),
            secret: None,
            mode: Mode::Ethernet,
            queues: 1,
            max_log2_ring: proto::MAX_LOG2_RING,
            max_regions: 64,
            trust_unsealed: false,
        }
    }
}

struct Iface {
    cfg: InterfaceConfig,
    link: Arc<Link>,
    /// The control socket of the connected (or connecting) client.
    busy: bool,
}

/// Where a client is in the handshake.
enum Stage {
    /// HELLO sent; INIT expected.
    Hello,
    /// INIT accepted for interface `id`; regions and rings, then CONNECT.
    Setup { id: u32, peer: String, regions: Vec<Region>, c2s: Vec<Option<RingHandle>>, s2c: Vec<Option<RingHandle>> },
    /// CONNECTED sent.
    Connected,
}

struct Client {
    fd: OwnedFd,
    stage: Stage,
    /// The interface this client's INIT claimed (released when the client goes).
    claimed: Option<u32>,
    connected: bool,
    since: Instant,
    pid: Option<i32>,
}

/// Ends a client's connection: the reason goes to the peer (DISCONNECT) and the log.
struct Refuse(String);

fn refuse<T>(why: impl Into<String>) -> Result<T, Refuse> {
    Err(Refuse(why.into()))
}

/// A memif server on one control socket.
pub struct Server {
    addr: SocketAddr,
    listener: OwnedFd,
    ifaces: HashMap<u32, Iface>,
    clients: Vec<Client>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for i in self.ifaces.values() {
            i.link.withdraw("the server stopped");
        }
        if let SocketAddr::Path(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("memif socket {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("memif interface id {0} is configured twice on one socket")]
    DuplicateId(u32),
    #[error("memif interface {id}: {why}")]
    Config { id: u32, why: String },
}

/// Whether `fd` is an eventfd (a ring's interrupt descriptor must be one: we write to it).
fn is_eventfd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

impl Server {
    /// Listens on `addr` (a path socket gets `mode`) for the given interfaces; returns the
    /// server and each interface's link, in the order given.
    pub fn bind(addr: &SocketAddr, mode: u32, ifaces: Vec<InterfaceConfig>) -> Result<(Server, Vec<Arc<Link>>), ServerError> {
        let mut map = HashMap::new();
        let mut links = Vec::new();
        for cfg in ifaces {
            let id = cfg.id;
            if cfg.queues == 0 || cfg.queues > 256 {
                return Err(ServerError::Config { id, why: format!("queues {} is outside 1..=256", cfg.queues) });
            }
            if !(1..=proto::MAX_LOG2_RING).contains(&cfg.max_log2_ring) {
                return Err(ServerError::Config { id, why: format!("ring size 2^{} is outside 2^1..=2^14", cfg.max_log2_ring) });
            }
            if cfg.secret.as_ref().is_some_and(|s| s.is_empty() || s.len() >= proto::SECRET_LEN || s.contains(&0)) {
                return Err(ServerError::Config { id, why: "the secret must be 1..=23 bytes without NUL".into() });
            }
            let link = Link::new(cfg.queues as usize);
            links.push(link.clone());
            if map.insert(id, Iface { cfg, link, busy: false }).is_some() {
                return Err(ServerError::DuplicateId(id));
            }
        }
        let listener = sock::listen(addr, mode).map_err(|source| ServerError::Listen { addr: addr.to_string(), source })?;
        Ok((Server { addr: addr.clone(), listener, ifaces: map, clients: Vec::new() }, links))
    }

    pub fn addr(&self) -> &SocketAddr {
        &self.addr
    }

    /// Runs the server in a thread until `stop` is set; polls every `tick`.
    pub fn spawn(mut self, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("memif-ctl".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                self.poll(Duration::from_millis(50));
            }
        })
    }

    /// Waits up to `timeout` for control traffic and handles all of it.
    pub fn poll(&mut self, timeout: Duration) {
        let mut fds = vec![libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        fds.extend(self.clients.iter().map(|c| libc::pollfd { fd: c.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
        // SAFETY: a valid array of pollfd of the given length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis() as i32) };
        if fds[0].revents != 0 {
            self.accept_all();
        }
        let mut i = 0;
        while i < self.clients.len() {
            match self.service(i) {
                Ok(()) => i += 1,
                Err(Refuse(why)) => self.drop_client(i, &why, true),
            }
        }
        // Faults the queues reported: disconnect those peers.
        let faulted: Vec<(u32, String)> = self.ifaces.iter().filter_map(|(id, f)| f.link.take_fault().map(|w| (*id, w))).collect();
        for (id, why) in faulted {
            if let Some(i) = self.clients.iter().position(|c| c.connected && c.claimed == Some(id)) {
                self.drop_client(i, &why, true);
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match sock::accept(&self.listener) {
                Ok(Some(fd)) => {
                    let pending = self.clients.iter().filter(|c| !c.connected).count();
                    if pending >= MAX_PENDING {
                        let _ = sock::send(&fd, &Msg::Disconnect { code: 0, reason: "Too many pending connections".into() }.encode(), None);
                        tracing::warn!("memif {}: refused a connection: {MAX_PENDING} handshakes already running", self.addr);
                        continue;
                    }
                    let pid = sock::peer_cred(&fd).map(|(p, _)| p);
                    let max_q = self.ifaces.values().map(|i| i.cfg.queues).max().unwrap_or(1);
                    let max_log2 = self.ifaces.values().map(|i| i.cfg.max_log2_ring).max().unwrap_or(10);
                    let max_regions = self.ifaces.values().map(|i| i.cfg.max_regions).max().unwrap_or(1);
                    let hello = Msg::Hello(Hello {
                        name: "vectorlb".into(),
                        min_version: proto::VERSION,
                        max_version: proto::VERSION,
                        max_region: max_regions.saturating_sub(1),
                        max_s2c_ring: max_q - 1,
                        max_c2s_ring: max_q - 1,
                        max_log2_ring_size: max_log2,
                    });
                    if sock::send(&fd, &hello.encode(), None).is_ok() {
                        self.clients.push(Client { fd, stage: Stage::Hello, claimed: None, connected: false, since: Instant::now(), pid });
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("memif {}: accept: {e}", self.addr);
                    return;
                }
            }
        }
    }

    fn drop_client(&mut self, i: usize, why: &str, tell: bool) {
        let c = self.clients.swap_remove(i);
        if tell {
            let _ = sock::send(&c.fd, &Msg::Disconnect { code: 0, reason: why.into() }.encode(), None);
        }
        match c.claimed.and_then(|id| self.ifaces.get_mut(&id)) {
            Some(f) => {
                f.busy = false;
                if c.connected {
                    tracing::info!("memif {} id {}: disconnected: {why}", self.addr, f.cfg.id);
                    f.link.withdraw(why);
                } else {
                    tracing::warn!("memif {} id {}: handshake refused: {why}", self.addr, f.cfg.id);
                    f.link.note(why);
                }
            }
            None => tracing::warn!("memif {}: connection refused: {why}", self.addr),
        }
    }

    /// Reads and handles every message waiting on client `i`; Err ends the client (with
    /// the reason sent), and a client that closed is removed here.
    fn service(&mut self, i: usize) -> Result<(), Refuse> {
        if !self.clients[i].connected && self.clients[i].since.elapsed() > HANDSHAKE_TIMEOUT {
            return refuse("Handshake timeout");
        }
        loop {
            let (buf, len, fd) = match sock::recv(&self.clients[i].fd) {
                Ok(Recv::Msg { buf, len, fd }) => (buf, len, fd),
                Ok(Recv::WouldBlock) => return Ok(()),
                Ok(Recv::Closed) => {
                    // Nobody to tell. The slot now holds another client (or none), which the
                    // caller's loop services next.
                    self.drop_client(i, "the peer closed the connection", false);
                    return Ok(());
                }
                Err(e) => return refuse(format!("Control socket error: {e}")),
            };
            if len != MSG_LEN {
                return refuse("Invalid message size");
            }
            let msg = match Msg::decode(&buf) {
                Ok(m) => m,
                Err(_) => return refuse("Unknown message type"),
            };
            if let Msg::Disconnect { reason, .. } = &msg {
                let why = format!("the peer disconnected: {reason}");
                self.drop_client(i, &why, false);
                return Ok(());
            }
            self.handle(i, msg, fd)?;
        }
    }

    fn handle(&mut self, i: usize, msg: Msg, fd: Option<OwnedFd>) -> Result<(), Refuse> {
        let pid = self.clients[i].pid;
        let stage = std::mem::replace(&mut self.clients[i].stage, Stage::Hello);
        let next = match (stage, msg) {
            (Stage::Hello, Msg::Init(init)) => {
                let id = self.accept_init(&init)?;
                self.clients[i].claimed = Some(id);
                self.reply(i, Msg::Ack)?;
                let q = self.ifaces[&id].cfg.queues as usize;
                Stage::Setup { id, peer: init.name, regions: Vec::new(), c2s: (0..q).map(|_| None).collect(), s2c: (0..q).map(|_| None).collect() }
            }
            (Stage::Setup { id, peer, mut regions, c2s, s2c }, Msg::AddRegion(r)) => {
                let cfg = &self.ifaces[&id].cfg;
                let Some(fd) = fd else { return refuse("Missing region fd") };
                if r.index as usize != regions.len() || r.index >= cfg.max_regions {
                    return refuse("Invalid region index");
                }
                if r.size == 0 || r.size > MAX_REGION {
                    return refuse(format!("Invalid region size {}", r.size));
                }
                match Region::from_peer(fd, r.size, cfg.trust_unsealed) {
                    Ok(region) => regions.push(region),
                    Err(e) => return refuse(format!("Region {}: {e}", r.index)),
                }
                self.reply(i, Msg::Ack)?;
                Stage::Setup { id, peer, regions, c2s, s2c }
            }
            (Stage::Setup { id, peer, regions, mut c2s, mut s2c }, Msg::AddRing(r)) => {
                let Some(fd) = fd else { return refuse("Missing interrupt fd") };
                let h = self.check_ring(id, &regions, &r, fd)?;
                let list = if r.c2s() { &mut c2s } else { &mut s2c };
                match list.get_mut(r.index as usize) {
                    Some(slot @ None) => *slot = Some(h),
                    Some(Some(_)) => return refuse("Duplicate ring index"),
                    None => return refuse("Invalid ring index"),
                }
                self.reply(i, Msg::Ack)?;
                Stage::Setup { id, peer, regions, c2s, s2c }
            }
            (Stage::Setup { id, peer, regions, c2s, s2c }, Msg::Connect { if_name }) => {
                let conn = Self::assemble(peer, regions, c2s, s2c)?;
                let name = self.ifaces[&id].cfg.name.clone();
                self.reply(i, Msg::Connected { if_name: name })?;
                tracing::info!(
                    "memif {} id {id}: connected to '{}' ({if_name}, pid {}): {} + {} rings of {} slots, {} region(s)",
                    self.addr,
                    conn.peer,
                    pid.map_or("?".into(), |p| p.to_string()),
                    conn.c2s.len(),
                    conn.s2c.len(),
                    conn.c2s.first().map_or(0, |r| r.ring.size()),
                    conn.regions.len()
                );
                self.ifaces[&id].link.publish(Arc::new(conn), pid);
                self.clients[i].connected = true;
                Stage::Connected
            }
            (_, m) => return refuse(format!("Unexpected message {}", m.name())),
        };
        self.clients[i].stage = next;
        Ok(())
    }

    fn reply(&self, i: usize, m: Msg) -> Result<(), Refuse> {
        sock::send(&self.clients[i].fd, &m.encode(), None).map_err(|e| Refuse(format!("Control socket error: {e}")))
    }

    fn accept_init(&mut self, init: &Init) -> Result<u32, Refuse> {
        if init.version != proto::VERSION {
            return refuse("Incompatible memif version");
        }
        let Some(f) = self.ifaces.get_mut(&init.id) else { return refuse("ID not found") };
        let r = Self::check_init(f, init);
        if let Err(Refuse(why)) = &r {
            f.link.note(why);
        }
        r
    }

    fn check_init(f: &mut Iface, init: &Init) -> Result<u32, Refuse> {
        if f.busy {
            return refuse("Already connected");
        }
        match Mode::from_u8(init.mode) {
            Some(m) if m == f.cfg.mode => {}
            Some(m) => return refuse(format!("Mode mismatch: {} offered, {} configured", m.name(), f.cfg.mode.name())),
            None => return refuse(format!("Unknown mode {}", init.mode)),
        }
        if let Some(secret) = &f.cfg.secret {
            if init.secret.is_empty() {
                return refuse("Secret required");
            }
            // Compared in constant time: the secret is the only authentication there is.
            let mut diff = (secret.len() != init.secret.len()) as u8;
            for (i, b) in secret.iter().enumerate() {
                diff |= b ^ init.secret.get(i).copied().unwrap_or(0);
            }
            if diff != 0 {
                return refuse("Incorrect secret");
            }
        }
        f.busy = true;
        Ok(init.id)
    }

    fn check_ring(&self, id: u32, regions: &[Region], r: &AddRing, fd: OwnedFd) -> Result<RingHandle, Refuse> {
        let cfg = &self.ifaces[&id].cfg;
        if !is_eventfd(fd.as_raw_fd()) {
            return refuse("Interrupt fd is not an eventfd");
        }
        let _ = sock::set_nonblocking(&fd);
        if r.log2_size == 0 || r.log2_size > cfg.max_log2_ring {
            return refuse(format!("Invalid ring size 2^{}", r.log2_size));
        }
        if r.private_hdr_size != 0 {
            return refuse("Private headers not supported");
        }
        let Some(region) = regions.get(r.region as usize) else { return refuse("Invalid ring region") };
        let ring = Ring::new(region, r.offset as u64, r.log2_size).map_err(|e| Refuse(format!("Invalid ring: {e}")))?;
        Ok(RingHandle { ring, region: r.region, offset: r.offset, eventfd: fd })
    }

    /// The connection from what the client added: rings numbered from 0 without gaps, one
    /// size, cookies right; the indexes reset and interrupts masked on the rings we poll.
    fn assemble(peer: String, regions: Vec<Region>, c2s: Vec<Option<RingHandle>>, s2c: Vec<Option<RingHandle>>) -> Result<Connection, Refuse> {
        let take = |v: Vec<Option<RingHandle>>, what: &str| -> Result<Vec<RingHandle>, Refuse> {
            let n = v.iter().take_while(|r| r.is_some()).count();
            if n == 0 {
                return refuse(format!("No {what} ring"));
            }
            if v[n..].iter().any(Option::is_some) {
                return refuse(format!("{what} rings are not numbered from 0 without gaps"));
            }
            Ok(v.into_iter().take(n).map(|r| r.expect("counted")).collect())
        };
        let c2s = take(c2s, "client-to-server")?;
        let s2c = take(s2c, "server-to-client")?;
        for h in c2s.iter().chain(&s2c) {
            h.ring.check_cookie().map_err(|_| Refuse("Wrong ring".into()))?;
            h.ring.set_head(0);
            h.ring.set_tail(0);
        }
        for h in &c2s {
            h.ring.set_flags(RING_FLAG_MASK_INT);
        }
        Ok(Connection { c2s, s2c, regions, peer, buffer_size: 0 })
    }
}
