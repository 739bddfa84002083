//! `[[ports]]`, `[[routes]]` and `[[neighbors]]`: where packets come and go.

use crate::error::{bail, Error};
use crate::file::{RawNeighbor, RawPort, RawRoute};
use crate::memif::MemifSpec;
use crate::values::{ip, prefix};
use std::collections::HashMap;
use std::net::IpAddr;
use vectorlb_lb::{PortSpec, RouteSpec};
use vectorlb_packet::ethernet::parse_mac;

/// The ports of a file: the model's, and what only the daemon needs of each, by index.
pub(crate) struct Ports {
    pub ids: HashMap<String, u16>,
    pub specs: Vec<PortSpec>,
    pub devices: Vec<Option<String>>,
    pub memifs: Vec<Option<MemifSpec>>,
    pub pods: Vec<Option<crate::pods::PodsSpec>>,
    pub trust_peer: Vec<bool>,
    pub mac_from_device: Vec<bool>,
    pub mtu_given: Vec<bool>,
}

pub(crate) fn ports(raw: &[RawPort]) -> Result<Ports, Error> {
    let mut port_ids = HashMap::new();
    let mut ports = Vec::new();
    let mut devices = Vec::new();
    let mut memifs: Vec<Option<MemifSpec>> = Vec::new();
    let mut pods = Vec::new();
    let mut trust_peer = Vec::new();
    let mut mac_from_device = Vec::new();
    let mut mtu_given = Vec::new();
    for (i, p) in raw.iter().enumerate() {
        let f = format!("ports[{i}]");
        if p.name.is_empty() {
            bail!("{f}.name: must not be empty");
        }
        if port_ids.insert(p.name.clone(), i as u16).is_some() {
            bail!("{f}.name: '{}' is used twice", p.name);
        }
        let mac = match (&p.mac, &p.device) {
            (Some(m), _) => parse_mac(m).ok_or_else(|| Error::invalid(format!("{f}.mac: '{m}' is not a MAC address")))?,
            (None, Some(_)) => [0u8; 6],
            (None, None) if p.pods.is_some() => crate::pods::PODS_MAC,
            (None, None) if p.memif.is_some() => bail!("{f}.mac: required for a memif port (it has no hardware address)"),
            (None, None) => bail!("{f}.mac: required when the port has no device (the device's own MAC is used otherwise)"),
        };
        if let Some(m) = &p.memif {
            if p.device.is_some() {
                bail!("{f}.memif: a port is either a DPDK device or a memif interface, not both");
            }
            m.check(&format!("{f}.memif"))?;
            if m.trust_peer != p.trust_peer && p.trust_peer {
                bail!("{f}.trust_peer: for a memif port, set memif.trust_peer");
            }
            let dup = memifs.iter().position(|o: &Option<MemifSpec>| o.as_ref().is_some_and(|o| o.socket == m.socket && o.id == m.id && o.role == m.role));
            if let Some(j) = dup {
                bail!("{f}.memif: socket {} id {} is also ports[{j}]'s", m.socket, m.id);
            }
            if !m.is_server() && memifs.iter().flatten().any(|o| o.socket == m.socket && o.is_server())
                || m.is_server() && memifs.iter().flatten().any(|o| o.socket == m.socket && !o.is_server())
            {
                bail!("{f}.memif.socket: {} is used as both server and client", m.socket);
            }
        }
        if p.pods.is_some() {
            if p.device.is_some() || p.memif.is_some() {
                bail!("{f}.pods: a pods port has neither a device nor a memif interface (its pods' interfaces are attached at run time)");
            }
            if pods.iter().any(Option::is_some) {
                bail!("{f}.pods: only one port can be the pods port");
            }
            if p.addrs.is_empty() {
                bail!("{f}.addrs: a pods port needs the node's pod networks (e.g. \"10.244.1.1/24\": the port's own address and prefix)");
            }
            if p.vlan.is_some() {
                bail!("{f}.vlan: a pods port has no VLAN");
            }
            for (j, c) in p.pods.iter().flat_map(|s| s.service_cidrs.iter()).enumerate() {
                prefix(&format!("{f}.pods.service_cidrs[{j}]"), c)?;
            }
        }
        if let Some(d) = &p.device {
            if d.starts_with("net_memif") && !p.trust_peer {
                bail!("{f}.device: DPDK's net_memif trusts its peer's descriptors (a pod can crash the data plane through it); use a memif port ([ports.memif]) or set trust_peer = true for a peer you control");
            }
        }
        if let Some(d) = &p.device {
            if d.trim().is_empty() || d.contains(char::is_whitespace) {
                bail!("{f}.device: '{d}' is not a DPDK device string (net_af_xdp0,iface=eth0 or a PCI address)");
            }
        }
        if let Some(d) = &p.device {
            let key = |d: &str| d.split(',').find_map(|kv| kv.strip_prefix("iface=")).map(str::to_string).unwrap_or_else(|| d.split(',').next().unwrap_or(d).to_string());
            if let Some(j) = devices.iter().position(|o: &Option<String>| o.as_deref().is_some_and(|o| key(o) == key(d))) {
                bail!("{f}.device: '{}' is also ports[{j}]'s device; two ports cannot share an interface", key(d));
            }
        }
        devices.push(p.device.clone());
        memifs.push(p.memif.clone());
        pods.push(p.pods.clone());
        trust_peer.push(p.trust_peer || p.memif.as_ref().is_some_and(|m| m.trust_peer));
        mac_from_device.push(p.mac.is_none());
        mtu_given.push(p.mtu.is_some());
        let addrs = p.addrs.iter().map(|a| prefix(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
        let mtu = p.mtu.unwrap_or(1500);
        if !(576..=9216).contains(&mtu) {
            bail!("{f}.mtu: {mtu} is out of range 576..=9216");
        }
        if p.pods.is_some() && mtu > 2000 {
            bail!("{f}.mtu: {mtu}; a pods port's frames fit one buffer (at most 2000)");
        }
        ports.push(PortSpec { name: p.name.clone(), mac, addrs, vlan: p.vlan, mtu });
    }
    Ok(Ports { ids: port_ids, specs: ports, devices, memifs, pods, trust_peer, mac_from_device, mtu_given })
}

pub(crate) fn routes(raw: &[RawRoute], port_ids: &HashMap<String, u16>) -> Result<Vec<RouteSpec>, Error> {
    let mut routes = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let f = format!("routes[{i}]");
        let (pfx, len) = prefix(&format!("{f}.prefix"), &r.prefix)?;
        let via = ip(&format!("{f}.via"), &r.via)?;
        let Some(&port) = port_ids.get(&r.port) else {
            bail!("{f}.port: no port named '{}'", r.port);
        };
        routes.push(RouteSpec { prefix: pfx, len, port, via });
    }
    Ok(routes)
}

pub(crate) fn neighbors(raw: &[RawNeighbor]) -> Result<Vec<(IpAddr, [u8; 6])>, Error> {
    let mut neighbors = Vec::new();
    for (i, n) in raw.iter().enumerate() {
        let f = format!("neighbors[{i}]");
        let a = ip(&format!("{f}.ip"), &n.ip)?;
        let mac = parse_mac(&n.mac).ok_or_else(|| Error::invalid(format!("{f}.mac: '{}' is not a MAC address", n.mac)))?;
        if vectorlb_lb::service::is_group_mac(&mac) {
            bail!("{f}.mac: '{}' is a group (multicast or broadcast) address, not a host's", n.mac);
        }
        neighbors.push((a, mac));
    }
    Ok(neighbors)
}
