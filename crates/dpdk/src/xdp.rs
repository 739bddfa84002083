//! The XDP flow director: our program (built from `csrc/vectorlb_xdp.c` by build.rs) and the
//! maps through which the daemon tells it which addresses are the load balancer's.

use crate::{ffi, Error};
use std::net::IpAddr;
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

fn set(ifname: &str, map: &'static str, keys: &[u8], values: &[u32], key_size: usize) -> Result<(), Error> {
    let cif = crate::cstring("an interface name", ifname)?;
    let cmap = crate::cstring("a map name", map)?;
    // SAFETY: keys holds values.len() keys of key_size bytes.
    let r = unsafe { ffi::vl_xdp_map_set(cif.as_ptr(), cmap.as_ptr(), keys.as_ptr(), values.as_ptr(), values.len() as i32, key_size as i32) };
    if r < 0 {
        return Err(Error::XdpMap { map, iface: ifname.to_string(), source: std::io::Error::from_raw_os_error(-r) });
    }
    Ok(())
}

/// Replaces the program's address table on `ifname`: `(address, FLAG_DST | FLAG_SRC)`.
pub fn set_addrs(ifname: &str, addrs: &[(IpAddr, u32)]) -> Result<(), Error> {
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

/// Replaces the program's source prefixes (SNAT sources) on `ifname`.
pub fn set_source_nets(ifname: &str, nets: &[(IpAddr, u8)]) -> Result<(), Error> {
    let mut keys = Vec::with_capacity(nets.len() * 21);
    for &(a, len) in nets {
        let (fam, b) = family_addr(a);
        keys.extend_from_slice(&(8 + len as u32).to_ne_bytes());
        keys.push(fam);
        keys.extend_from_slice(&b);
    }
    set(ifname, "vl_srcnets", &keys, &vec![1u32; nets.len()], 21)
}

/// The interface named by an af_xdp device string (`net_af_xdp0,iface=veth0,...`).
pub fn af_xdp_iface(dev: &str) -> Option<&str> {
    if !crate::device_name(dev).starts_with("net_af_xdp") {
        return None;
    }
    dev.split(',').find_map(|kv| kv.strip_prefix("iface="))
}
