//! A small, safe wrapper over DPDK 22.11 through the C shim in `csrc/shim.c`, and the XDP flow
//! director program (`csrc/vectorlb_xdp.c`) that the af_xdp PMD attaches.
//!
//! Only what vectorlb uses is wrapped: EAL start, packet mempools, ports from any device string
//! (`net_af_xdp0,iface=...`, `net_af_packet0,iface=...`, `net_memif0,...`, `net_tap0,...`, a
//! PCI address), multi-queue with RSS, rx/tx bursts, link state, basic and extended counters,
//! and rings. Every failure is a one-line [`Error`] that says what to do.

mod ffi;
pub mod mbuf;
pub mod xdp;

pub use mbuf::Mbuf;

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn strerror(code: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::vl_strerror(code)).to_string_lossy().into_owned() }
}

fn check(what: impl FnOnce() -> String, r: i32) -> Result<(), Error> {
    if r < 0 {
        Err(Error(format!("{}: {}", what(), strerror(r))))
    } else {
        Ok(())
    }
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
    text.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

static EAL_STARTED: AtomicBool = AtomicBool::new(false);

/// The started environment abstraction layer. There is one per process.
pub struct Eal {
    _private: (),
}

impl Eal {
    /// Starts the EAL with `args` (the usual EAL options) and the given devices: PCI addresses
    /// become `-a`, everything else `--vdev`. Without a PCI device the PCI bus is not scanned.
    pub fn init(args: &[String], devices: &[String]) -> Result<Eal, Error> {
        if EAL_STARTED.swap(true, Ordering::SeqCst) {
            return Err(Error("the DPDK EAL is already started in this process".into()));
        }
        let no_huge = args.iter().any(|a| a == "--no-huge");
        if !no_huge && free_hugepages() == 0 {
            EAL_STARTED.store(false, Ordering::SeqCst);
            return Err(Error(
                "no free huge pages: run scripts/setup.sh (or reserve some: echo 512 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages) or add --no-huge to [runtime].eal".into(),
            ));
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
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_str()).map_err(|_| Error(format!("EAL argument {a:?} contains a NUL byte"))))
            .collect::<Result<_, _>>()?;
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
            return Err(Error(format!("DPDK EAL start failed: {}{hint}; EAL arguments: {}", strerror(r), argv[1..].join(" "))));
        }
        Ok(Eal { _private: () })
    }

    /// Registers the calling (non-EAL) thread so that it gets an lcore id and mempool caches.
    pub fn register_thread(&self) -> Result<(), Error> {
        // SAFETY: plain call; the EAL is started.
        check(|| "registering a worker thread with DPDK".into(), unsafe { ffi::vl_thread_register() })
    }

    pub fn unregister_thread(&self) {
        // SAFETY: plain call.
        unsafe { ffi::vl_thread_unregister() }
    }

    pub fn socket_id(&self) -> i32 {
        // SAFETY: plain call.
        unsafe { ffi::vl_socket_id() }
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: every port and pool user is gone when the Eal is dropped (the daemon drops it
        // last).
        unsafe { ffi::vl_eal_cleanup() };
    }
}

/// A packet mbuf pool.
pub struct Mempool {
    ptr: NonNull<ffi::RteMempool>,
}

// SAFETY: rte_mempool is thread-safe (per-lcore caches, a lock-free ring behind them).
unsafe impl Send for Mempool {}
unsafe impl Sync for Mempool {}

impl Mempool {
    pub fn new(_eal: &Eal, name: &str, mbufs: u32, cache: u32, data_room: u16) -> Result<Mempool, Error> {
        let cname = CString::new(name).map_err(|_| Error("pool name contains NUL".into()))?;
        let mut err = 0;
        // SAFETY: valid C string; err is a valid out pointer.
        let p = unsafe { ffi::vl_pool_create(cname.as_ptr(), mbufs, cache, data_room, -1, &mut err) };
        NonNull::new(p).map(|ptr| Mempool { ptr }).ok_or_else(|| {
            Error(format!(
                "creating mbuf pool '{name}' ({mbufs} mbufs of {data_room} B): {} (reserve more huge pages or lower [runtime].mbufs)",
                strerror(err)
            ))
        })
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

/// One DPDK ethernet port (its id). Queue use is the caller's discipline: each queue is used by
/// one thread at a time (vectorlb gives each worker its own queue on every port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub id: u16,
}

impl Port {
    /// The port of device string `dev` (the EAL must have been started with it).
    pub fn find(_eal: &Eal, dev: &str) -> Result<Port, Error> {
        let name = device_name(dev);
        let cname = CString::new(name).map_err(|_| Error("device name contains NUL".into()))?;
        let mut id = 0u16;
        // SAFETY: valid C string and out pointer.
        let r = unsafe { ffi::vl_port_by_name(cname.as_ptr(), &mut id) };
        if r < 0 {
            return Err(Error(format!(
                "device '{name}' did not become a DPDK port: check the interface exists, is up and is not used by another process (for AF_XDP: `ip link show`), and that the driver is installed (dpdk package)"
            )));
        }
        Ok(Port { id })
    }

    pub fn info(&self) -> Result<PortInfo, Error> {
        let mut i = ffi::VlPortInfo::default();
        // SAFETY: valid out pointer.
        check(|| format!("port {}: device info", self.id), unsafe { ffi::vl_port_info(self.id, &mut i) })?;
        Ok(PortInfo {
            driver: cstr_bytes(&i.driver),
            max_rx_queues: i.max_rx_queues,
            max_tx_queues: i.max_tx_queues,
            max_rx_pktlen: i.max_rx_pktlen,
        })
    }

    /// Configures `queues` rx and tx queues (RSS across the rx queues when above one), sets
    /// the MTU when the driver allows, and sets the queues up with `desc` descriptors each.
    pub fn setup(&self, queues: u16, desc: u16, pool: &Mempool, mtu: u16) -> Result<(), Error> {
        let info = self.info()?;
        if queues > info.max_rx_queues || queues > info.max_tx_queues {
            return Err(Error(format!(
                "port {} ({}): {queues} queues asked, the device has {} rx / {} tx (for AF_XDP give the interface more channels: ethtool -L, or queue_count=)",
                self.id, info.driver, info.max_rx_queues, info.max_tx_queues
            )));
        }
        // SAFETY: plain calls on a valid port id; the pool outlives the port's use.
        unsafe {
            check(|| format!("port {}: configure", self.id), ffi::vl_port_configure(self.id, queues, queues, mtu))?;
            for q in 0..queues {
                let hint = if info.driver == "net_af_xdp" {
                    " (is an XDP program already attached to the interface, by another vectorlb or another tool? `ip link show` lists it; `ip link set dev IFACE xdp off` removes it)"
                } else {
                    ""
                };
                check(|| format!("port {}: rx queue {q}{hint}", self.id), ffi::vl_rx_queue_setup(self.id, q, desc, -1, pool.raw()))?;
                check(|| format!("port {}: tx queue {q}", self.id), ffi::vl_tx_queue_setup(self.id, q, desc, -1))?;
            }
        }
        Ok(())
    }

    pub fn start(&self) -> Result<(), Error> {
        // SAFETY: plain call.
        check(|| format!("port {}: start (is the interface in use by another program?)", self.id), unsafe { ffi::vl_port_start(self.id) })
    }

    pub fn stop(&self) {
        // SAFETY: plain calls.
        unsafe {
            ffi::vl_port_stop(self.id);
            ffi::vl_port_close(self.id);
        }
    }

    pub fn promiscuous(&self, on: bool) -> Result<(), Error> {
        // SAFETY: plain call.
        let r = unsafe { ffi::vl_promiscuous(self.id, on as i32) };
        if r == -libc::ENOTSUP {
            return Ok(());
        }
        check(|| format!("port {}: promiscuous mode", self.id), r)
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

    /// Receives up to `out.len()` packets from queue `q`. Returns how many were written.
    #[inline(always)]
    pub fn rx(&self, q: u16, out: &mut [Option<Mbuf>]) -> usize {
        // SAFETY: Option<Mbuf> has the layout of a nullable mbuf pointer (Mbuf is a transparent
        // NonNull); the driver writes n valid mbuf pointers we then own.
        unsafe { ffi::vl_rx_burst(self.id, q, out.as_mut_ptr() as *mut *mut ffi::RteMbuf, out.len().min(u16::MAX as usize) as u16) as usize }
    }

    /// Sends the packets; returns how many the driver took. The caller still owns the rest.
    #[inline(always)]
    pub fn tx(&self, q: u16, pkts: &mut [Mbuf]) -> usize {
        // SAFETY: Mbuf is a transparent non-null mbuf pointer; ownership of the first n passes
        // to the driver.
        unsafe { ffi::vl_tx_burst(self.id, q, pkts.as_mut_ptr() as *mut *mut ffi::RteMbuf, pkts.len().min(u16::MAX as usize) as u16) as usize }
    }
}

fn cstr_bytes(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Frees packets back to their pools.
#[inline]
pub fn free_bulk(pkts: &mut [Mbuf]) {
    if pkts.is_empty() {
        return;
    }
    // SAFETY: we own these mbufs and do not use them again (the caller clears its list).
    unsafe { ffi::vl_mbuf_free_bulk(pkts.as_mut_ptr() as *mut *mut ffi::RteMbuf, pkts.len() as u32) }
}

/// A multi-producer, single-consumer ring of packets (hand-off between workers).
pub struct Ring {
    ptr: NonNull<ffi::RteRing>,
}

// SAFETY: rte_ring is lock-free and created multi-producer / single-consumer; the single
// consumer is the owning worker (the daemon's discipline).
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    pub fn new(_eal: &Eal, name: &str, count: u32) -> Result<Ring, Error> {
        let cname = CString::new(name).map_err(|_| Error("ring name contains NUL".into()))?;
        let mut err = 0;
        // SAFETY: valid C string and out pointer.
        let p = unsafe { ffi::vl_ring_create(cname.as_ptr(), count.next_power_of_two(), -1, &mut err) };
        NonNull::new(p).map(|ptr| Ring { ptr }).ok_or_else(|| Error(format!("creating ring '{name}': {}", strerror(err))))
    }

    /// Enqueues as many as fit; returns how many (the caller keeps the rest).
    pub fn enqueue(&self, pkts: &mut [Mbuf]) -> usize {
        // SAFETY: transparent pointers; ownership of the enqueued ones passes to the ring.
        unsafe { ffi::vl_ring_enqueue_burst(self.ptr.as_ptr(), pkts.as_mut_ptr() as *mut *mut libc::c_void, pkts.len() as u32) as usize }
    }

    /// Dequeues up to `out.len()`; only the ring's single consumer may call this.
    pub fn dequeue(&self, out: &mut [Option<Mbuf>]) -> usize {
        // SAFETY: as Port::rx.
        unsafe { ffi::vl_ring_dequeue_burst(self.ptr.as_ptr(), out.as_mut_ptr() as *mut *mut libc::c_void, out.len() as u32) as usize }
    }
}
