//! The pods port (`[ports.pods]`): a Kubernetes node's pods plugged into the data plane, each
//! by a tun interface in its own network namespace (Calico VPP's model), attached and detached
//! at run time (`POST` / `DELETE /v1/pods`, the CNI plugin) without touching the workers' ports.
//!
//! - Each interface has a slot; the data plane knows a pod's addresses as neighbours on this
//!   port whose MAC is `02:76:` and the slot, so the pipeline's routes, NAT and load balancing
//!   reach pods like any next hop, and the transmit queue finds the interface from the MAC.
//! - One worker (`pods.worker`) reads every interface (one epoll set): both directions of a
//!   pod's flows meet on that worker, which NAT sessions need. Any worker writes.
//! - A packet a pod sends from an address that is not its own is dropped and counted.
//! - Slot 0 is the host's interface (`pods.host_interface`, in the daemon's own namespace): the
//!   host's routes to the pods' networks point at it, and the pods' traffic to anything that is
//!   not a pod of this node or a service leaves through it.
//! - A pod may also have a memif for chosen ports ([`crate::pod_memif`]).
//! - Each attachment is written to `pods.state_dir` (one file, mode 0600) before it is
//!   answered; the interfaces are persistent, so a daemon that restarts (or was killed) takes
//!   its pods back from those files, and forgets the ones whose namespace is gone.

use crate::lock;
use crate::pod_memif::{MemifIo, PodMemif, PortRange};
use crate::tun;
use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use vectorlb_api::model::{is_container_id, is_ifname, HostPort, MAX_CONTAINER_ID, MAX_IFNAME};
use vectorlb_config::PodsSpec;
use vectorlb_dpdk::Mbuf;
use vectorlb_io::{Packet, PacketBuf, PacketMeta, PacketPool, RxQueue, TxQueue};
use vectorlb_packet::ethernet::Mac;

/// The first two bytes of every pod interface's MAC (locally administered).
pub const MAC_PREFIX: [u8; 2] = [0x02, 0x76];
/// The largest pod state file read back (a record is well under 4 KiB).
const MAX_STATE_FILE: u64 = 64 << 10;

/// The host interface's slot.
pub const HOST_SLOT: u32 = 0;
/// The next hops through which the pods port reaches the host (neighbours of slot 0).
pub const HOST_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);
pub const HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0x76, 1);
/// Packets read from one interface before the next one's turn.
const PER_INTERFACE: usize = 32;
/// A super-packet buffer's frame: the Ethernet header and the longest IP packet a pod's TCP
/// hands over with segmentation offload (its kernel caps them near 64 KB, below the mbuf's
/// 65,535-byte room and its headroom).
pub const BIG_FRAME: usize = 65_535 - 128;
/// Super-packet buffers (of [`BIG_FRAME`]) in the pods port's pool: a burst in flight per
/// worker and more; about 17 MB of huge pages.
pub const BIG_BUFFERS: u32 = 256;

/// The MAC that stands for the interface in `slot`.
pub fn slot_mac(slot: u32) -> Mac {
    let s = slot.to_be_bytes();
    [MAC_PREFIX[0], MAC_PREFIX[1], s[0], s[1], s[2], s[3]]
}

/// What is kept on disk of one attachment (and answered by the API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodRecord {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub ips: Vec<IpAddr>,
    pub mtu: u16,
    pub slot: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The CNI network it belongs to (GC is scoped to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Destination ports that go to the pod's memif (none: no memif).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memif_ports: Vec<PortRange>,
    /// Its host ports ([`crate::host_ports`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
}

/// Why an attachment was refused.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NoNamespace(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    Io(String),
}

/// One attached pod interface: a tun device (layer 3, no Ethernet header) in the pod's network
/// namespace, read and written by the data plane through `fd`.
pub struct PodTun {
    pub rec: PodRecord,
    fd: OwnedFd,
    /// Whether every packet read and written has a virtio-net header before it (offloads).
    pub vnet: bool,
    v4: Option<[u8; 4]>,
    v6: Option<[u8; 16]>,
    host: bool,
    pub memif: Option<PodMemif>,
    pub rx: AtomicU64,
    pub tx: AtomicU64,
    pub spoofed: AtomicU64,
    /// The mesh's node proxy (`PUT /v1/mesh`): it sends from the addresses of the pods whose
    /// connections it carries, so its sources are not checked.
    pub mesh_proxy: std::sync::atomic::AtomicBool,
    pub tx_dropped: AtomicU64,
    /// Super-packets read; packets whose virtio-net header did not agree with them (dropped).
    pub rx_super: AtomicU64,
    pub bad_offload: AtomicU64,
}

impl PodTun {
    fn new(rec: PodRecord, fd: OwnedFd, vnet: bool, host: bool, memif: Option<PodMemif>) -> PodTun {
        let v4 = rec.ips.iter().find_map(|a| match a {
            IpAddr::V4(a) => Some(a.octets()),
            _ => None,
        });
        let v6 = rec.ips.iter().find_map(|a| match a {
            IpAddr::V6(a) => Some(a.octets()),
            _ => None,
        });
        let z = || AtomicU64::new(0);
        PodTun {
            rec,
            fd,
            vnet,
            v4,
            v6,
            host,
            memif,
            rx: z(),
            tx: z(),
            spoofed: z(),
            mesh_proxy: std::sync::atomic::AtomicBool::new(false),
            tx_dropped: z(),
            rx_super: z(),
            bad_offload: z(),
        }
    }

    /// Whether the IP packet `p` comes from one of the pod's addresses. A link-local IPv6
    /// source passes only to a link-scoped destination (link-local unicast, interface- or
    /// link-local multicast: the kernel's own neighbour discovery and MLD), which the data plane
    /// never routes; to anything else it is a spoofed source (`fe80::dead` once reached another
    /// pod).
    fn source_ok(&self, p: &[u8]) -> bool {
        if self.host || self.mesh_proxy.load(Ordering::Relaxed) {
            return true;
        }
        match p.first().map(|b| b >> 4) {
            Some(4) if p.len() >= 20 => self.v4.is_some_and(|a| p[12..16] == a),
            Some(6) if p.len() >= 40 => {
                let link_local = |a: &[u8]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
                let link_scoped = |a: &[u8]| link_local(a) || (a[0] == 0xff && a[1] & 0x0f <= 2);
                self.v6.is_some_and(|a| p[8..24] == a) || (link_local(&p[8..24]) && link_scoped(&p[24..40]))
            }
            _ => false,
        }
    }
}

/// The pods port's interfaces.
pub struct PodSet {
    /// The port's index in the configuration.
    pub port: u16,
    pub mac: Mac,
    pub mtu: u16,
    pub spec: PodsSpec,
    /// The node's pod networks (the port's addresses and prefixes).
    nets: Vec<(IpAddr, u8)>,
    slots: ArcSwap<Vec<Option<Arc<PodTun>>>>,
    /// Serialises attach and detach (readers only load `slots`).
    edit: Mutex<()>,
    epoll: OwnedFd,
    /// Frames for a slot with no interface, or not addressed to a pod, dropped.
    pub no_pod: AtomicU64,
    /// Segments of a pod's super-packet lost for want of a buffer.
    pub rx_no_buffer: AtomicU64,
    /// The host's own addresses (routed to the host's interface), as last read.
    host_addrs: Mutex<Vec<IpAddr>>,
    /// The pods' memifs' buffers and copier (none: memifs are refused). The copier is the
    /// CPU's: copies end within each burst, so the queues have nothing to finish later.
    memif_io: OnceLock<MemifIo>,
    /// The attached interfaces that have a memif.
    memifs: ArcSwap<Vec<Arc<PodTun>>>,
    /// The loopback host ports' relays, by (container id, interface).
    relays: Mutex<HashMap<(String, String), Vec<crate::host_ports::Relay>>>,
    /// Buffers for super-packets (64 KB each), when interfaces get offloads
    /// (`pods.offloads`, and the pool could be made).
    big: OnceLock<Arc<dyn PacketPool<Mbuf>>>,
}

fn os_err(what: &str) -> PodError {
    PodError::Io(format!("{what}: {}", io::Error::last_os_error()))
}

impl PodSet {
    pub fn new(port: u16, mac: Mac, mtu: u16, nets: Vec<(IpAddr, u8)>, spec: PodsSpec) -> Result<PodSet, PodError> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(os_err("epoll_create1"));
        }
        // SAFETY: just created and owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        Ok(PodSet {
            port,
            mac,
            mtu,
            spec,
            nets,
            slots: ArcSwap::from_pointee(Vec::new()),
            edit: Mutex::new(()),
            epoll,
            no_pod: AtomicU64::new(0),
            rx_no_buffer: AtomicU64::new(0),
            host_addrs: Mutex::new(Vec::new()),
            memif_io: OnceLock::new(),
            memifs: ArcSwap::from_pointee(Vec::new()),
            relays: Mutex::new(HashMap::new()),
            big: OnceLock::new(),
        })
    }

    /// Gives interfaces attached from now on offloads: their super-packets are read into
    /// `big`'s buffers (each room for a 64 KB IP packet after the Ethernet header).
    pub fn enable_offloads(&self, big: Arc<dyn PacketPool<Mbuf>>) {
        let _ = self.big.set(big);
    }

    /// Whether interfaces get offloads.
    pub fn offloads(&self) -> bool {
        self.big.get().is_some()
    }

    /// Lets pods have memifs: their buffers come from `io`. Then one thread (the returned
    /// handle) runs their handshakes until the set is dropped.
    pub fn enable_memif(self: &Arc<Self>, io: MemifIo) -> io::Result<std::thread::JoinHandle<()>> {
        let _ = self.memif_io.set(io);
        let weak: Weak<PodSet> = Arc::downgrade(self);
        std::thread::Builder::new().name("vlb-pods-memif".into()).spawn(move || {
            while let Some(set) = weak.upgrade() {
                for t in set.memifs.load().iter() {
                    if let Some(m) = &t.memif {
                        m.poll();
                    }
                }
                drop(set);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    }

    /// The node's pod networks (the port's prefixes, host bits cleared): what `[bgp]`
    /// announces for this node.
    pub fn networks(&self) -> Vec<(IpAddr, u8)> {
        self.nets.iter().map(|&(a, len)| (vectorlb_config::masked(a, len), len)).collect()
    }

    /// Every attached interface (the host's included).
    pub fn all(&self) -> Vec<Arc<PodTun>> {
        self.slots.load().iter().flatten().cloned().collect()
    }

    /// The neighbours the data plane needs: each pod address on its slot's MAC, and the host's
    /// next hops.
    pub fn neighbours(&self) -> Vec<(IpAddr, Mac)> {
        let mut v = Vec::new();
        for t in self.slots.load().iter().flatten() {
            if t.host {
                v.push((IpAddr::V4(HOST_V4), slot_mac(HOST_SLOT)));
                v.push((IpAddr::V6(HOST_V6), slot_mac(HOST_SLOT)));
            } else {
                v.extend(t.rec.ips.iter().map(|a| (*a, slot_mac(t.rec.slot))));
            }
        }
        v
    }

    /// The host's addresses that the pods reach through the host's interface: the unicast
    /// ones outside the pod networks.
    pub fn host_routes(&self) -> Vec<IpAddr> {
        lock(&self.host_addrs).clone()
    }

    /// Reads the host's addresses again; true when they changed (publish again).
    pub fn refresh_host_addrs(&self, addrs: Vec<IpAddr>) -> bool {
        let mut keep: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|a| vectorlb_lb::service::not_unicast(*a).is_none())
            .filter(|a| !matches!(a, IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80))
            .filter(|a| !matches!(a, IpAddr::V4(v) if v.is_link_local()))
            .filter(|a| !self.nets.iter().any(|(n, l)| same_net(*n, *a, *l)))
            .collect();
        keep.sort();
        let mut cur = lock(&self.host_addrs);
        if *cur == keep {
            return false;
        }
        *cur = keep;
        true
    }

    /// Whether the host's interface is attached.
    pub fn has_host(&self) -> bool {
        self.slots.load().first().is_some_and(Option::is_some)
    }

    fn state_file(&self, id: &str, ifname: &str) -> PathBuf {
        // '+' is in neither alphabet, so no two attachments share a file.
        Path::new(&self.spec.state_dir).join(format!("{id}+{ifname}.json"))
    }

    /// Creates (or takes back) the host's interface and routes the pod networks through it.
    pub fn attach_host(&self) -> Result<(), PodError> {
        let name = &self.spec.host_interface;
        if name.is_empty() {
            return Ok(());
        }
        let (fd, vnet) = tun::open(name, self.offloads()).map_err(|e| PodError::Io(format!("pods.host_interface {name}: {e}")))?;
        tun::configure(name, self.mtu, &[]).map_err(|e| PodError::Io(format!("pods.host_interface {name}: {e}")))?;
        for (a, len) in &self.nets {
            tun::add_route(name, *a, *len).map_err(|e| PodError::Io(format!("pods.host_interface {name}: {e}")))?;
        }
        for c in &self.spec.service_cidrs {
            let (a, len) = vectorlb_config::prefix("pods.service_cidrs", c).map_err(|e| PodError::Invalid(e.to_string()))?;
            tun::add_route(name, a, len).map_err(|e| PodError::Io(format!("pods.host_interface {name}: {e}")))?;
        }
        let addrs: Vec<IpAddr> = self.spec.node_port_addresses.iter().filter_map(|a| a.parse().ok()).collect();
        let range = self.spec.node_ports().map_err(PodError::Invalid)?;
        let egress: Vec<IpAddr> = self.spec.egress_addresses.iter().filter_map(|a| a.parse().ok()).collect();
        crate::steer::node_ports(name, &addrs, range, &egress).map_err(|e| PodError::Io(format!("pods.node_port_addresses, egress_addresses: {e}")))?;
        let rec = PodRecord {
            container_id: "host".into(),
            ifname: name.clone(),
            netns: String::new(),
            ips: Vec::new(),
            mtu: self.mtu,
            slot: HOST_SLOT,
            pod: None,
            network: None,
            memif_ports: Vec::new(),
            host_ports: Vec::new(),
        };
        let _g = lock(&self.edit);
        self.insert(Arc::new(PodTun::new(rec, fd, vnet, true, None)))
    }

    /// Checks a request against the port: names, addresses inside the pod networks (one per
    /// family, not the network's own or the port's address), the MTU.
    pub fn check(&self, id: &str, ifname: &str, ips: &[IpAddr], mtu: u16) -> Result<(), PodError> {
        if !is_container_id(id) {
            return Err(PodError::Invalid(format!("container_id: '{}' is not a container id (1..={MAX_CONTAINER_ID} bytes: letters, digits, '-', '_', '.')", id.escape_debug())));
        }
        if !is_ifname(ifname) {
            return Err(PodError::Invalid(format!("ifname: '{}' is not an interface name (1..={MAX_IFNAME} bytes: letters, digits, '-', '_', '.')", ifname.escape_debug())));
        }
        if ips.is_empty() {
            return Err(PodError::Invalid("ips: a pod needs an address".into()));
        }
        if ips.iter().filter(|a| a.is_ipv4()).count() > 1 || ips.iter().filter(|a| a.is_ipv6()).count() > 1 {
            return Err(PodError::Invalid("ips: at most one address per family".into()));
        }
        for a in ips {
            let inside = self.nets.iter().find(|(n, len)| same_net(*n, *a, *len));
            let Some((own, len)) = inside else {
                let nets: Vec<String> = self.nets.iter().map(|(a, l)| format!("{a}/{l}")).collect();
                return Err(PodError::Unprocessable(format!("ips: {a} is outside this node's pod networks ({})", nets.join(", "))));
            };
            if a == own || is_net_or_broadcast(*a, *len) {
                return Err(PodError::Unprocessable(format!("ips: {a} is the pods port's own address or its network's")));
            }
        }
        if !(576..=self.mtu.max(576)).contains(&mtu) || (mtu < 1280 && ips.iter().any(IpAddr::is_ipv6)) {
            return Err(PodError::Unprocessable(format!(
                "mtu: {mtu} is out of range {}..={} (the pods port's MTU)",
                if ips.iter().any(IpAddr::is_ipv6) { 1280 } else { 576 },
                self.mtu
            )));
        }
        Ok(())
    }

    /// Attaches a pod's interface: creates it in the pod's namespace (or takes back the one of
    /// an earlier run), configures it, records it, and starts reading it. `slot` keeps a
    /// restored interface's slot. The same attachment again returns the one there is.
    pub fn attach(&self, mut rec: PodRecord, slot: Option<u32>) -> Result<Arc<PodTun>, PodError> {
        self.check(&rec.container_id, &rec.ifname, &rec.ips, rec.mtu)?;
        crate::pod_memif::check(&rec.memif_ports).map_err(PodError::Invalid)?;
        if !rec.memif_ports.is_empty() && self.memif_io.get().is_none() {
            return Err(PodError::Unprocessable("memif_ports: this pods port has no memif support".into()));
        }
        let node = self.node_addresses();
        crate::host_ports::check(&rec.host_ports, &rec.ips, &node).map_err(PodError::Unprocessable)?;
        let _g = lock(&self.edit);
        let slots = self.slots.load_full();
        if let Some(t) = slots.iter().flatten().find(|t| !t.host && t.rec.container_id == rec.container_id && t.rec.ifname == rec.ifname) {
            if t.rec.netns == rec.netns
                && t.rec.ips == rec.ips
                && t.rec.mtu == rec.mtu
                && t.rec.memif_ports == rec.memif_ports
                && t.rec.network == rec.network
                && t.rec.host_ports == rec.host_ports
            {
                return Ok(t.clone());
            }
            return Err(PodError::Conflict(format!("{} of {} is attached already, with other addresses or namespace; delete it first", rec.ifname, rec.container_id)));
        }
        if let Some(t) = slots.iter().flatten().find(|t| t.rec.ips.iter().any(|a| rec.ips.contains(a))) {
            return Err(PodError::Conflict(format!("ips: {} of {} has one of these addresses", t.rec.ifname, t.rec.container_id)));
        }
        if let Some(t) = slots.iter().flatten().find(|t| !t.host && t.rec.netns == rec.netns && t.rec.ifname == rec.ifname) {
            return Err(PodError::Conflict(format!("ifname: {} in {} is {}'s already", rec.ifname, rec.netns, t.rec.container_id)));
        }
        for h in &rec.host_ports {
            if let Some(t) = slots.iter().flatten().find(|t| t.rec.host_ports.iter().any(|o| crate::host_ports::overlaps(o, &t.rec.ips, h, &rec.ips, &node))) {
                return Err(PodError::Conflict(format!(
                    "host_ports: {}/{} is {}'s ({}) already",
                    h.host_port,
                    h.proto,
                    t.rec.pod.as_deref().unwrap_or(&t.rec.container_id),
                    t.rec.ifname
                )));
            }
        }
        let used = slots.iter().flatten().filter(|t| !t.host).count();
        if used >= self.spec.max_pods as usize {
            return Err(PodError::Unprocessable(format!("the pods port is full ({} interfaces, pods.max_pods)", self.spec.max_pods)));
        }
        // A restored slot only within the port's (a state file could say anything).
        rec.slot = match slot {
            Some(s) if s != HOST_SLOT && s <= self.spec.max_pods && slots.get(s as usize).is_none_or(Option::is_none) => s,
            _ => (1..).find(|s| slots.get(*s as usize).is_none_or(Option::is_none)).expect("a free slot below max_pods + 1"),
        };
        let ns = Path::new(&rec.netns);
        if rec.netns.is_empty() || !ns.is_absolute() || !ns.exists() {
            return Err(PodError::NoNamespace(format!("netns: '{}' does not exist (the sandbox is gone)", rec.netns.escape_debug())));
        }
        let (name, mtu, ips, memif) = (rec.ifname.clone(), rec.mtu, rec.ips.clone(), !rec.memif_ports.is_empty());
        let offloads = self.offloads();
        let (fd, vnet, server) = tun::in_netns(ns, move || {
            let (fd, vnet) = tun::open(&name, offloads)?;
            if let Err(e) = tun::configure(&name, mtu, &ips) {
                tun::unpersist(&fd);
                return Err(e);
            }
            // The memif's socket in the pod's abstract namespace.
            let server = match memif.then(|| PodMemif::listen(&name)).transpose() {
                Ok(s) => s,
                Err(e) => {
                    tun::unpersist(&fd);
                    return Err(io::Error::new(e.kind(), format!("memif socket {}: {e}", crate::pod_memif::socket_name(&name))));
                }
            };
            Ok((fd, vnet, server))
        })
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PodError::NoNamespace(format!("netns {}: {e}", rec.netns)),
            io::ErrorKind::InvalidInput => PodError::Invalid(format!("netns {}: {e}", rec.netns)),
            _ => PodError::Io(format!("{} in {}: {e}", rec.ifname, rec.netns)),
        })?;
        if let Err(e) = self.write_state(&rec) {
            tun::unpersist(&fd);
            return Err(e);
        }
        let memif = match (server, self.memif_io.get()) {
            (Some((server, link)), Some(mio)) => Some(PodMemif::new(rec.memif_ports.clone(), &rec.ifname, self.port, server, link, mio)),
            _ => None,
        };
        let tap = Arc::new(PodTun::new(rec, fd, vnet, false, memif));
        let placed = self.host_ports_on(&tap.rec, &node).and_then(|()| self.insert(tap.clone()));
        if let Err(e) = placed {
            self.host_ports_off(&tap.rec, &node);
            tun::unpersist(&tap.fd);
            let _ = std::fs::remove_file(self.state_file(&tap.rec.container_id, &tap.rec.ifname));
            return Err(e);
        }
        Ok(tap)
    }

    /// The node's addresses that NodePorts and host ports are on (`node_port_addresses`).
    fn node_addresses(&self) -> Vec<IpAddr> {
        self.spec.node_port_addresses.iter().filter_map(|a| a.parse().ok()).collect()
    }

    /// The data plane's services for the pods' host ports on the node's addresses.
    pub fn host_port_bindings(&self) -> Vec<crate::host_ports::Binding> {
        let node = self.node_addresses();
        self.slots.load().iter().flatten().flat_map(|t| crate::host_ports::bindings(&t.rec.host_ports, &t.rec.ips, &node)).collect()
    }

    /// Hands a pod's host ports to the data plane (routing rules) and starts its relays.
    fn host_ports_on(&self, rec: &PodRecord, node: &[IpAddr]) -> Result<(), PodError> {
        if rec.host_ports.is_empty() {
            return Ok(());
        }
        let range = self.spec.node_ports().map_err(PodError::Invalid)?;
        for (addr, proto, port, _, _) in crate::host_ports::bindings(&rec.host_ports, &rec.ips, node) {
            let p = crate::host_ports::proto_name(proto);
            crate::steer::host_port(addr, p, port, range, true).map_err(|e| PodError::Io(format!("host_ports {addr}:{port}/{p}: {e}")))?;
        }
        let mut relays = Vec::new();
        for (listen, to) in crate::host_ports::relayed(&rec.host_ports, &rec.ips) {
            let r = crate::host_ports::Relay::start(listen, to).map_err(|e| PodError::Conflict(format!("host_ports {listen}/tcp: {e} (the host uses it)")))?;
            relays.push(r);
        }
        lock(&self.relays).insert((rec.container_id.clone(), rec.ifname.clone()), relays);
        Ok(())
    }

    /// Undoes [`PodSet::host_ports_on`] (what of it there is).
    fn host_ports_off(&self, rec: &PodRecord, node: &[IpAddr]) {
        lock(&self.relays).remove(&(rec.container_id.clone(), rec.ifname.clone()));
        let Ok(range) = self.spec.node_ports() else { return };
        for (addr, proto, port, _, _) in crate::host_ports::bindings(&rec.host_ports, &rec.ips, node) {
            let p = crate::host_ports::proto_name(proto);
            if let Err(e) = crate::steer::host_port(addr, p, port, range, false) {
                tracing::warn!("host port {addr}:{port}/{p} of {}: {e}", rec.container_id);
            }
        }
    }

    fn write_state(&self, rec: &PodRecord) -> Result<(), PodError> {
        let dir = Path::new(&self.spec.state_dir);
        std::fs::create_dir_all(dir).map_err(|e| PodError::Io(format!("pods.state_dir {}: {e}", dir.display())))?;
        let path = self.state_file(&rec.container_id, &rec.ifname);
        let body = serde_json::to_vec_pretty(rec).expect("a record serialises");
        vectorlb_http::files::write_atomic(&path, &body, vectorlb_http::files::Mode::Always(0o600)).map_err(|e| PodError::Io(format!("{}: {e}", path.display())))
    }

    /// Puts `tap` in its slot and into the epoll set. The caller holds `edit`.
    fn insert(&self, tap: Arc<PodTun>) -> Result<(), PodError> {
        let slot = tap.rec.slot as usize;
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: slot as u64 };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, tap.fd.as_raw_fd(), &mut ev) } != 0 {
            return Err(os_err("epoll_ctl"));
        }
        let mut v = (**self.slots.load()).clone();
        if v.len() <= slot {
            v.resize(slot + 1, None);
        }
        v[slot] = Some(tap);
        self.slots.store(Arc::new(v));
        self.store_memifs();
        Ok(())
    }

    /// Refreshes the list of interfaces with a memif. The caller holds `edit`.
    fn store_memifs(&self) {
        let m: Vec<Arc<PodTun>> = self.slots.load().iter().flatten().filter(|t| t.memif.is_some()).cloned().collect();
        self.memifs.store(Arc::new(m));
    }

    /// Detaches and removes a pod's interface; false when it is not attached.
    pub fn detach(&self, id: &str, ifname: &str) -> Result<bool, PodError> {
        let _g = lock(&self.edit);
        let mut v = (**self.slots.load()).clone();
        let Some(slot) = v.iter().position(|t| t.as_ref().is_some_and(|t| !t.host && t.rec.container_id == id && t.rec.ifname == ifname)) else {
            return Ok(false);
        };
        let tap = v[slot].take().expect("found above");
        // SAFETY: the descriptor is open (the tap holds it); EPOLL_CTL_DEL ignores the event.
        unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, tap.fd.as_raw_fd(), std::ptr::null_mut()) };
        while v.last().is_some_and(Option::is_none) {
            v.pop();
        }
        self.slots.store(Arc::new(v));
        self.store_memifs();
        self.host_ports_off(&tap.rec, &self.node_addresses());
        // The interface goes when its last descriptor closes (a worker may still hold it for
        // a burst); its namespace may be gone already, and the interface with it.
        tun::unpersist(&tap.fd);
        let path = self.state_file(id, ifname);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(PodError::Io(format!("{}: {e}", path.display()))),
            _ => {}
        }
        Ok(true)
    }

    /// Takes back the interfaces an earlier run recorded: each whose namespace still exists is
    /// attached again in its slot; the others are forgotten. Returns (restored, forgotten).
    pub fn restore(&self) -> (usize, usize) {
        let dir = Path::new(&self.spec.state_dir);
        let Ok(entries) = std::fs::read_dir(dir) else { return (0, 0) };
        let mut files: BTreeSet<PathBuf> = BTreeSet::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "tmp") {
                let _ = std::fs::remove_file(&p);
            } else if p.extension().is_some_and(|x| x == "json") {
                files.insert(p);
            }
        }
        let (mut ok, mut gone) = (0, 0);
        if let Err(e) = vectorlb_http::files::check_private_dir(dir) {
            tracing::warn!("pods: {e}: no pod taken back from it (pods.state_dir must be this user's, writable by it alone)");
            return (0, 0);
        }
        for p in files {
            // Only a record this daemon could have written: a private regular file (not a
            // link, not a FIFO) of a record's size, that parses. Another is set aside (renamed
            // *.bad) with a line in the log, never retried at every start.
            let rec = vectorlb_http::files::read_private(&p, MAX_STATE_FILE)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<PodRecord>(&b).map_err(|e| format!("{}: not a pod record: {e}", p.display())));
            let rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("pods: {e}; set aside as {}.bad", p.display());
                    let _ = std::fs::rename(&p, p.with_extension("json.bad"));
                    continue;
                }
            };
            let slot = rec.slot;
            if slot == HOST_SLOT || slot > self.spec.max_pods {
                tracing::warn!("pods: {}: slot {slot} is outside this port's 1..={}; the interface gets another", p.display(), self.spec.max_pods);
            }
            match self.attach(rec.clone(), Some(slot)) {
                Ok(_) => ok += 1,
                Err(PodError::NoNamespace(e)) => {
                    tracing::info!("pods: {} of {} forgotten: {e}", rec.ifname, rec.container_id);
                    let _ = std::fs::remove_file(&p);
                    gone += 1;
                }
                Err(e) => tracing::warn!("pods: {} of {} not restored: {e}", rec.ifname, rec.container_id),
            }
        }
        (ok, gone)
    }
}

fn same_net(a: IpAddr, b: IpAddr, len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => len == 0 || (u32::from(a) ^ u32::from(b)) >> (32 - len.min(32) as u32) == 0,
        (IpAddr::V6(a), IpAddr::V6(b)) => len == 0 || (u128::from(a) ^ u128::from(b)) >> (128 - len.min(128) as u32) == 0,
        _ => false,
    }
}

fn is_net_or_broadcast(a: IpAddr, len: u8) -> bool {
    match a {
        IpAddr::V4(a) if len < 31 => {
            let host = u32::from(a) & (u32::MAX >> len);
            host == 0 || host == u32::MAX >> len
        }
        IpAddr::V6(a) if len < 127 => u128::from(a) & (u128::MAX >> len) == 0,
        _ => false,
    }
}

/// Writes the Ethernet header before the IP packet at `d[14..]` (its source checked, so at
/// least 20 bytes): to the pods port, from `slot`'s MAC, the type from the IP version.
fn eth_header(port_mac: &Mac, slot: u32, d: &mut [u8]) {
    d[..6].copy_from_slice(port_mac);
    d[6..12].copy_from_slice(&slot_mac(slot));
    let et: u16 = if d[14] >> 4 == 6 { 0x86dd } else { 0x0800 };
    d[12..14].copy_from_slice(&et.to_be_bytes());
}

/// The receive side of the pods port, on the worker that reads it.
pub struct PodRx {
    set: Arc<PodSet>,
    pool: Arc<dyn PacketPool<Mbuf>>,
    events: Vec<libc::epoll_event>,
    /// Events the idle wait already took from the epoll set (the next receive reads them
    /// instead of asking again).
    ready: usize,
    /// Whether `epoll_pwait2` exists here (kernel 5.11 or later); `ppoll` otherwise.
    pwait2: bool,
    /// Receives that found events (the rounds `visited` counts in).
    round: u64,
    /// By slot: the round an interface was last read, and whether it is read until it is
    /// empty (`hot`) or once a round. Most pods have one packet waiting when they are
    /// ready (a request, an acknowledgement), and reading on until the read fails costs a
    /// system call for nothing; an interface ready two rounds in a row has more.
    visited: Vec<u64>,
    hot: Vec<bool>,
    /// A buffer a read found nothing for, kept for the next.
    spare: Option<Mbuf>,
    /// What a memif gave, before its checks; and what they refused.
    got: Vec<Mbuf>,
    refused: Vec<Mbuf>,
    /// A super-packet buffer kept for the next read of an interface with offloads.
    big_spare: Option<Mbuf>,
}

/// Packets shorter than this whose checksum a pod left to us get it completed at once (a
/// sum over a few bytes) instead of a lookup of their destination.
const KEEP_PARTIAL_FROM: usize = 512;

impl PodRx {
    pub fn new(set: Arc<PodSet>, pool: Arc<dyn PacketPool<Mbuf>>) -> PodRx {
        PodRx {
            set,
            pool,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 64],
            ready: 0,
            pwait2: true,
            round: 0,
            visited: Vec::new(),
            hot: Vec::new(),
            spare: None,
            got: Vec::with_capacity(64),
            refused: Vec::new(),
            big_spare: None,
        }
    }

    /// Reads one packet of an interface with offloads into `p` (its buffer `frame` bytes
    /// long): the virtio-net header at `d[4..14]` (the Ethernet header goes there after), the
    /// packet from `d[14..]`; a packet longer than `p` holds goes on into a big buffer and
    /// `p` becomes that buffer (the small one is handed back through `small`). The bytes read
    /// (header included), 0 when nothing was, or the error.
    fn read_vnet(&mut self, fd: libc::c_int, p: &mut Mbuf, small: &mut Option<Mbuf>, frame: usize) -> io::Result<usize> {
        if self.big_spare.is_none() {
            self.big_spare = self.set.big.get().and_then(|b| b.alloc_len(self.set.port, BIG_FRAME));
        }
        let d = p.data_mut();
        let mut iov = [libc::iovec { iov_base: d[4..].as_mut_ptr().cast(), iov_len: d.len() - 4 }, libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }];
        let mut n = 1;
        if let Some(b) = &mut self.big_spare {
            let bd = b.data_mut();
            if bd.len() > frame {
                iov[1] = libc::iovec { iov_base: bd[frame..].as_mut_ptr().cast(), iov_len: bd.len() - frame };
                n = 2;
            }
        }
        // SAFETY: each iovec is a range of a buffer this reader owns (the packet's, then the
        // big spare's), lengths within them; the descriptor is open (the tap).
        let r = unsafe { libc::readv(fd, iov.as_ptr(), n) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        let r = r as usize;
        if r > frame - 4 {
            // Longer than the small buffer: its head moves to the big one, which it continues.
            let mut b = self.big_spare.take().expect("read into two buffers");
            b.data_mut()[4..frame].copy_from_slice(&p.data()[4..frame]);
            *small = Some(std::mem::replace(p, b));
        }
        Ok(r)
    }

    /// Gives a bare IP packet from `tap` its Ethernet header (to the port, from the slot's
    /// MAC), or refuses it (counted): not from the pod's address, not IP, no headroom.
    fn frame(set: &PodSet, tap: &PodTun, p: &mut Mbuf) -> bool {
        if !tap.source_ok(p.data()) {
            tap.spoofed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if !p.prepend(14) {
            return false;
        }
        eth_header(&set.mac, tap.rec.slot, p.data_mut());
        p.set_meta(PacketMeta { port: set.port, ..Default::default() });
        tap.rx.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Reads the pods' memifs.
    fn recv_memifs(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let memifs = self.set.memifs.load();
        let mut got = 0;
        for tap in memifs.iter() {
            let Some(m) = &tap.memif else { continue };
            if got >= max || !m.connected() {
                continue;
            }
            lock(&m.rx).recv(&mut self.got, (max - got).min(PER_INTERFACE));
            for mut p in self.got.drain(..) {
                if Self::frame(&self.set, tap, &mut p) {
                    out.push(p);
                    got += 1;
                } else {
                    self.refused.push(p);
                }
            }
        }
        Mbuf::free_all(&mut self.refused);
        got
    }

    /// Deals with what a packet's virtio-net header left to us (`p` framed, its IP packet at
    /// `[14..]`): a super-packet, or a packet of [`KEEP_PARTIAL_FROM`] bytes or more whose
    /// checksum was left, crosses the data plane whole (marked on it: a pods port's interface
    /// takes it so, and the worker finishes it for any other port, `crate::offload`); a
    /// shorter one gets its checksum now. False when the header does not agree with it.
    fn offloaded(tap: &PodTun, p: &mut Mbuf, h: &vectorlb_packet::vnet::VnetHdr) -> bool {
        use vectorlb_packet::vnet;
        let ip = &mut p.data_mut()[14..];
        match vnet::keepable(ip, h) {
            Ok(seg) if seg > 0 || ip.len() >= KEEP_PARTIAL_FROM => {
                if seg > 0 {
                    tap.rx_super.fetch_add(1, Ordering::Relaxed);
                }
                p.set_offload(vectorlb_io::Offload { gso_size: seg, partial: true });
                true
            }
            _ if h.gso_kind() == vnet::gso::NONE => vnet::complete_checksum(ip, h).is_ok(),
            _ => false,
        }
    }
}

impl RxQueue<Mbuf> for PodRx {
    /// Sleeps in `epoll_pwait2` on the interfaces' epoll set: a pod's packet wakes the worker
    /// at once instead of at the end of its sleep, and the events it returns are the next
    /// receive's (memifs are polled: they do not wake it). `ppoll` on the set where the kernel
    /// has no `epoll_pwait2`.
    fn idle_wait(&mut self, us: u32) -> bool {
        if self.ready > 0 {
            // Events taken and not read yet: nothing to wait for.
            return true;
        }
        let ts = libc::timespec { tv_sec: (us / 1_000_000) as libc::time_t, tv_nsec: ((us % 1_000_000) * 1000) as libc::c_long };
        if self.pwait2 {
            // SAFETY: `events` has room for its length in epoll_events, a valid timespec, no
            // signal mask; the kernel writes at most `len` events.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    self.set.epoll.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    self.events.len() as libc::c_int,
                    &ts,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if n >= 0 {
                self.ready = n as usize;
                return true;
            }
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                self.pwait2 = false;
            }
            return true;
        }
        let mut fd = libc::pollfd { fd: self.set.epoll.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) };
        true
    }

    fn recv(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let mut got = self.recv_memifs(out, max);
        let n = match std::mem::take(&mut self.ready) {
            0 => {
                // SAFETY: `events` has room for its length in epoll_events; timeout 0 never blocks.
                let n = unsafe { libc::epoll_wait(self.set.epoll.as_raw_fd(), self.events.as_mut_ptr(), self.events.len() as libc::c_int, 0) };
                if n <= 0 {
                    return got;
                }
                n as usize
            }
            n => n,
        };
        self.round += 1;
        let slots = self.set.slots.load();
        if self.visited.len() < slots.len() {
            self.visited.resize(slots.len(), 0);
            self.hot.resize(slots.len(), false);
        }
        let frame = 14 + self.set.mtu as usize;
        for i in 0..n {
            let slot = self.events[i].u64 as usize;
            let Some(Some(tap)) = slots.get(slot) else { continue };
            let hot = self.hot[slot];
            let limit = if hot { PER_INTERFACE } else { 1 };
            let mut taken = 0;
            while got < max && taken < limit {
                let mut p = match self.spare.take() {
                    Some(p) => p,
                    None => match self.pool.alloc_len(self.set.port, frame) {
                        Some(p) => p,
                        None => return got,
                    },
                };
                let (len, hdr) = if tap.vnet {
                    let mut small = None;
                    let r = self.read_vnet(tap.fd.as_raw_fd(), &mut p, &mut small, frame);
                    if let Some(s) = small {
                        self.spare = Some(s);
                    }
                    match r {
                        Ok(n) if n > vectorlb_packet::vnet::HDR_LEN => match vectorlb_packet::vnet::VnetHdr::parse(&p.data()[4..14]) {
                            Ok(h) => (n - vectorlb_packet::vnet::HDR_LEN, Some(h)),
                            Err(_) => (0, None),
                        },
                        // Nothing (or a read error: counted as a bad packet below).
                        Ok(0) => {
                            self.spare_back(p, frame);
                            break;
                        }
                        r => {
                            tap.bad_offload.fetch_add(1, Ordering::Relaxed);
                            self.spare_back(p, frame);
                            if r.is_err() {
                                break;
                            }
                            taken += 1;
                            continue;
                        }
                    }
                } else {
                    let d = p.data_mut();
                    // SAFETY: reads at most d.len() - 14 bytes into the packet's own buffer,
                    // after the 14 bytes kept for the Ethernet header; the descriptor is open
                    // (tap).
                    let r = unsafe { libc::read(tap.fd.as_raw_fd(), d[14..].as_mut_ptr().cast(), d.len() - 14) };
                    if r <= 0 {
                        self.spare = Some(p);
                        break;
                    }
                    (r as usize, None)
                };
                taken += 1;
                let d = p.data_mut();
                if len < 20 || !tap.source_ok(&d[14..14 + len]) {
                    tap.spoofed.fetch_add(1, Ordering::Relaxed);
                    self.spare_back(p, frame);
                    continue;
                }
                eth_header(&self.set.mac, tap.rec.slot, d);
                p.set_len(14 + len);
                p.set_meta(PacketMeta { port: self.set.port, ..Default::default() });
                p.set_offload(vectorlb_io::Offload::NONE);
                if let Some(h) = hdr.filter(|h| h.flags & vectorlb_packet::vnet::NEEDS_CSUM != 0 || h.gso_type != 0) {
                    if !Self::offloaded(tap, &mut p, &h) {
                        tap.bad_offload.fetch_add(1, Ordering::Relaxed);
                        self.spare_back(p, frame);
                        continue;
                    }
                }
                tap.rx.fetch_add(1, Ordering::Relaxed);
                out.push(p);
                got += 1;
            }
            // Ready again the round after a single read: read it until it is empty from now
            // on; a hot interface that had at most one packet goes back to one read a round.
            self.hot[slot] = if hot { taken > 1 } else { taken == 1 && self.visited[slot] + 1 == self.round };
            self.visited[slot] = self.round;
            if got >= max {
                break;
            }
        }
        // The spare keeps its full length for the next read.
        if let Some(p) = &mut self.spare {
            p.set_len(frame);
        }
        got
    }
}

impl PodRx {
    /// Keeps a buffer a read did not use for the next: a small one as the spare, a big one as
    /// the big spare (each at its full length), any other freed.
    fn spare_back(&mut self, mut p: Mbuf, frame: usize) {
        p.set_offload(vectorlb_io::Offload::NONE);
        if self.big_spare.is_none() && p.set_len(BIG_FRAME) {
            self.big_spare = Some(p);
        } else if self.spare.is_none() && p.set_len(frame) {
            self.spare = Some(p);
        }
    }
}

/// The transmit side of the pods port: each frame goes to the interface its destination MAC
/// names, without its Ethernet header, or to that pod's memif when its destination port is
/// one of the memif's.
pub struct PodTx {
    set: Arc<PodSet>,
    /// Frames written to interfaces (or for no pod), freed after the burst.
    done: Vec<Mbuf>,
    /// Frames for memifs this burst, by slot.
    memif: Vec<(Arc<PodTun>, Vec<Mbuf>)>,
    /// Where a super-packet is cut for an interface without offloads, or a memif.
    scratch: Vec<u8>,
    /// Buffers for a super-packet's segments bound for a memif.
    pool: Arc<dyn PacketPool<Mbuf>>,
    cut: Vec<Mbuf>,
}

impl PodTx {
    pub fn new(set: Arc<PodSet>, pool: Arc<dyn PacketPool<Mbuf>>) -> PodTx {
        PodTx { set, done: Vec::with_capacity(64), memif: Vec::new(), scratch: Vec::new(), pool, cut: Vec::new() }
    }

    /// Writes a frame's IP packet to `tap`: after a virtio-net header on an interface with
    /// offloads (what the packet left to its receiver, its checksum and segmentation, said
    /// there), completed and cut here on one without. Whether the interface took it.
    fn write(tap: &PodTun, p: &mut Mbuf, scratch: &mut Vec<u8>) -> bool {
        use vectorlb_packet::vnet::{self, VnetHdr};
        let o = p.offload();
        let fd = tap.fd.as_raw_fd();
        let d = p.data_mut();
        if tap.vnet {
            // The Ethernet header's last ten bytes become the virtio-net header.
            let h = if o.partial { vnet::offload_hdr(&mut d[14..], o.gso_size).unwrap_or_default() } else { VnetHdr::default() };
            h.emit(&mut d[4..14]).expect("ten bytes");
            // SAFETY: writes bytes of the packet's own buffer; the descriptor is open (tap).
            return unsafe { libc::write(fd, d[4..].as_ptr().cast(), d.len() - 4) } >= 0;
        }
        if o.partial {
            // Kept whole for an interface that has since lost its offloads (a pod attached
            // again without them): what its kernel would have done, done here.
            if let Ok(h) = vnet::offload_hdr(&mut d[14..], o.gso_size) {
                let mut ok = true;
                // SAFETY: writes bytes of the scratch buffer; the descriptor is open (tap).
                let cut = vnet::segment(&d[14..], &h, scratch, |s| ok &= unsafe { libc::write(fd, s.as_ptr().cast(), s.len()) } >= 0);
                return cut.is_ok() && ok;
            }
        }
        // SAFETY: writes bytes of the packet's own buffer; the descriptor is open (tap).
        unsafe { libc::write(fd, d[14..].as_ptr().cast(), d.len() - 14) >= 0 }
    }
}

impl TxQueue<Mbuf> for PodTx {
    fn send(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let slots = self.set.slots.load();
        let n = pkts.len();
        for mut p in pkts.drain(..) {
            let d = p.data();
            let tap = (d.len() > 14 && d[..2] == MAC_PREFIX).then(|| u32::from_be_bytes([d[2], d[3], d[4], d[5]])).and_then(|s| slots.get(s as usize)?.as_ref());
            let Some(tap) = tap else {
                self.set.no_pod.fetch_add(1, Ordering::Relaxed);
                self.done.push(p);
                continue;
            };
            if tap.memif.as_ref().is_some_and(|m| crate::pod_memif::steered(&m.ranges, &d[14..])) {
                // A memif takes whole packets with their checksums: what a pod left is done.
                let tap = tap.clone();
                let mut frames = std::mem::take(&mut self.cut);
                match crate::offload::finish(&mut p, &*self.pool, &mut self.scratch, &mut frames) {
                    crate::offload::Finished::Whole => frames.push(p),
                    crate::offload::Finished::Cut(_) => self.done.push(p),
                    crate::offload::Finished::Failed => {
                        tap.tx_dropped.fetch_add(1, Ordering::Relaxed);
                        self.done.push(p);
                    }
                }
                match self.memif.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &tap)) {
                    Some((_, v)) => v.append(&mut frames),
                    None => self.memif.push((tap, std::mem::take(&mut frames))),
                }
                self.cut = frames;
                continue;
            }
            if !Self::write(tap, &mut p, &mut self.scratch) {
                tap.tx_dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                tap.tx.fetch_add(1, Ordering::Relaxed);
            }
            self.done.push(p);
        }
        for (tap, mut v) in self.memif.drain(..) {
            let m = tap.memif.as_ref().expect("steered to a memif");
            let want = v.len();
            let sent = if m.connected() { lock(&m.tx).send(&mut v) } else { 0 };
            tap.tx.fetch_add(sent as u64, Ordering::Relaxed);
            tap.tx_dropped.fetch_add((want - sent) as u64, Ordering::Relaxed);
            self.done.append(&mut v);
        }
        Mbuf::free_all(&mut self.done);
        n
    }
}

/// A receive queue that never has anything (the pods port on the workers that do not read it).
pub struct NoRx;

impl RxQueue<Mbuf> for NoRx {
    fn recv(&mut self, _out: &mut Vec<Mbuf>, _max: usize) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pods port's settings for the tests: state in `state_dir`, no host interface, 4 pods.
    fn spec(state_dir: &str) -> PodsSpec {
        PodsSpec {
            state_dir: state_dir.into(),
            host_interface: String::new(),
            worker: 0,
            max_pods: 4,
            service_cidrs: Vec::new(),
            node_port_addresses: Vec::new(),
            node_port_range: "30000-32767".into(),
            egress_addresses: Vec::new(),
            cluster_cidrs: Vec::new(),
            offloads: false,
        }
    }

    fn set() -> PodSet {
        let spec = spec("/nonexistent/vectorlb-pods");
        PodSet::new(1, [2, 0x76, 0xff, 0xff, 0xff, 0xfe], 1500, vec![("10.244.1.1".parse().unwrap(), 24), ("fd00:244:1::1".parse().unwrap(), 64)], spec).unwrap()
    }

    #[test]
    fn requests_are_checked_before_anything_is_created() {
        let s = set();
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert!(s.check("abc", "eth0", &[ip("10.244.1.5"), ip("fd00:244:1::5")], 1500).is_ok());
        for (id, ifname, ips, mtu) in [
            ("", "eth0", vec![ip("10.244.1.5")], 1500),
            ("../x", "eth0", vec![ip("10.244.1.5")], 1500),
            ("abc", "eth0/x", vec![ip("10.244.1.5")], 1500),
            ("abc", "a-very-long-interface-name", vec![ip("10.244.1.5")], 1500),
            ("abc", "eth0", vec![], 1500),
            ("abc", "eth0", vec![ip("10.244.1.5"), ip("10.244.1.6")], 1500),
        ] {
            assert!(matches!(s.check(id, ifname, &ips, mtu), Err(PodError::Invalid(_))), "{id} {ifname} {ips:?}");
        }
        for (ips, mtu) in [
            (vec![ip("10.9.1.5")], 1500),
            (vec![ip("10.244.1.1")], 1500),
            (vec![ip("10.244.1.0")], 1500),
            (vec![ip("10.244.1.255")], 1500),
            (vec![ip("fd00:244:1::")], 1500),
            (vec![ip("10.244.1.5")], 9000),
            (vec![ip("fd00:244:1::5")], 1000),
        ] {
            assert!(matches!(s.check("abc", "eth0", &ips, mtu), Err(PodError::Unprocessable(_))), "{ips:?} {mtu}");
        }
    }

    #[test]
    fn a_missing_namespace_is_refused_and_nothing_is_kept() {
        let s = set();
        let rec = PodRecord {
            container_id: "gone".into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/vectorlb-no-such-ns".into(),
            ips: vec!["10.244.1.7".parse().unwrap()],
            mtu: 1500,
            slot: 0,
            pod: None,
            network: None,
            memif_ports: Vec::new(),
            host_ports: Vec::new(),
        };
        assert!(matches!(s.attach(rec, None), Err(PodError::NoNamespace(_))));
        assert!(s.all().is_empty());
        assert!(s.neighbours().is_empty());
        assert!(!s.detach("gone", "eth0").unwrap());
    }

    fn rec(id: &str, netns: &str, ip: &str, slot: u32) -> PodRecord {
        PodRecord {
            container_id: id.into(),
            ifname: "eth0".into(),
            netns: netns.into(),
            ips: vec![ip.parse().unwrap()],
            mtu: 1500,
            slot,
            pod: None,
            network: None,
            memif_ports: Vec::new(),
            host_ports: Vec::new(),
        }
    }

    #[test]
    fn a_netns_that_is_not_a_pods_namespace_is_refused_at_once() {
        let s = set();
        let dir = std::env::temp_dir().join(format!("vectorlb-pods-ns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        std::fs::write(dir.join("file"), b"x").unwrap();
        for (netns, why) in [
            (fifo.to_str().unwrap(), "not a namespace file"),
            ("/dev/null", "not a namespace file"),
            (dir.join("file").to_str().unwrap(), "not on nsfs"),
            ("/proc/self/ns/net", "the daemon's own network namespace"),
        ] {
            let t = std::time::Instant::now();
            match s.attach(rec("hostile", netns, "10.244.1.9", 0), None) {
                Err(PodError::Invalid(e)) => assert!(e.contains(why), "{netns}: {e}"),
                r => panic!("{netns}: {:?}", r.map(|t| t.rec.slot)),
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(1), "{netns} held the request");
        }
        assert!(s.all().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hostile_state_files_are_set_aside_and_a_slot_is_never_taken_as_given() {
        let dir = std::env::temp_dir().join(format!("vectorlb-pods-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let spec = spec(dir.to_str().unwrap());
        let s = PodSet::new(1, [2, 0x76, 0xff, 0xff, 0xff, 0xfe], 1500, vec![("10.244.1.1".parse().unwrap(), 24)], spec).unwrap();
        let write = |name: &str, body: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            p
        };
        let garbage = write("garbage+eth0.json", b"{ not json");
        let huge = write("huge+eth0.json", &vec![b' '; 100 << 10]);
        let target = write("elsewhere", br#"{"container_id":"x","ifname":"eth0","netns":"/nonexistent","ips":["10.244.1.8"],"mtu":1500,"slot":1}"#);
        std::os::unix::fs::symlink(&target, dir.join("link+eth0.json")).unwrap();
        // A namespace that is gone: forgotten (removed), as before.
        let gone = write("gone+eth0.json", &serde_json::to_vec(&rec("gone", "/nonexistent/netns", "10.244.1.7", 3)).unwrap());
        assert_eq!(s.restore(), (0, 1));
        for p in [&garbage, &huge, &dir.join("link+eth0.json")] {
            assert!(!p.exists() && p.with_extension("json.bad").exists(), "{} not set aside", p.display());
        }
        assert!(!gone.exists() && target.exists());
        // A slot beyond the port's (4294967295 once made the daemon allocate until it was
        // killed, at every start) is replaced by a free one. Needs a namespace of its own: root.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let ns = format!("vlbslot{}", std::process::id());
            assert!(std::process::Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success());
            write("big+eth0.json", &serde_json::to_vec(&rec("big", &format!("/var/run/netns/{ns}"), "10.244.1.6", u32::MAX)).unwrap());
            assert_eq!(s.restore(), (1, 0));
            let slots: Vec<u32> = s.all().iter().map(|t| t.rec.slot).collect();
            let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).status();
            assert_eq!(slots, vec![1], "the restored interface's slot");
        } else {
            eprintln!("not root: the slot of a restored interface is not checked here (make test runs as root)");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pod_sends_from_its_own_addresses_and_link_local_only_on_its_link() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let tap = PodTun::new(PodRecord { ips: vec!["10.244.1.5".parse().unwrap(), "fd00:244:1::5".parse().unwrap()], ..rec("p", "/x", "10.244.1.5", 1) }, fd, false, false, None);
        let v4 = |src: &str| {
            let mut p = vec![0u8; 20];
            p[0] = 0x45;
            p[12..16].copy_from_slice(&src.parse::<std::net::Ipv4Addr>().unwrap().octets());
            p
        };
        let v6 = |src: &str, dst: &str| {
            let mut p = vec![0u8; 40];
            p[0] = 0x60;
            p[8..24].copy_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
            p[24..40].copy_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
            p
        };
        assert!(tap.source_ok(&v4("10.244.1.5")));
        assert!(!tap.source_ok(&v4("10.244.1.6")));
        assert!(tap.source_ok(&v6("fd00:244:1::5", "fd00:244:1::6")));
        assert!(!tap.source_ok(&v6("fd00:244:1::6", "fd00:244:1::7")));
        // Link-local: neighbour discovery and MLD on the pod's own link, nothing routed.
        assert!(tap.source_ok(&v6("fe80::1", "ff02::2")));
        assert!(tap.source_ok(&v6("fe80::1", "ff02::16")));
        assert!(tap.source_ok(&v6("fe80::1", "fe80::76:1")));
        assert!(!tap.source_ok(&v6("fe80::dead", "fd00:244:1::6")), "a link-local source to another pod");
        assert!(!tap.source_ok(&v6("fe80::dead", "ff05::2")), "a link-local source to site-scoped multicast");
        assert!(!tap.source_ok(&v6("fe80::dead", "2001:db8::1")));
        assert!(!tap.source_ok(&[0x60; 39]), "short");
    }

    #[test]
    fn slot_macs_name_their_slot() {
        assert_eq!(slot_mac(0x0102_0304), [2, 0x76, 1, 2, 3, 4]);
        assert_eq!(slot_mac(HOST_SLOT)[..2], MAC_PREFIX);
    }
}
