//! A small, safe wrapper over DPDK 22.11 through the C shim in `csrc/shim.c`, and the XDP flow
//! director program (`csrc/vectorlb_xdp.c`) that the af_xdp PMD attaches.
//!
//! Only what vectorlb uses is wrapped: EAL start, packet mempools, ports from any device string
//! (`net_af_xdp0,iface=...`, `net_af_packet0,iface=...`, `net_memif0,...`, `net_tap0,...`, a
//! PCI address), multi-queue with RSS, link state, basic and extended counters, and rings.
//!
//! The hot path goes through the I/O seam (`vectorlb-io`): a port hands out its queues once,
//! as [`EthRx`] / [`EthTx`] handles that a worker owns (not `Clone`, `Send` but not `Sync`); a
//! hand-off ring is one [`RingRx`] (its single consumer) and any number of [`RingTx`]; mbufs
//! ([`Mbuf`]) free themselves when dropped. Every failure is an [`Error`] that says what to do.

pub mod dma;
pub mod eventdev;
mod ffi;
pub mod mbuf;
pub mod sklookup;
pub mod xdp;

pub use mbuf::Mbuf;

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vectorlb_io::{NotSync, Packet, PacketBuf, PacketMeta, PacketPool, RxQueue, TxQueue};

/// What went wrong, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the DPDK EAL is already started in this process")]
    EalStarted,
    #[error("no free huge pages: run scripts/setup.sh (or reserve some: echo 512 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages) or add --no-huge to [runtime].eal")]
    NoHugepages,
    #[error("DPDK EAL start failed: {reason}{hint}; EAL arguments: {args}")]
    EalInit { reason: String, hint: &'static str, args: String },
    #[error("{what} contains a NUL byte: {value:?}")]
    Nul { what: &'static str, value: String },
    #[error("device '{0}' did not become a DPDK port: check the interface exists, is up and is not used by another process (for AF_XDP: `ip link show`), and that the driver is installed (dpdk package)")]
    NoSuchPort(String),
    #[error("port {port} ({driver}): {asked} queues asked, the device has {rx} rx / {tx} tx (for AF_XDP give the interface more channels: ethtool -L, or queue_count=)")]
    TooManyQueues { port: u16, driver: String, asked: u16, rx: u16, tx: u16 },
    #[error("port {0}: its queues were already handed out")]
    QueuesTaken(u16),
    #[error("creating mbuf pool '{name}' ({mbufs} mbufs of {room} B): {reason} (reserve more huge pages or lower [runtime].mbufs)")]
    Pool { name: String, mbufs: u32, room: u16, reason: String },
    /// A DPDK call failed; `what` says which, `reason` is DPDK's message.
    #[error("{what}: {reason}")]
    Dpdk { what: String, reason: String },
    #[error("{path}: {source}")]
    File { path: std::path::PathBuf, source: std::io::Error },
    #[error("XDP map '{map}' on {iface}: {source} (is vectorlb's program attached? xdp_prog= in the device string)")]
    XdpMap { map: &'static str, iface: String, source: std::io::Error },
    #[error("{iface}: {what}: {source}")]
    Xdp { iface: String, what: &'static str, source: std::io::Error },
}

fn strerror(code: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::vl_strerror(code)).to_string_lossy().into_owned() }
}

fn check(what: impl FnOnce() -> String, r: i32) -> Result<(), Error> {
    if r < 0 {
        Err(Error::Dpdk { what: what(), reason: strerror(r) })
    } else {
        Ok(())
    }
}

fn cstring(what: &'static str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Nul { what, value: s.to_string() })
}

/// Whether a device string names a PCI device (`0000:01:00.0` or `01:00.0`) rather than a
/// virtual device (`net_af_xdp0,iface=eth0`).
pub fn is_pci(dev: &str) -> bool {
    let name = dev.split(',').next().unwrap_or("");
    let parts: Vec<&str> = name.split(':').collect();
    (parts.len() == 2 || parts.len() == 3) && name.contains('.') && name.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
}

/// The device's name as DPDK registers it (the part before the first comma).
pub fn device_name(dev: &str) -> &str {
    dev.split(',').next().unwrap_or(dev)
}

/// Free 2 MiB (or default-size) huge pages, from /proc/meminfo.
pub fn free_hugepages() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("HugePages_Free:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

static EAL_STARTED: AtomicBool = AtomicBool::new(false);

/// The started environment abstraction layer. There is one per process. Pools, ports and
/// rings each hold an `Arc` of it, so `rte_eal_cleanup` runs only after the last of them is
/// gone. Mbufs do not (a reference count per packet would cost too much): an `Mbuf` must not
/// outlive every pool, port and ring of its process, which holds wherever packets stay in
/// queues, rings and worker loops (they are dropped before their ports).
pub struct Eal {
    _private: (),
}

impl Eal {
    /// Starts the EAL with `args` (the usual EAL options) and the given devices: PCI addresses
    /// become `-a`, everything else `--vdev`. Without a PCI device the PCI bus is not scanned.
    pub fn init(args: &[String], devices: &[String]) -> Result<Arc<Eal>, Error> {
        if EAL_STARTED.swap(true, Ordering::SeqCst) {
            return Err(Error::EalStarted);
        }
        let no_huge = args.iter().any(|a| a == "--no-huge");
        if !no_huge && free_hugepages() == 0 {
            EAL_STARTED.store(false, Ordering::SeqCst);
            return Err(Error::NoHugepages);
        }
        let mut argv: Vec<String> = vec!["vectorlb".into()];
        argv.extend(args.iter().cloned());
        let mut any_pci = false;
        for d in devices {
            if is_pci(d) {
                any_pci = true;
                argv.push("-a".into());
            } else {
                argv.push("--vdev".into());
            }
            argv.push(d.clone());
        }
        if !any_pci && !args.iter().any(|a| a == "--no-pci" || a == "-a" || a.starts_with("--allow")) {
            argv.push("--no-pci".into());
        }
        let cargs: Vec<CString> = argv.iter().map(|a| cstring("an EAL argument", a)).collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*mut c_char> = cargs.iter().map(|c| c.as_ptr() as *mut c_char).collect();
        ptrs.push(std::ptr::null_mut());
        // SAFETY: argv pointers stay valid for the call (cargs outlives it); EAL may keep
        // pointers to them, so they are leaked below.
        let r = unsafe { ffi::vl_eal_init(argv.len() as i32, ptrs.as_mut_ptr()) };
        std::mem::forget(cargs);
        if r < 0 {
            EAL_STARTED.store(false, Ordering::SeqCst);
            let hint = match -r {
                libc::EACCES => " (run as root)",
                libc::EALREADY => " (already started)",
                libc::ENOMEM => " (not enough huge page memory: reserve more huge pages)",
                libc::ENODEV | libc::ENOENT => " (a device could not be probed: check the interface exists and is not used by another process)",
                _ => "",
            };
            return Err(Error::EalInit { reason: strerror(r), hint, args: argv[1..].join(" ") });
        }
        Ok(Arc::new(Eal { _private: () }))
    }

    /// Registers the calling (non-EAL) thread so that it gets an lcore id and mempool caches.
    pub fn register_thread(&self) -> Result<(), Error> {
        // SAFETY: plain call; the EAL is started.
        check(|| "registering a worker thread with DPDK".into(), unsafe { ffi::vl_thread_register() })
    }

    pub fn unregister_thread(&self) {
        // SAFETY: plain call; a thread that was not registered is ignored by DPDK.
        unsafe { ffi::vl_thread_unregister() }
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: pools, ports and rings hold an Arc of the EAL, so none is left; mbufs are
        // gone with them (see the type's documentation).
        unsafe { ffi::vl_eal_cleanup() };
    }
}

/// A packet mbuf pool. Pools live until the EAL is cleaned up.
pub struct Mempool {
    ptr: NonNull<ffi::RteMempool>,
    _eal: Arc<Eal>,
}

// SAFETY: rte_mempool is thread-safe (per-lcore caches, a lock-free ring behind them).
unsafe impl Send for Mempool {}
// SAFETY: as above; every operation through &Mempool is one of DPDK's thread-safe ones.
unsafe impl Sync for Mempool {}

impl Mempool {
    pub fn new(eal: &Arc<Eal>, name: &str, mbufs: u32, cache: u32, data_room: u16) -> Result<Mempool, Error> {
        let cname = cstring("a pool name", name)?;
        let mut err = 0;
        // SAFETY: valid C string; err is a valid out pointer.
        let p = unsafe { ffi::vl_pool_create(cname.as_ptr(), mbufs, cache, data_room, -1, &mut err) };
        NonNull::new(p).map(|ptr| Mempool { ptr, _eal: eal.clone() }).ok_or_else(|| Error::Pool { name: name.to_string(), mbufs, room: data_room, reason: strerror(err) })
    }

    pub fn available(&self) -> u32 {
        // SAFETY: valid pool.
        unsafe { ffi::vl_pool_avail(self.ptr.as_ptr()) }
    }

    /// A fresh single-segment mbuf, or `None` when the pool is empty.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: valid pool; the result is a fresh mbuf we own.
        NonNull::new(unsafe { ffi::vl_mbuf_alloc(self.ptr.as_ptr()) }).map(|p| unsafe { Mbuf::from_raw(p.cast()) })
    }

    pub(crate) fn raw(&self) -> *mut ffi::RteMempool {
        self.ptr.as_ptr()
    }
}

impl PacketPool<Mbuf> for Mempool {
    fn alloc_frame(&self, port: u16, frame: &[u8]) -> Option<Mbuf> {
        let mut m = self.alloc()?;
        if !m.load(frame) {
            return None;
        }
        m.set_meta(PacketMeta { port, ..Default::default() });
        Some(m)
    }

    fn alloc_bulk(&self, n: usize, out: &mut Vec<Mbuf>) -> usize {
        out.reserve(n);
        let len = out.len();
        // SAFETY: a valid pool; `out` has room for n more elements, and Mbuf is a
        // repr(transparent) non-null pointer, so DPDK writes n mbuf pointers straight into the
        // vector's spare capacity. On success all n are fresh mbufs we own and become the
        // vector's; on failure none was taken and the length stays.
        unsafe {
            if ffi::vl_mbuf_alloc_bulk(self.ptr.as_ptr(), out.as_mut_ptr().add(len) as *mut *mut ffi::RteMbuf, n as u32) != 0 {
                return 0;
            }
            out.set_len(len + n);
        }
        n
    }

    fn alloc_len(&self, port: u16, len: usize) -> Option<Mbuf> {
        let mut m = self.alloc()?;
        if !m.set_len(len) {
            return None;
        }
        m.set_meta(PacketMeta { port, ..Default::default() });
        Some(m)
    }
}

#[derive(Debug, Clone, Default)]
pub struct PortInfo {
    pub driver: String,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub max_rx_pktlen: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Link {
    pub up: bool,
    pub speed_mbps: u32,
}

/// The port's basic counters (`rte_eth_stats`).
pub use ffi::VlStats as PortStats;

/// One DPDK ethernet port. Configuration, counters and link state are read through `&self`
/// from any thread; packets move only through the queue handles of [`EthPort::queues`], which
/// can be taken once. The port is stopped and closed when the last handle (the `Arc` and the
/// queues) is dropped.
pub struct EthPort {
    id: u16,
    queues: AtomicBool,
    started: AtomicBool,
    nqueues: std::sync::atomic::AtomicU16,
    _eal: Arc<Eal>,
}

impl EthPort {
    /// The port of device string `dev` (the EAL must have been started with it).
    pub fn find(eal: &Arc<Eal>, dev: &str) -> Result<EthPort, Error> {
        let name = device_name(dev);
        let cname = cstring("a device name", name)?;
        let mut id = 0u16;
        // SAFETY: valid C string and out pointer.
        let r = unsafe { ffi::vl_port_by_name(cname.as_ptr(), &mut id) };
        if r < 0 {
            return Err(Error::NoSuchPort(name.to_string()));
        }
        Ok(EthPort { id, queues: AtomicBool::new(false), started: AtomicBool::new(false), nqueues: Default::default(), _eal: eal.clone() })
    }

    /// DPDK's port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn info(&self) -> Result<PortInfo, Error> {
        let mut i = ffi::VlPortInfo::default();
        // SAFETY: valid out pointer.
        check(|| format!("port {}: device info", self.id), unsafe { ffi::vl_port_info(self.id, &mut i) })?;
        Ok(PortInfo { driver: cstr_bytes(&i.driver), max_rx_queues: i.max_rx_queues, max_tx_queues: i.max_tx_queues, max_rx_pktlen: i.max_rx_pktlen })
    }

    /// Configures `queues` rx and tx queues (RSS across the rx queues when above one), sets
    /// the MTU when the driver allows, and sets the queues up with `desc` descriptors each.
    pub fn setup(&self, queues: u16, desc: u16, pool: &Mempool, mtu: u16) -> Result<(), Error> {
        let info = self.info()?;
        if queues > info.max_rx_queues || queues > info.max_tx_queues {
            return Err(Error::TooManyQueues { port: self.id, driver: info.driver, asked: queues, rx: info.max_rx_queues, tx: info.max_tx_queues });
        }
        let hint = if info.driver == "net_af_xdp" {
            " (is an XDP program already attached to the interface, by another vectorlb or another tool? `ip link show` lists it; `ip link set dev IFACE xdp off` removes it)"
        } else {
            ""
        };
        // SAFETY: plain calls on a valid port id; the pool outlives the port's use (pools live
        // until the EAL is cleaned up).
        unsafe {
            check(|| format!("port {}: configure", self.id), ffi::vl_port_configure(self.id, queues, queues, mtu))?;
            for q in 0..queues {
                check(|| format!("port {}: rx queue {q}{hint}", self.id), ffi::vl_rx_queue_setup(self.id, q, desc, -1, pool.raw()))?;
                check(|| format!("port {}: tx queue {q}", self.id), ffi::vl_tx_queue_setup(self.id, q, desc, -1))?;
            }
        }
        self.nqueues.store(queues, Ordering::SeqCst);
        Ok(())
    }

    pub fn start(&self) -> Result<(), Error> {
        // SAFETY: plain call.
        check(|| format!("port {}: start (is the interface in use by another program?)", self.id), unsafe { ffi::vl_port_start(self.id) })?;
        self.started.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The receive and transmit handle of every queue, in queue order. Only once per port:
    /// each handle is the only way to its queue.
    pub fn queues(self: &Arc<Self>) -> Result<Vec<(EthRx, EthTx)>, Error> {
        if self.queues.swap(true, Ordering::SeqCst) {
            return Err(Error::QueuesTaken(self.id));
        }
        let n = self.nqueues.load(Ordering::SeqCst);
        Ok((0..n)
            .map(|q| (EthRx { port: self.clone(), queue: q, count: true, _not_sync: NotSync::default() }, EthTx { port: self.clone(), queue: q, _not_sync: NotSync::default() }))
            .collect())
    }

    pub fn promiscuous(&self, on: bool) -> Result<(), Error> {
        // SAFETY: plain call.
        let r = unsafe { ffi::vl_promiscuous(self.id, on as i32) };
        if r == -libc::ENOTSUP {
            return Ok(());
        }
        check(|| format!("port {}: promiscuous mode", self.id), r)
    }

    /// Installs a flow rule that sends the packets toward `dst` (address, protocol, port; `None`:
    /// every packet) to `queues` (one queue, or RSS over several). `Err` holds the driver's
    /// reason (most software ports have no flow rules).
    pub fn flow_to_queues(self: &Arc<Self>, priority: u32, dst: Option<(std::net::IpAddr, u8, u16)>, queues: &[u16]) -> Result<FlowRule, String> {
        if queues.is_empty() || queues.len() > u16::MAX as usize {
            return Err("no queues".into());
        }
        let (family, proto, addr, port) = match dst {
            None => (0u8, 0u8, [0u8; 16], 0u16),
            Some((std::net::IpAddr::V4(a), p, port)) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                (4, p, b, port)
            }
            Some((std::net::IpAddr::V6(a), p, port)) => (6, p, a.octets(), port),
        };
        let mut err = [0 as std::os::raw::c_char; 256];
        // SAFETY: addr has 16 bytes, queues `queues.len()` entries, err its length; the driver
        // copies what it keeps of them.
        let f = unsafe { ffi::vl_flow_queues(self.id, priority, family, proto, addr.as_ptr(), port, queues.as_ptr(), queues.len() as u16, err.as_mut_ptr(), err.len() as i32) };
        match NonNull::new(f) {
            Some(flow) => Ok(FlowRule { port: self.clone(), flow }),
            // SAFETY: the shim NUL-terminated err within its length.
            None => Err(unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned()),
        }
    }

    pub fn mac(&self) -> Result<[u8; 6], Error> {
        let mut m = [0u8; 6];
        // SAFETY: 6-byte out buffer.
        check(|| format!("port {}: MAC address", self.id), unsafe { ffi::vl_port_mac(self.id, m.as_mut_ptr()) })?;
        Ok(m)
    }

    /// Makes the port receive frames for `mac`: sets it as the device's address, or, where the
    /// driver cannot, turns on promiscuous mode. Returns whether promiscuous mode was needed.
    pub fn use_mac(&self, mac: [u8; 6]) -> Result<bool, Error> {
        if self.mac()? == mac {
            return Ok(false);
        }
        // SAFETY: 6-byte buffer.
        if unsafe { ffi::vl_set_mac(self.id, mac.as_ptr()) } == 0 {
            return Ok(false);
        }
        self.promiscuous(true)?;
        Ok(true)
    }

    pub fn link(&self) -> Link {
        let (mut speed, mut up) = (0u32, 0i32);
        // SAFETY: valid out pointers.
        if unsafe { ffi::vl_link(self.id, &mut speed, &mut up) } < 0 {
            return Link::default();
        }
        Link { up: up != 0, speed_mbps: speed }
    }

    pub fn stats(&self) -> PortStats {
        let mut s = PortStats::default();
        // SAFETY: valid out pointer.
        unsafe { ffi::vl_stats(self.id, &mut s) };
        s
    }

    /// The driver's extended counters, by name.
    pub fn xstats(&self) -> Vec<(String, u64)> {
        for _ in 0..3 {
            // SAFETY: a null names pointer asks for the count only.
            let n = unsafe { ffi::vl_xstats(self.id, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
            if n <= 0 {
                return Vec::new();
            }
            let n = n as usize;
            let mut names = vec![0u8; 64 * n];
            let mut values = vec![0u64; n];
            // SAFETY: buffers sized for n entries.
            let got = unsafe { ffi::vl_xstats(self.id, names.as_mut_ptr() as *mut c_char, values.as_mut_ptr(), n as i32) };
            if got < 0 || got as usize > n {
                continue;
            }
            return (0..got as usize).map(|i| (cstr_bytes(&names[64 * i..64 * (i + 1)]), values[i])).collect();
        }
        Vec::new()
    }
}

impl Drop for EthPort {
    fn drop(&mut self) {
        if self.started.load(Ordering::SeqCst) {
            // SAFETY: no queue handle is left (each holds an Arc of this port), so nothing
            // polls the port while it stops.
            unsafe {
                ffi::vl_port_stop(self.id);
                ffi::vl_port_close(self.id);
            }
        }
    }
}

/// A flow rule of a port; dropping it removes the rule.
pub struct FlowRule {
    port: Arc<EthPort>,
    flow: NonNull<libc::c_void>,
}

// SAFETY: rte_flow calls on a port may come from any thread (the driver serialises them); the
// handle is only passed back to the port's rte_flow_destroy.
unsafe impl Send for FlowRule {}
// SAFETY: as above; a shared FlowRule allows no call.
unsafe impl Sync for FlowRule {}

impl Drop for FlowRule {
    fn drop(&mut self) {
        // SAFETY: the handle came from rte_flow_create on this port and is destroyed once.
        unsafe { ffi::vl_flow_destroy(self.port.id, self.flow.as_ptr()) };
    }
}

/// The receive side of one queue of a port: owned by one worker.
pub struct EthRx {
    port: Arc<EthPort>,
    queue: u16,
    /// Whether the driver may count what waits on the queue (false once it said it cannot).
    count: bool,
    _not_sync: NotSync,
}

/// The transmit side of one queue of a port: owned by one worker.
pub struct EthTx {
    port: Arc<EthPort>,
    queue: u16,
    _not_sync: NotSync,
}

impl EthRx {
    pub fn port(&self) -> &EthPort {
        &self.port
    }
}

impl EthTx {
    pub fn port(&self) -> &EthPort {
        &self.port
    }
}

impl RxQueue<Mbuf> for EthRx {
    #[inline]
    fn recv(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        out.reserve(max);
        let len = out.len();
        let want = max.min(u16::MAX as usize) as u16;
        // SAFETY: this handle is the only one for (port, queue), so the non-thread-safe
        // rx_burst runs on one thread at a time; the driver writes at most `want` valid mbuf
        // pointers into the spare capacity, and Mbuf is a transparent non-null mbuf pointer,
        // so the first n spare slots become initialised, owned Mbufs.
        let n = unsafe {
            let n = ffi::vl_rx_burst(self.port.id, self.queue, out.as_mut_ptr().add(len) as *mut *mut ffi::RteMbuf, want) as usize;
            out.set_len(len + n);
            n
        };
        for m in &mut out[len..] {
            m.stamp_queue(self.queue);
        }
        n
    }

    fn backlog(&mut self) -> Option<usize> {
        if !self.count {
            return None;
        }
        // SAFETY: a query of a started port's queue, on the queue's only thread.
        let n = unsafe { ffi::vl_rx_queue_count(self.port.id, self.queue) };
        if n < 0 {
            self.count = false;
            return None;
        }
        Some(n as usize)
    }
}

impl TxQueue<Mbuf> for EthTx {
    #[inline]
    fn send(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let want = pkts.len().min(u16::MAX as usize) as u16;
        // SAFETY: one thread per queue (this handle is unique); Mbuf is a transparent pointer,
        // and the driver takes ownership of the first n.
        let n = unsafe { ffi::vl_tx_burst(self.port.id, self.queue, pkts.as_mut_ptr() as *mut *mut ffi::RteMbuf, want) as usize };
        forget_front(pkts, n);
        n
    }
}

/// Removes the first `n` packets of `v` without dropping them (their ownership has passed to
/// a driver or a ring).
fn forget_front(v: &mut Vec<Mbuf>, n: usize) {
    debug_assert!(n <= v.len());
    let rest = v.len() - n;
    // SAFETY: the first n elements are no longer ours (not dropped); the remaining `rest`
    // initialised elements move to the front (ptr::copy handles the overlap), and the length
    // shrinks to them.
    unsafe {
        std::ptr::copy(v.as_ptr().add(n), v.as_mut_ptr(), rest);
        v.set_len(rest);
    }
}

fn cstr_bytes(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

struct RingInner {
    ptr: NonNull<ffi::RteRing>,
    _eal: Arc<Eal>,
}

// SAFETY: rte_ring is lock-free; it is created multi-producer / single-consumer, and the single
// consumer is guaranteed by RingRx being unique (not Clone).
unsafe impl Send for RingInner {}
// SAFETY: as above.
unsafe impl Sync for RingInner {}

impl Drop for RingInner {
    fn drop(&mut self) {
        let mut left: Vec<Mbuf> = Vec::with_capacity(64);
        // Free what is still queued, then the ring.
        loop {
            // SAFETY: the last handle is gone, so nothing else dequeues; the ring holds owned
            // mbuf pointers, written into spare capacity as in EthRx::recv.
            let n = unsafe {
                let n = ffi::vl_ring_dequeue_burst(self.ptr.as_ptr(), left.as_mut_ptr() as *mut *mut libc::c_void, 64, std::ptr::null_mut()) as usize;
                left.set_len(n);
                n
            };
            if n == 0 {
                break;
            }
            Mbuf::free_all(&mut left);
        }
        // SAFETY: the ring was created by vl_ring_create and is empty and unused.
        unsafe { ffi::vl_ring_free(self.ptr.as_ptr()) }
    }
}

/// The consuming side of a hand-off ring: one per ring, owned by the worker it feeds.
pub struct RingRx {
    ring: Arc<RingInner>,
    /// What the ring held after the last dequeue.
    left: u32,
    _not_sync: NotSync,
}

/// A producing side of a hand-off ring; clone one for each producer.
#[derive(Clone)]
pub struct RingTx {
    ring: Arc<RingInner>,
}

/// A ring of `count` packets (rounded up to a power of two) with many producers and one
/// consumer.
pub fn ring(eal: &Arc<Eal>, name: &str, count: u32) -> Result<(RingTx, RingRx), Error> {
    let cname = cstring("a ring name", name)?;
    let mut err = 0;
    // SAFETY: valid C string and out pointer.
    let p = unsafe { ffi::vl_ring_create(cname.as_ptr(), count.next_power_of_two(), -1, &mut err) };
    let ptr = NonNull::new(p).ok_or_else(|| Error::Dpdk { what: format!("creating ring '{name}'"), reason: strerror(err) })?;
    let ring = Arc::new(RingInner { ptr, _eal: eal.clone() });
    Ok((RingTx { ring: ring.clone() }, RingRx { ring, left: 0, _not_sync: NotSync::default() }))
}

impl TxQueue<Mbuf> for RingTx {
    fn send(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        // SAFETY: multi-producer enqueue is thread-safe; ownership of the first n passes to
        // the ring.
        let n = unsafe { ffi::vl_ring_enqueue_burst(self.ring.ptr.as_ptr(), pkts.as_mut_ptr() as *mut *mut libc::c_void, pkts.len() as u32) as usize };
        forget_front(pkts, n);
        n
    }
}

impl RxQueue<Mbuf> for RingRx {
    fn recv(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        out.reserve(max);
        let len = out.len();
        let want = max as u32;
        // SAFETY: this is the ring's only consumer (RingRx is unique); the ring holds owned
        // mbuf pointers, written into spare capacity as in EthRx::recv.
        unsafe {
            let n = ffi::vl_ring_dequeue_burst(self.ring.ptr.as_ptr(), out.as_mut_ptr().add(len) as *mut *mut libc::c_void, want, &mut self.left) as usize;
            out.set_len(len + n);
            n
        }
    }

    fn backlog(&mut self) -> Option<usize> {
        Some(self.left as usize)
    }
}
