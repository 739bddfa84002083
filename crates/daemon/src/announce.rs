//! What this node announces by BGP, and when (docs/scale-out.md): a thread (`vlb-bgp`) that
//! owns BIRD ([`crate::bgp::Bird`]) and, ten times a second, announces every VIP that has a
//! service with a backend up while the data plane is healthy, and nothing while it is broken
//! or the node is drained (`vectorlb ctl drain`). With full-NAT services it also announces
//! this node's local addresses (the backends' replies come back to them; kept while a drain
//! lets flows finish) and, as backup routes with a longer AS path, the sync group's other
//! nodes' local addresses (this node serves their synchronised sessions if they go). A node of
//! a sync group announces nothing before it has the group's sessions. On SIGTERM it withdraws
//! everything and waits for the routers to hear it before the workers stop.

use crate::bgp::{Bird, Prefix, Routes, Session};
use crate::{lock, Daemon};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::{Duration, Instant};
use vectorlb_api::model::{BgpNeighborStatus, BgpStatus, DrainStatus};
use vectorlb_config::BgpSpec;
use vectorlb_lb::Snapshot;

/// How often the announced set is checked against the data plane.
pub const TICK: Duration = Duration::from_millis(100);
/// How often the sessions' states are read from BIRD.
pub const SESSIONS_EVERY: Duration = Duration::from_secs(1);
/// What a drain gives the flows when it names no deadline.
pub const DEFAULT_DRAIN_SECONDS: u32 = 300;
/// How long a BGP session must have stayed established before anything is announced after
/// BIRD starts (a session's first seconds may see it reset once, when the router's BFD comes
/// up after BGP: announcing then would make the routes appear, vanish and come back).
pub const SETTLE: Duration = Duration::from_secs(2);
/// The longest the announcements wait for [`SETTLE`] (a router without BFD, a slow peer).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(15);
/// How long a stopping daemon keeps serving after its withdrawal (the routers hear it and move
/// the flows before the workers stop).
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// The prefix that announces `vip`: the address alone.
pub fn prefix(vip: IpAddr) -> Prefix {
    (vip, if vip.is_ipv4() { 32 } else { 128 })
}

fn show((a, len): &Prefix) -> String {
    format!("{a}/{len}")
}

/// Where a drain is (`vectorlb ctl drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainState {
    Off,
    /// VIPs withdrawn, flows still served (local addresses kept).
    Draining,
    /// No session left, or the deadline passed: everything withdrawn (a full-NAT flow still
    /// alive is served by the peers that have it, through their backup routes).
    Drained,
}

/// What [`wanted`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub routes: Routes,
    /// Prefixes configured but not announced.
    pub withheld: BTreeSet<Prefix>,
    pub reasons: Vec<String>,
    /// Every VIP's prefix (announced or not).
    pub vips: BTreeSet<Prefix>,
}

/// What to announce: every VIP with at least one service that has a backend taking new
/// connections, unless the data plane has `problems`, the node is draining, or (a sync group's
/// node, `ready` false) it does not have the group's sessions yet; this node's full-NAT local
/// addresses on the same terms except a drain that is not over; the peers' local addresses
/// as backup routes unless draining. Also the prefixes withheld and the reasons.
pub fn wanted(snap: &Snapshot, problems: &[String], drain: DrainState, ready: bool) -> Wanted {
    let mut up: BTreeMap<Prefix, bool> = BTreeMap::new();
    let (mut own, mut peers) = (BTreeSet::new(), BTreeSet::new());
    for svc in snap.services() {
        *up.entry(prefix(svc.spec.vip)).or_default() |= svc.sched.has_eligible();
        own.extend(svc.spec.local_addrs.iter().map(|&a| prefix(a)));
        peers.extend(svc.spec.peer_local_addrs.iter().map(|&a| prefix(a)));
    }
    let vips: BTreeSet<Prefix> = up.keys().copied().collect();
    let all = || -> BTreeSet<Prefix> { vips.iter().chain(&own).chain(&peers).copied().collect() };
    let mut reasons = Vec::new();
    match drain {
        DrainState::Off => {}
        DrainState::Draining if !own.is_empty() => reasons.push("draining (vectorlb ctl drain): every VIP withdrawn; the local addresses stay until the drain ends".to_string()),
        _ => reasons.push("draining (vectorlb ctl drain): every VIP withdrawn".to_string()),
    }
    let mut blocked: Vec<String> = problems.iter().map(|p| format!("data plane: {p}")).collect();
    if !ready {
        blocked.push("waiting for the sync group's sessions (ha.group): a node announces once it has them".to_string());
    }
    if !blocked.is_empty() {
        reasons.extend(blocked);
        return Wanted { routes: Routes::default(), withheld: all(), reasons, vips };
    }
    let mut routes = Routes::default();
    let mut withheld = BTreeSet::new();
    if drain == DrainState::Off {
        for (p, ok) in up {
            if ok {
                routes.primary.insert(p);
            } else {
                reasons.push(format!("{}: no service on it has a backend up", show(&p)));
                withheld.insert(p);
            }
        }
        routes.backup = peers;
    } else {
        withheld.extend(vips.iter().copied());
        withheld.extend(peers);
    }
    if drain == DrainState::Drained {
        withheld.extend(own);
    } else {
        routes.primary.extend(own);
    }
    Wanted { routes, withheld, reasons, vips }
}

struct Drain {
    since: Instant,
    deadline: Instant,
}

#[derive(Default)]
struct Shared {
    bird_running: bool,
    restarts: u64,
    error: Option<String>,
    announced: Routes,
    withheld: BTreeSet<Prefix>,
    reasons: Vec<String>,
    /// Whether a VIP is among the announced prefixes.
    vips_announced: bool,
    sessions: Vec<Session>,
    changes: u64,
    drain: Option<Drain>,
    /// Live sessions of the node, read while draining.
    drain_sessions: u64,
}

/// The BGP speaker of a running daemon.
pub struct Announcer {
    spec: BgpSpec,
    shared: Mutex<Shared>,
    stop: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

impl Announcer {
    pub fn new(spec: &BgpSpec) -> Announcer {
        Announcer { spec: spec.clone(), shared: Mutex::default(), stop: AtomicBool::new(false), thread: Mutex::new(None) }
    }

    fn wake(&self) {
        if let Some(t) = lock(&self.thread).as_ref() {
            t.unpark();
        }
    }

    /// The speaker's loop, on its own thread, until [`Announcer::stop`]; then withdraws
    /// everything, waits [`STOP_GRACE`] and stops BIRD.
    pub fn run(&self, d: &Daemon, mut bird: Bird) {
        *lock(&self.thread) = Some(std::thread::current());
        let mut last_sessions: Option<Instant> = None;
        // Since when BIRD runs (this start), and since when a session is established.
        let (mut started, mut restarts, mut up_since): (Instant, u64, Option<Instant>) = (Instant::now(), bird.restarts, None);
        let mut settled = false;
        while !self.stop.load(Ordering::SeqCst) {
            let running = bird.supervise();
            if bird.restarts != restarts {
                (started, restarts, up_since, settled) = (Instant::now(), bird.restarts, None, false);
            }
            // While draining, the node's live sessions (a drain is over when none is left).
            if lock(&self.shared).drain.is_some() {
                let n = d.workers.totals().sessions as u64;
                lock(&self.shared).drain_sessions = n;
            }
            let drain = self.drain_state();
            let ready = d.sync.as_ref().is_none_or(|s| s.ready());
            let problems = d.problems();
            let Wanted { routes: mut want, mut withheld, mut reasons, vips } = wanted(&d.config.control.snapshot(), &problems, drain, ready);
            // The node's pod networks: announced while the data plane works, drained or not (a
            // drain moves the VIPs' traffic, not the pods').
            if let Some(pods) = d.config.pods.as_ref().filter(|_| problems.is_empty()) {
                want.primary.extend(pods.networks());
            }
            if !settled {
                settled = up_since.is_some_and(|t| t.elapsed() >= SETTLE) || started.elapsed() >= SETTLE_LIMIT;
                if !settled && !want.is_empty() {
                    let w = std::mem::take(&mut want);
                    withheld.extend(w.primary.into_iter().chain(w.backup));
                    reasons.push(format!("waiting for a BGP session to stay established for {SETTLE:?} (at most {SETTLE_LIMIT:?} after BIRD's start)"));
                }
            }
            let mut changed = false;
            let mut error = None;
            if want != *bird.announced() {
                match bird.announce(&want) {
                    Ok(()) => {
                        changed = true;
                        tracing::info!("bgp: announcing {:?}, backup {:?}", want.primary.iter().map(show).collect::<Vec<_>>(), want.backup.iter().map(show).collect::<Vec<_>>());
                    }
                    Err(e) => {
                        tracing::warn!(
                            "bgp: announcing {:?}, backup {:?}: {e}",
                            want.primary.iter().map(show).collect::<Vec<_>>(),
                            want.backup.iter().map(show).collect::<Vec<_>>()
                        );
                        error = Some(e.to_string());
                    }
                }
            }
            // Every tick until settled, then every SESSIONS_EVERY.
            let sessions = if changed || !settled || last_sessions.is_none_or(|t| t.elapsed() >= SESSIONS_EVERY) {
                last_sessions = Some(Instant::now());
                let v = bird.sessions();
                let any = v.iter().any(Session::established);
                up_since = if any { up_since.or(Some(Instant::now())) } else { None };
                Some(v)
            } else {
                None
            };
            {
                let mut s = lock(&self.shared);
                s.bird_running = running && bird.running();
                s.restarts = bird.restarts;
                s.error = error.or_else(|| bird.error.clone());
                s.announced = bird.announced().clone();
                s.vips_announced = s.announced.primary.iter().any(|p| vips.contains(p));
                s.withheld = withheld;
                s.reasons = reasons;
                s.changes += changed as u64;
                if let Some(v) = sessions {
                    s.sessions = v;
                }
            }
            std::thread::park_timeout(TICK);
        }
        bird.stop(STOP_GRACE);
        let mut s = lock(&self.shared);
        s.announced = Routes::default();
        s.vips_announced = false;
        s.bird_running = false;
    }

    fn drain_state(&self) -> DrainState {
        let s = lock(&self.shared);
        match &s.drain {
            None => DrainState::Off,
            Some(d) if s.drain_sessions == 0 || Instant::now() >= d.deadline => DrainState::Drained,
            Some(_) => DrainState::Draining,
        }
    }

    /// Asks the loop to withdraw and end (it returns from [`Announcer::run`]).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Starts a drain that gives the flows `deadline` seconds, or ends it.
    pub fn drain(&self, on: bool, deadline: Option<u32>) {
        {
            let mut s = lock(&self.shared);
            if on {
                let now = Instant::now();
                let since = s.drain.as_ref().map_or(now, |d| d.since);
                s.drain = Some(Drain { since, deadline: now + Duration::from_secs(deadline.unwrap_or(DEFAULT_DRAIN_SECONDS) as u64) });
            } else {
                s.drain = None;
            }
        }
        self.wake();
    }

    /// Waits (at most `limit`) until the loop has acted on the current drain state.
    pub fn settle(&self, limit: Duration) {
        let t = Instant::now();
        while t.elapsed() < limit {
            let s = lock(&self.shared);
            if s.drain.is_none() || !s.vips_announced {
                return;
            }
            drop(s);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// BIRD not running is a health problem (it is being restarted).
    pub fn problems(&self) -> Vec<String> {
        let s = lock(&self.shared);
        if s.bird_running || self.stop.load(Ordering::SeqCst) {
            return Vec::new();
        }
        vec![format!("bgp: BIRD is not running (started again {} times){}", s.restarts, s.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    }

    pub fn status(&self) -> BgpStatus {
        let s = lock(&self.shared);
        let drain = s.drain.as_ref().map(|d| {
            let left = d.deadline.saturating_duration_since(Instant::now());
            DrainStatus {
                since_seconds: d.since.elapsed().as_secs_f64(),
                deadline_in_seconds: left.as_secs_f64(),
                sessions: s.drain_sessions,
                done: s.drain_sessions == 0 || left.is_zero(),
            }
        });
        let state = match &drain {
            Some(d) if d.done => "drained",
            Some(_) => "draining",
            None if !s.vips_announced => "withdrawn",
            None => "announcing",
        };
        BgpStatus {
            state: state.into(),
            reasons: s.reasons.clone(),
            announced: s.announced.primary.iter().map(show).collect(),
            announced_backup: s.announced.backup.iter().map(show).collect(),
            withheld: s.withheld.iter().map(show).collect(),
            bird_running: s.bird_running,
            bird_restarts: s.restarts,
            error: s.error.clone(),
            changes: s.changes,
            neighbors: self
                .spec
                .neighbors
                .iter()
                .zip(s.sessions.iter().map(Some).chain(std::iter::repeat(None)))
                .map(|(n, sess)| BgpNeighborStatus {
                    address: n.address.to_string(),
                    asn: n.asn,
                    established: sess.is_some_and(|x| x.established()),
                    state: sess.map_or("unknown".into(), |x| x.state.clone()),
                    info: sess.map(|x| x.info.clone()).unwrap_or_default(),
                })
                .collect(),
            drain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vectorlb_lb::{BackendSpec, Control, LbSpec, Mode, ServiceSpec};

    fn snap(weights: &[(&str, u32)]) -> Arc<Snapshot> {
        let mut spec = LbSpec::default();
        let addrs = vec![("10.1.0.1".parse().unwrap(), 24), ("2001:db8:1::1".parse().unwrap(), 64)];
        spec.ports.push(vectorlb_lb::PortSpec { name: "int".into(), mac: [2, 0, 0, 0, 0, 1], addrs, vlan: None, mtu: 1500 });
        for (i, (vip, w)) in weights.iter().enumerate() {
            let vip: IpAddr = vip.parse().unwrap();
            let be: IpAddr = if vip.is_ipv4() { "10.1.0.11".parse().unwrap() } else { "2001:db8:1::11".parse().unwrap() };
            let s = ServiceSpec {
                vip,
                port: 80 + i as u16,
                proto: vectorlb_packet::proto::TCP,
                mode: Mode::Dr,
                scheduler: vectorlb_sched::Algorithm::parse("maglev").unwrap(),
                backends: vec![BackendSpec { addr: be, port: 0, weight: *w, quic_id: None }],
                local_addrs: Vec::new(),
                peer_local_addrs: Vec::new(),
                toa: false,
                synproxy: Default::default(),
                timeouts: Default::default(),
                continuation: true,
                quic: false,
                affinity_ms: 0,
                keep_source: Vec::new(),
            };
            spec.services.push(s);
        }
        Control::new(&spec).unwrap().snapshot()
    }

    #[test]
    fn announces_vips_with_a_backend_up_while_the_data_plane_works() {
        let s = snap(&[("10.0.0.100", 1), ("10.0.0.100", 0), ("10.0.0.101", 0), ("2001:db8::100", 1)]);
        let w = wanted(&s, &[], DrainState::Off, true);
        assert_eq!(w.routes.primary.iter().map(show).collect::<Vec<_>>(), ["10.0.0.100/32", "2001:db8::100/128"]);
        assert!(w.routes.backup.is_empty());
        assert_eq!(w.withheld.iter().map(show).collect::<Vec<_>>(), ["10.0.0.101/32"]);
        assert_eq!(w.reasons, ["10.0.0.101/32: no service on it has a backend up"]);
        let w = wanted(&s, &["worker 0: no progress for 1200 ms".into()], DrainState::Off, true);
        assert!(w.routes.is_empty());
        assert_eq!(w.withheld.len(), 3);
        assert_eq!(w.reasons, ["data plane: worker 0: no progress for 1200 ms"]);
        let w = wanted(&s, &[], DrainState::Draining, true);
        assert!(w.routes.is_empty());
        assert!(w.reasons[0].starts_with("draining"));
        let w = wanted(&s, &[], DrainState::Off, false);
        assert!(w.routes.is_empty() && w.withheld.len() == 3, "{w:?}");
        assert!(w.reasons[0].contains("sync group"), "{w:?}");
    }

    #[test]
    fn full_nat_local_addresses_own_and_backup() {
        let mut spec = LbSpec::default();
        let addrs = vec![("10.1.0.1".parse().unwrap(), 24)];
        spec.ports.push(vectorlb_lb::PortSpec { name: "int".into(), mac: [2, 0, 0, 0, 0, 1], addrs, vlan: None, mtu: 1500 });
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        spec.services.push(ServiceSpec {
            vip: ip("10.0.0.100"),
            port: 80,
            proto: vectorlb_packet::proto::TCP,
            mode: Mode::Fnat,
            scheduler: vectorlb_sched::Algorithm::parse("maglev").unwrap(),
            backends: vec![BackendSpec { addr: ip("10.1.0.11"), port: 80, weight: 1, quic_id: None }],
            local_addrs: vec![ip("10.200.0.1")],
            peer_local_addrs: vec![ip("10.200.0.2"), ip("10.200.0.3")],
            toa: false,
            synproxy: Default::default(),
            timeouts: Default::default(),
            continuation: false,
            quic: false,
            affinity_ms: 0,
            keep_source: Vec::new(),
        });
        let s = Control::new(&spec).unwrap().snapshot();
        let names = |v: &BTreeSet<Prefix>| v.iter().map(show).collect::<Vec<_>>();
        let w = wanted(&s, &[], DrainState::Off, true);
        assert_eq!(names(&w.routes.primary), ["10.0.0.100/32", "10.200.0.1/32"]);
        assert_eq!(names(&w.routes.backup), ["10.200.0.2/32", "10.200.0.3/32"]);
        // A drain keeps the own local address (the flows' replies) until it is over; the
        // peers' are not taken over by a draining node.
        let w = wanted(&s, &[], DrainState::Draining, true);
        assert_eq!(names(&w.routes.primary), ["10.200.0.1/32"]);
        assert!(w.routes.backup.is_empty());
        let w = wanted(&s, &[], DrainState::Drained, true);
        assert!(w.routes.is_empty());
        assert_eq!(w.withheld.len(), 4);
        // A broken data plane, or a group node without the group's sessions: nothing.
        assert!(wanted(&s, &["port int: link down".into()], DrainState::Off, true).routes.is_empty());
        assert!(wanted(&s, &[], DrainState::Off, false).routes.is_empty());
    }

    #[test]
    fn drain_states() {
        let a = Announcer::new(&BgpSpec::new(65001, "10.0.0.1".parse().unwrap(), Vec::new()));
        lock(&a.shared).vips_announced = true;
        assert_eq!(a.status().state, "announcing");
        a.drain(true, Some(60));
        lock(&a.shared).drain_sessions = 3;
        let st = a.status();
        assert_eq!(st.state, "draining");
        let d = st.drain.unwrap();
        assert!(!d.done && d.deadline_in_seconds > 59.0 && d.sessions == 3);
        lock(&a.shared).drain_sessions = 0;
        assert_eq!(a.status().state, "drained");
        a.drain(false, None);
        assert_eq!(a.status().state, "announcing");
        assert!(a.status().drain.is_none());
        // BIRD down is a problem until stopped on purpose.
        assert_eq!(a.problems().len(), 1);
        a.stop();
        assert!(a.problems().is_empty());
    }
}
