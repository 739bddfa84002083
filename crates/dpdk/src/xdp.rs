//! The XDP flow director: our program (built from `csrc/vectorlb_xdp.c` by build.rs) and the
//! maps through which the daemon tells it which addresses are the load balancer's.

use crate::{ffi, Error};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The compiled BPF object, embedded so that the binary needs nothing beside it.
pub static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vectorlb_xdp.o"));

/// Traffic to this address goes to the data plane.
pub const FLAG_DST: u32 = 1;
/// Traffic from this address goes to the data plane (a NAT backend's replies).
pub const FLAG_SRC: u32 = 2;
/// The host kernel's own address: traffic to it stays with the kernel, even from a NAT
/// backend or an SNAT source (the host's health checks and pings get their answers).
pub const FLAG_HOST: u32 = 4;
/// The name of our program, as the kernel reports it (the function's name, cut at 15).
pub const PROGRAM_NAME: &str = "vl_xdp";

/// The decapsulator TUN-mode backends attach (`vectorlb decap`; `csrc/vectorlb_decap.c`).
pub static DECAP_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vectorlb_decap.o"));
pub const DECAP_PROGRAM: &str = "vectorlb_decap";

/// The XDP program attached to an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub id: u32,
    pub name: String,
}

impl Attached {
    /// Whether it is vectorlb's flow director.
    pub fn is_ours(&self) -> bool {
        self.name == PROGRAM_NAME
    }
}

/// The XDP program attached to `ifname`, if any.
pub fn attached(ifname: &str) -> Result<Option<Attached>, Error> {
    let cif = crate::cstring("an interface name", ifname)?;
    let mut name = [0 as std::os::raw::c_char; 32];
    // SAFETY: valid C string; `name` has the length passed and is NUL-terminated by the shim.
    let r = unsafe { ffi::vl_xdp_prog(cif.as_ptr(), name.as_mut_ptr(), name.len() as i32) };
    if r < 0 {
        return Err(Error::Xdp { iface: ifname.to_string(), what: "querying its XDP program", source: std::io::Error::from_raw_os_error(-r) });
    }
    if r == 0 {
        return Ok(None);
    }
    // SAFETY: the shim NUL-terminated `name` within its length.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    Ok(Some(Attached { id: r as u32, name }))
}

/// Detaches the XDP program of `ifname`.
pub fn detach(ifname: &str) -> Result<(), Error> {
    let cif = crate::cstring("an interface name", ifname)?;
    // SAFETY: valid C string.
    let r = unsafe { ffi::vl_xdp_detach(cif.as_ptr()) };
    if r < 0 {
        return Err(Error::Xdp { iface: ifname.to_string(), what: "detaching its XDP program", source: std::io::Error::from_raw_os_error(-r) });
    }
    Ok(())
}

/// Writes the object to `dir` (once per process) and returns its path, for `xdp_prog=`.
pub fn write_object(dir: &Path) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { path: dir.to_path_buf(), source })?;
    let path = dir.join(format!("vectorlb_xdp.{}.o", std::process::id()));
    std::fs::write(&path, OBJECT).map_err(|source| Error::File { path: path.clone(), source })?;
    Ok(path)
}

fn family_addr(a: IpAddr) -> (u8, [u8; 16]) {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(x) => {
            b[..4].copy_from_slice(&x.octets());
            (4, b)
        }
        IpAddr::V6(x) => (6, x.octets()),
    }
}

/// Where the program's maps are: the program attached to an interface (`&str`, its name), or
/// an object loaded by a test ([`Loaded`]).
pub trait Maps {
    /// A descriptor of the map `name`.
    fn map(&self, name: &'static str) -> Result<OwnedFd, Error>;
    /// The interface, for errors.
    fn label(&self) -> String;
}

impl Maps for str {
    fn map(&self, name: &'static str) -> Result<OwnedFd, Error> {
        let cif = crate::cstring("an interface name", self)?;
        let cmap = crate::cstring("a map name", name)?;
        // SAFETY: valid C strings; a non-negative result is a new descriptor we own.
        let fd = unsafe { ffi::vl_xdp_map_fd(cif.as_ptr(), cmap.as_ptr()) };
        if fd < 0 {
            return Err(Error::XdpMap { map: name, iface: self.to_string(), source: std::io::Error::from_raw_os_error(-fd) });
        }
        // SAFETY: as above.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
    fn label(&self) -> String {
        self.to_string()
    }
}

fn map_err(m: &(impl Maps + ?Sized), map: &'static str, r: i32) -> Result<(), Error> {
    if r < 0 {
        return Err(Error::XdpMap { map, iface: m.label(), source: std::io::Error::from_raw_os_error(-r) });
    }
    Ok(())
}

fn set(m: &(impl Maps + ?Sized), map: &'static str, keys: &[u8], values: &[u32], key_size: usize) -> Result<(), Error> {
    let fd = m.map(map)?;
    assert_eq!(keys.len(), values.len() * key_size);
    // SAFETY: keys holds values.len() keys of key_size bytes; fd is a map with such keys and
    // u32 values.
    let r = unsafe { ffi::vl_map_replace(fd.as_raw_fd(), keys.as_ptr(), values.as_ptr(), values.len() as i32, key_size as i32) };
    map_err(m, map, r)
}

/// Replaces the program's address table on `ifname`: `(address, FLAG_DST | FLAG_SRC)`.
pub fn set_addrs(ifname: &(impl Maps + ?Sized), addrs: &[(IpAddr, u32)]) -> Result<(), Error> {
    let mut keys = Vec::with_capacity(addrs.len() * 20);
    let mut values = Vec::with_capacity(addrs.len());
    for &(a, flags) in addrs {
        let (fam, b) = family_addr(a);
        keys.extend_from_slice(&[fam, 0, 0, 0]);
        keys.extend_from_slice(&b);
        values.push(flags);
    }
    set(ifname, "vl_addrs", &keys, &values, 20)
}

/// The keys of an LPM map of prefixes (`struct net_key`: 8 + length, family, address), 21
/// bytes each.
fn net_keys(nets: &[(IpAddr, u8)]) -> Vec<u8> {
    let mut keys = Vec::with_capacity(nets.len() * 21);
    for &(a, len) in nets {
        let (fam, b) = family_addr(a);
        keys.extend_from_slice(&(8 + len as u32).to_ne_bytes());
        keys.push(fam);
        keys.extend_from_slice(&b);
    }
    keys
}

/// Replaces the program's source prefixes (SNAT sources) on `ifname`.
pub fn set_source_nets(ifname: &(impl Maps + ?Sized), nets: &[(IpAddr, u8)]) -> Result<(), Error> {
    set(ifname, "vl_srcnets", &net_keys(nets), &vec![1u32; nets.len()], 21)
}

/// Replaces the decapsulator's allowed tunnel sources, and turns the restriction on (some
/// prefixes) or off (none).
pub fn set_decap_from(m: &(impl Maps + ?Sized), nets: &[(IpAddr, u8)]) -> Result<(), Error> {
    set(m, "vl_decap_from", &net_keys(nets), &vec![1u32; nets.len()], 21)?;
    let fd = m.map("vl_decap_conf")?;
    let (k, v) = (0u32, (!nets.is_empty()) as u32);
    // SAFETY: an array map of u32 keys and u32 values.
    let r = unsafe { ffi::vl_map_put(fd.as_raw_fd(), &k as *const u32 as *const _, &v as *const u32 as *const _) };
    map_err(m, "vl_decap_conf", r)
}

/// The decapsulator's counters (`csrc/vectorlb_decap.c`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecapStats {
    pub v4_in_v4: u64,
    pub v6_in_v4: u64,
    pub v6_in_v6: u64,
    pub v4_in_v6: u64,
    /// Tunnels from a source not allowed: dropped.
    pub not_allowed: u64,
    /// Inner headers that are not what the outer one says: dropped.
    pub malformed: u64,
    /// Outer fragments and extension headers: passed unopened.
    pub fragment: u64,
}

impl DecapStats {
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("ipv4_in_ipv4", self.v4_in_v4),
            ("ipv6_in_ipv4", self.v6_in_v4),
            ("ipv6_in_ipv6", self.v6_in_v6),
            ("ipv4_in_ipv6", self.v4_in_v6),
            ("not_allowed", self.not_allowed),
            ("malformed", self.malformed),
            ("fragment", self.fragment),
        ]
    }
}

pub fn decap_stats(m: &(impl Maps + ?Sized)) -> Result<DecapStats, Error> {
    let fd = m.map("vl_decap_stats")?;
    let mut o = [0u64; 7];
    // SAFETY: a per-CPU array of 7 u64 counters; o holds 7 words.
    let r = unsafe { ffi::vl_map_percpu_sum(fd.as_raw_fd(), 0, o.as_mut_ptr(), 7) };
    map_err(m, "vl_decap_stats", r)?;
    Ok(DecapStats { v4_in_v4: o[0], v6_in_v4: o[1], v6_in_v6: o[2], v4_in_v6: o[3], not_allowed: o[4], malformed: o[5], fragment: o[6] })
}

/// Attaches the decapsulator to `ifname` (a TUN-mode backend's interface): in the driver when
/// it can, else generic; tunnels only from `from` when given. Refuses an interface that runs
/// another XDP program; replaces (and so updates) one that runs the decapsulator. Returns the
/// mode used.
pub fn decap_attach(ifname: &str, from: &[(IpAddr, u8)], generic: Option<bool>) -> Result<&'static str, Error> {
    if let Some(a) = attached(ifname)? {
        if a.name != DECAP_PROGRAM {
            return Err(Error::Xdp {
                iface: ifname.to_string(),
                what: "attaching the decapsulator",
                source: std::io::Error::other(format!("it runs another XDP program ('{}', id {}); remove it first (ip link set dev {ifname} xdp off)", a.name, a.id)),
            });
        }
    }
    let prog = Loaded::load_object(DECAP_OBJECT, DECAP_PROGRAM)?;
    set_decap_from(&prog, from)?;
    let cif = crate::cstring("an interface name", ifname)?;
    let mut last = 0;
    for g in [false, true] {
        if generic.is_some_and(|want| want != g) {
            continue;
        }
        // SAFETY: valid C string and program descriptor.
        last = unsafe { ffi::vl_xdp_attach(cif.as_ptr(), prog.prog.as_raw_fd(), g as i32) };
        if last == 0 {
            return Ok(if g { "generic" } else { "driver" });
        }
    }
    Err(Error::Xdp { iface: ifname.to_string(), what: "attaching the decapsulator", source: std::io::Error::from_raw_os_error(-last) })
}

/// Detaches the decapsulator from `ifname`; false when it was not attached (another program
/// is left alone).
pub fn decap_detach(ifname: &str) -> Result<bool, Error> {
    match attached(ifname)? {
        Some(a) if a.name == DECAP_PROGRAM => detach(ifname).map(|()| true),
        _ => Ok(false),
    }
}

/// The interface named by an af_xdp device string (`net_af_xdp0,iface=veth0,...`).
pub fn af_xdp_iface(dev: &str) -> Option<&str> {
    if !crate::device_name(dev).starts_with("net_af_xdp") {
        return None;
    }
    dev.split(',').find_map(|kv| kv.strip_prefix("iface="))
}

/// Index of the default set in the program's queue-set counters.
pub const QS_DEFAULT: u32 = 64;
/// Most queue sets the program tells apart.
pub const QS_MAX: usize = QS_DEFAULT as usize;
const QS_CLASSIFY: u64 = 1;
const QS_POLICE: u64 = 2;
const QS_ANYPORT: u64 = 4;

/// A packet's queue set as the XDP program finds it: by its service (`Service`: destination
/// VIP, port, protocol) or by the backend it comes from (`Backend`: replies of NAT services).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QsMatch {
    Service {
        vip: IpAddr,
        port: u16,
        proto: u8,
    },
    Backend {
        addr: IpAddr,
        port: u16,
        proto: u8,
    },
    /// A set's VIP, for packets that carry no ports (later fragments, IPv6 with extension
    /// headers).
    Vip {
        addr: IpAddr,
    },
}

impl QsMatch {
    /// The map key (`struct qs_key` of csrc/vectorlb_xdp.c).
    fn key(&self) -> [u8; 24] {
        let (dir, a, port, proto) = match *self {
            QsMatch::Service { vip, port, proto } => (0u8, vip, port, proto),
            QsMatch::Backend { addr, port, proto } => (1u8, addr, port, proto),
            QsMatch::Vip { addr } => (2u8, addr, 0, 0),
        };
        let (fam, b) = family_addr(a);
        let mut k = [0u8; 24];
        k[0] = fam;
        k[1] = proto;
        k[2] = dir;
        k[4..6].copy_from_slice(&port.to_be_bytes());
        k[8..24].copy_from_slice(&b);
        k
    }
}

/// The default set's ingress limit, as the program applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Police {
    pub pps: Option<u64>,
    pub bps: Option<u64>,
    pub burst_ms: u32,
}

impl Police {
    /// `struct qs_conf`: flags, ns per packet, ps per byte, burst ns, and the policer's two
    /// arrival times (0: a full burst is available).
    fn conf(police: Option<Police>, matches: &[(QsMatch, u32)]) -> [u64; 6] {
        let mut c = [0u64; 6];
        if !matches.is_empty() {
            c[0] |= QS_CLASSIFY;
        }
        if matches.iter().any(|(m, _)| matches!(m, QsMatch::Service { port: 0, .. } | QsMatch::Backend { port: 0, .. })) {
            c[0] |= QS_ANYPORT;
        }
        if let Some(p) = police {
            c[0] |= QS_POLICE;
            // Rounded up: the policer never passes more than the rate.
            c[1] = p.pps.map_or(0, |r| 1_000_000_000u64.div_ceil(r.max(1)));
            c[2] = p.bps.map_or(0, |r| (8_000_000_000_000 / r.max(1)).max(1));
            c[3] = p.burst_ms as u64 * 1_000_000;
        }
        c
    }
}

/// Replaces the program's queue sets on `ifname`: which packets belong to which set (index
/// below [`QS_MAX`]), and the default set's ingress limit.
pub fn set_queue_sets(ifname: &(impl Maps + ?Sized), matches: &[(QsMatch, u32)], police: Option<Police>) -> Result<(), Error> {
    let mut keys = Vec::with_capacity(matches.len() * 24);
    let mut values = Vec::with_capacity(matches.len());
    for (m, set) in matches.iter().filter(|(_, s)| (*s as usize) < QS_MAX) {
        keys.extend_from_slice(&m.key());
        values.push(*set);
    }
    set(ifname, "vl_qs_flows", &keys, &values, 24)?;
    let conf = Police::conf(police, matches);
    let fd = ifname.map("vl_qs_conf")?;
    let zero = 0u32;
    // SAFETY: the map's key is a u32 and its value the 48 bytes of struct qs_conf.
    let r = unsafe { ffi::vl_map_put(fd.as_raw_fd(), &zero as *const u32 as *const _, conf.as_ptr() as *const _) };
    map_err(ifname, "vl_qs_conf", r)
}

/// What the program counted of one queue set (or of the default set) on one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QsStats {
    pub packets: u64,
    pub bytes: u64,
    /// Dropped by the default set's ingress limit.
    pub policed: u64,
}

/// The program's counters of sets `indexes` (each below [`QS_MAX`], or [`QS_DEFAULT`]) on
/// `ifname`, summed over CPUs, in the same order.
pub fn queue_set_stats(ifname: &(impl Maps + ?Sized), indexes: &[u32]) -> Result<Vec<QsStats>, Error> {
    let fd = ifname.map("vl_qs_stats")?;
    indexes
        .iter()
        .map(|&index| {
            let mut out = [0u64; 3];
            // SAFETY: a per-CPU array of struct qs_stats (3 u64); out holds 3 words.
            let r = unsafe { ffi::vl_map_percpu_sum(fd.as_raw_fd(), index, out.as_mut_ptr(), 3) };
            map_err(ifname, "vl_qs_stats", r)?;
            Ok(QsStats { packets: out[0], bytes: out[1], policed: out[2] })
        })
        .collect()
}

/// The program loaded from [`OBJECT`] into the kernel and attached nowhere: for tests of the
/// program itself (root).
pub struct Loaded {
    obj: std::ptr::NonNull<std::ffi::c_void>,
    prog: OwnedFd,
}

/// What the program decided for a frame (its return value).
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

impl Loaded {
    /// The flow director.
    pub fn load() -> Result<Loaded, Error> {
        Self::load_object(OBJECT, PROGRAM_NAME)
    }

    /// Program `name` of BPF object `object`.
    pub fn load_object(object: &'static [u8], name: &'static str) -> Result<Loaded, Error> {
        let mut err = 0;
        // SAFETY: object is a complete BPF object; libbpf copies what it keeps.
        let obj = unsafe { ffi::vl_bpf_load(object.as_ptr() as *const _, object.len(), &mut err) };
        let obj =
            std::ptr::NonNull::new(obj).ok_or_else(|| Error::Xdp { iface: "(loaded)".into(), what: "loading the program", source: std::io::Error::from_raw_os_error(-err) })?;
        let prog = Self::fd(obj, name, false);
        let prog = match prog {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: obj came from vl_bpf_load and is closed once.
                unsafe { ffi::vl_bpf_close(obj.as_ptr()) };
                return Err(e);
            }
        };
        Ok(Loaded { obj, prog })
    }

    fn fd(obj: std::ptr::NonNull<std::ffi::c_void>, name: &'static str, map: bool) -> Result<OwnedFd, Error> {
        let c = crate::cstring("a name", name)?;
        // SAFETY: obj is a loaded object; a non-negative result is a new descriptor we own.
        let fd = unsafe { ffi::vl_bpf_fd(obj.as_ptr(), c.as_ptr(), map as i32) };
        if fd < 0 {
            return Err(Error::XdpMap { map: name, iface: "(loaded)".into(), source: std::io::Error::from_raw_os_error(-fd) });
        }
        // SAFETY: as above.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Runs `frame` through the program; returns its verdict.
    pub fn run(&self, frame: &[u8]) -> Result<u32, Error> {
        let mut ret = 0;
        // SAFETY: frame is valid for its length; the kernel copies it.
        let r = unsafe { ffi::vl_bpf_test_run(self.prog.as_raw_fd(), frame.as_ptr() as *const _, frame.len() as u32, &mut ret) };
        if r < 0 {
            return Err(Error::Xdp { iface: "(loaded)".into(), what: "running the program", source: std::io::Error::from_raw_os_error(-r) });
        }
        Ok(ret)
    }
}

impl Loaded {
    /// Runs `frame` through the program; its verdict and the frame as the program left it.
    pub fn run_out(&self, frame: &[u8]) -> Result<(u32, Vec<u8>), Error> {
        let (mut ret, mut len) = (0, 0);
        let mut out = vec![0u8; frame.len() + 256];
        // SAFETY: frame is valid for its length, out for its capacity; the kernel writes at
        // most that many bytes and reports how many.
        let r = unsafe {
            ffi::vl_bpf_test_run_out(self.prog.as_raw_fd(), frame.as_ptr() as *const _, frame.len() as u32, out.as_mut_ptr() as *mut _, out.len() as u32, &mut len, &mut ret)
        };
        if r < 0 {
            return Err(Error::Xdp { iface: "(loaded)".into(), what: "running the program", source: std::io::Error::from_raw_os_error(-r) });
        }
        out.truncate(len as usize);
        Ok((ret, out))
    }
}

impl Maps for Loaded {
    fn map(&self, name: &'static str) -> Result<OwnedFd, Error> {
        Self::fd(self.obj, name, true)
    }
    fn label(&self) -> String {
        "(loaded)".into()
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: obj came from vl_bpf_load and is closed only here.
        unsafe { ffi::vl_bpf_close(self.obj.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_set_keys_and_policer_settings_match_the_programs_layout() {
        let k = QsMatch::Service { vip: "10.0.0.100".parse().unwrap(), port: 11211, proto: 6 }.key();
        assert_eq!(&k[..8], &[4, 6, 0, 0, 0x2b, 0xcb, 0, 0]);
        assert_eq!(&k[8..12], &[10, 0, 0, 100]);
        assert!(k[12..].iter().all(|b| *b == 0));
        let k = QsMatch::Backend { addr: "2001:db8::5".parse().unwrap(), port: 53, proto: 17 }.key();
        assert_eq!(&k[..6], &[6, 17, 1, 0, 0, 53]);
        assert_eq!(k[8], 0x20);
        assert_eq!(Police::conf(None, &[]), [0; 6]);
        let svc = |port| (QsMatch::Service { vip: "10.0.0.100".parse().unwrap(), port, proto: 6 }, 0);
        assert_eq!(Police::conf(None, &[svc(80)])[0], QS_CLASSIFY);
        assert_eq!(Police::conf(None, &[svc(80), svc(0)])[0], QS_CLASSIFY | QS_ANYPORT, "a service of every port");
        // 20,000 packets/s: 50 µs apart; 100 Mb/s: 80,000 ps a byte; 5 ms of burst.
        let c = Police::conf(Some(Police { pps: Some(20_000), bps: Some(100_000_000), burst_ms: 5 }), &[]);
        assert_eq!(c, [QS_POLICE, 50_000, 80_000, 5_000_000, 0, 0]);
        // Absurd rates stay meaningful: the fastest is one packet a ns, a byte a ps.
        let c = Police::conf(Some(Police { pps: Some(u64::MAX), bps: Some(u64::MAX), burst_ms: 1 }), &[svc(1)]);
        assert_eq!(&c[..3], &[QS_CLASSIFY | QS_POLICE, 1, 1]);
    }
}
