//! Session synchronisation between HA nodes, the core's side: which sessions changed (created,
//! or their TCP state moved) since the runtime last asked, a walk over the whole table for bulk
//! transfers, and installing a session received from the active node.
//!
//! Records name everything by value (service by protocol, VIP and port; backend and local
//! address by address), never by the node-local ids, so the two nodes need the same services
//! but not the same id assignment. A full-NAT session keeps its local address and port: the
//! standby installs it on the worker that owns that port (the same worker count on both nodes
//! gives the same partition), so the backend's replies find it after a failover.

use crate::flows::Flows;
use crate::mem::Zeroable;
use crate::service::{key, Snapshot};
use crate::session::{expired, flag, state, Addr, InsertError, Ref, SeqAdj, Session, NO_LADDR};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One session, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncRecord {
    pub proto: u8,
    pub vip: IpAddr,
    pub vport: u16,
    pub client: IpAddr,
    pub cport: u16,
    pub backend: IpAddr,
    pub bport: u16,
    /// Full-NAT local address and port.
    pub local: Option<(IpAddr, u16)>,
    pub state: u8,
    pub flags: u8,
    /// Milliseconds until it expires (from when it was exported).
    pub expire_in: u32,
    /// The SYN proxy's translation (with [`flag::SYNPROXY`] in `flags`; zeroes otherwise).
    pub adj: SeqAdj,
}

/// Why a record was not installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallError {
    /// No such service, backend or local address here (the configurations differ).
    Unknown,
    /// Already expired, or a state that cannot be installed.
    Stale,
    /// The local port belongs to another worker, or another session holds it.
    PortTaken,
    /// The session table is full.
    Full,
}

pub trait SyncAddr: Addr + Sized
where
    Session<Self>: Zeroable,
{
    fn ip(&self) -> IpAddr;
    fn from_ip(a: IpAddr) -> Option<Self>;
}

impl SyncAddr for [u8; 4] {
    fn ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(*self))
    }
    fn from_ip(a: IpAddr) -> Option<Self> {
        match a {
            IpAddr::V4(x) => Some(x.octets()),
            _ => None,
        }
    }
}

impl SyncAddr for [u8; 16] {
    fn ip(&self) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(*self))
    }
    fn from_ip(a: IpAddr) -> Option<Self> {
        match a {
            IpAddr::V6(x) => Some(x.octets()),
            _ => None,
        }
    }
}

fn record<A: SyncAddr>(snap: &Snapshot, s: &Session<A>, adj: &SeqAdj, now: u32) -> Option<SyncRecord>
where
    Session<A>: Zeroable,
{
    if s.state == state::FREE || s.flags & flag::SNAT != 0 || expired(now, s.expire) {
        return None;
    }
    let svc = snap.service(s.svc)?;
    let be = snap.backend(s.backend)?;
    let local = if s.laddr != NO_LADDR { Some((snap.laddr_addr(s.laddr)?, s.lport)) } else { None };
    Some(SyncRecord {
        proto: svc.spec.proto,
        vip: svc.spec.vip,
        vport: svc.spec.port,
        client: s.client.ip(),
        cport: s.cport,
        backend: be.addr,
        bport: be.port,
        local,
        state: s.state,
        flags: s.flags,
        expire_in: s.expire.wrapping_sub(now),
        adj: if s.flags & flag::SYNPROXY != 0 { *adj } else { SeqAdj::default() },
    })
}

/// The sessions created or moved to another TCP state since the last call, as records
/// (without those of services with continuation unless `continuable`).
pub(crate) fn take_changes(flows: &mut Flows, snap: &Snapshot, now: u32, continuable: bool, out: &mut Vec<SyncRecord>) {
    for r in flows.take_changed() {
        let t = &flows.table;
        let svc = if r.is_v6() { t.get::<[u8; 16]>(r).svc } else { t.get::<[u8; 4]>(r).svc };
        if !continuable && snap.service(svc).is_some_and(|s| s.spec.continuation) {
            continue;
        }
        let rec = if r.is_v6() { record(snap, t.get::<[u8; 16]>(r), t.adj::<[u8; 16]>(r), now) } else { record(snap, t.get::<[u8; 4]>(r), t.adj::<[u8; 4]>(r), now) };
        out.extend(rec);
    }
}

/// Which sessions a walk exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// Every live session (a bulk transfer to a standby or to a node joining a group).
    All,
    /// Only full-NAT sessions on this node's own local addresses: the ones whose replies come
    /// back here, so whose expiry this node keeps current (a group's periodic refresh; the
    /// other sessions are refreshed by the node that owns their local address, or re-created
    /// by continuation).
    OwnFullNat,
}

/// Up to `limit` live sessions of one family from record `start`; the index to continue
/// from, or `None` at the end (bulk transfer to a standby).
#[allow(clippy::too_many_arguments)]
pub(crate) fn export(flows: &Flows, snap: &Snapshot, v6: bool, which: Export, start: usize, limit: usize, now: u32, out: &mut Vec<SyncRecord>) -> Option<usize> {
    let mut n = 0;
    let own = |laddr: u16| laddr != NO_LADDR && !snap.is_peer_laddr(laddr);
    let mut visit = |rec: Option<SyncRecord>| {
        if n >= limit {
            return false;
        }
        if let Some(r) = rec {
            out.push(r);
            n += 1;
        }
        true
    };
    let t = &flows.table;
    let all = which == Export::All;
    if v6 {
        t.for_each::<[u8; 16]>(start, |i, s| visit(if all || own(s.laddr) { record(snap, s, t.adj_at::<[u8; 16]>(i), now) } else { None }))
    } else {
        t.for_each::<[u8; 4]>(start, |i, s| visit(if all || own(s.laddr) { record(snap, s, t.adj_at::<[u8; 4]>(i), now) } else { None }))
    }
}

/// Installs (or updates) a session received from the active node (a peer of a group, `group`:
/// then a session of ours on one of our own local addresses is never replaced).
/// The session's record.
pub(crate) fn install(flows: &mut Flows, snap: &Snapshot, rec: &SyncRecord, now: u32, group: bool) -> Result<Ref, InstallError> {
    match rec.client {
        IpAddr::V4(_) => install_as::<[u8; 4]>(flows, snap, rec, now, group),
        IpAddr::V6(_) => install_as::<[u8; 16]>(flows, snap, rec, now, group),
    }
}

fn install_as<A: SyncAddr>(flows: &mut Flows, snap: &Snapshot, rec: &SyncRecord, now: u32, group: bool) -> Result<Ref, InstallError>
where
    Session<A>: Zeroable,
{
    if rec.state == state::FREE || rec.state > state::CONTINUED || rec.expire_in == 0 || rec.expire_in > 1 << 30 {
        return Err(InstallError::Stale);
    }
    let client = A::from_ip(rec.client).ok_or(InstallError::Unknown)?;
    let svc = snap.lookup_service(key(rec.vip), rec.vport, rec.proto).ok_or(InstallError::Unknown)?;
    let backend = snap.backends().find(|b| b.svc == svc && b.addr == rec.backend && b.port == rec.bport).ok_or(InstallError::Unknown)?.id;
    let (laddr, lport) = match rec.local {
        Some((a, p)) => (snap.laddr(key(a)).ok_or(InstallError::Unknown)?, p),
        None => (NO_LADDR, 0),
    };
    let expire = now.wrapping_add(rec.expire_in);
    // Flags that describe the record's index entries are ours to set.
    let flags = rec.flags & !(flag::PORT | flag::REVERSE | flag::SNAT)
        | if laddr == NO_LADDR && snap.service(svc).is_some_and(|s| s.spec.mode == crate::Mode::Nat) { flag::REVERSE } else { 0 };
    let h = flows.table.hash_fwd(svc, &client, rec.cport);
    if let Some(r) = flows.table.find_fwd(h, svc, &client, rec.cport) {
        let s = *flows.table.get::<A>(r);
        if s.backend == backend && s.laddr == laddr && s.lport == lport {
            flows.table.set_state::<A>(r, rec.state);
            let s = flows.table.get_mut::<A>(r);
            s.expire = expire;
            s.flags = (s.flags & (flag::PORT | flag::REVERSE)) | (flags & !flag::REVERSE);
            *flows.table.adj_mut::<A>(r) = rec.adj;
            return Ok(r);
        }
        if group && s.laddr != NO_LADDR && !snap.is_peer_laddr(s.laddr) {
            return Err(InstallError::Stale);
        }
        flows.table.remove::<A>(r);
    }
    if expired(now, expire) {
        return Err(InstallError::Stale);
    }
    let s = Session { client, cport: rec.cport, svc, backend, laddr, lport, expire, state: rec.state, flags };
    match flows.table.insert_bound(s) {
        Ok(r) => {
            *flows.table.adj_mut::<A>(r) = rec.adj;
            Ok(r)
        }
        Err(InsertError::NoPort) => Err(InstallError::PortTaken),
        Err(InsertError::Full) => Err(InstallError::Full),
    }
}
