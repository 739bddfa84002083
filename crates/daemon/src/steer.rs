//! NodePorts on the host's own addresses (`[ports.pods] node_port_addresses`): Kubernetes reports
//! a node's kernel address, and clients dial its NodePorts there. The host's kernel hands TCP
//! and UDP to the NodePort range of those addresses to the data plane through the host's
//! interface (`vlb0`) instead of its own sockets:
//!
//! - a routing table of the daemon's ([`TABLE`]) whose default route is the host's interface;
//! - rules at preference [`PREF`] selecting that table for TCP and UDP to each address and the
//!   range, one per address and protocol, and for TCP, UDP and ICMP (not ICMPv6: neighbour
//!   discovery) to the pods' egress addresses (`[ports.pods] egress_addresses`, what the data
//!   plane source-NATs pods' traffic leaving the cluster to: their replies are the data
//!   plane's); a rule for every protocol would take ARP's route lookup too, and the host would
//!   not answer ARP for the address; before them (at [`PREF`] - 1), what comes in through
//!   the host's interface goes to the local table: a NodePort packet the data plane hands back
//!   (no service has it) reaches the host's sockets, which refuse it, instead of being sent
//!   back to the data plane round and round until its TTL runs out;
//! - the local table's rule moved from preference 0 to [`LOCAL_PREF`], after those (the kernel
//!   consults rules in order, and the local table would deliver to the host's sockets first);
//! - on the host's interface, `accept_local` (the replies come back through it with the host's
//!   address as their source) and no reverse-path filter (nor on `all`: the kernel applies the
//!   larger of the two); no TCP or UDP early demux (it attaches a host's socket to a packet as it
//!   arrives, and the kernel never forwards one that has it: the client's ACK to a host's
//!   listener in the range could not take its way through the data plane).
//!
//! Made at every start (the rules of a previous start, or a killed daemon's, removed first by
//! their table: never twice), by iproute2's `ip`. When the daemon is gone, its interface is too
//! and the table empty: the rules then find no route and the host's own sockets answer.

use std::net::IpAddr;
use std::process::Command;

/// The daemon's routing table ("vl").
pub const TABLE: u32 = 30_316;
/// The preference of the NodePort rules.
pub const PREF: u32 = 10;
/// Where the local table's rule goes.
pub const LOCAL_PREF: u32 = 100;

fn ip(fam: &str, args: &[&str]) -> Result<String, String> {
    let o = Command::new("ip").arg(fam).args(args).output().map_err(|e| format!("ip {fam} {}: {e} (iproute2 is needed)", args.join(" ")))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("ip {fam} {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

fn sysctl(path: &str, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{path}: {e}"))
}

/// Hands TCP and UDP to ports `range` of `addrs`, and everything to `egress` (the pods'
/// egress addresses, the data plane's whole), to interface `ifname` (module doc). With neither,
/// only removes what an earlier start made.
pub fn node_ports(ifname: &str, addrs: &[IpAddr], range: (u16, u16), egress: &[IpAddr]) -> Result<(), String> {
    let table = TABLE.to_string();
    let ports = format!("{}-{}", range.0, range.1);
    for (fam, v4) in [("-4", true), ("-6", false)] {
        // Whatever an earlier start made: every rule that selects the table (bounded, in case
        // `ip` keeps answering success without removing one).
        let before = (PREF - 1).to_string();
        for del in [&["rule", "del", "table", table.as_str()][..], &["rule", "del", "pref", before.as_str(), "lookup", "local"][..]] {
            for _ in 0..4096 {
                if ip(fam, del).is_err() {
                    break;
                }
            }
        }
        let mine: Vec<&IpAddr> = addrs.iter().filter(|a| a.is_ipv4() == v4).collect();
        let out: Vec<&IpAddr> = egress.iter().filter(|a| a.is_ipv4() == v4).collect();
        if mine.is_empty() && out.is_empty() {
            continue;
        }
        ip(fam, &["route", "replace", "default", "dev", ifname, "table", &table])?;
        ip(fam, &["rule", "add", "pref", &(PREF - 1).to_string(), "iif", ifname, "lookup", "local"])?;
        for a in &mine {
            let to = a.to_string();
            for proto in ["tcp", "udp"] {
                ip(fam, &["rule", "add", "pref", &PREF.to_string(), "to", &to, "ipproto", proto, "dport", &ports, "table", &table])?;
            }
        }
        // TCP, UDP and ICMP only (ICMPv6 stays the host's: its neighbour discovery). A rule
        // for every protocol would take ARP's lookup too, and the host would never answer
        // ARP for the address: the replies could not find it.
        let protos: &[&str] = if v4 { &["tcp", "udp", "icmp"] } else { &["tcp", "udp"] };
        for a in &out {
            for proto in protos {
                ip(fam, &["rule", "add", "pref", &PREF.to_string(), "to", &a.to_string(), "ipproto", proto, "table", &table])?;
            }
        }
        // The local table after the NodePort rules: added at LOCAL_PREF first, then removed
        // from 0, so that no moment lacks it.
        let at = |pref: u32| ip(fam, &["rule", "show", "pref", &pref.to_string()]).unwrap_or_default().contains("lookup local");
        if at(0) {
            if !at(LOCAL_PREF) {
                ip(fam, &["rule", "add", "pref", &LOCAL_PREF.to_string(), "lookup", "local"])?;
            }
            ip(fam, &["rule", "del", "pref", "0", "lookup", "local"])?;
        }
    }
    if addrs.iter().chain(egress).any(IpAddr::is_ipv4) {
        sysctl(&format!("/proc/sys/net/ipv4/conf/{ifname}/accept_local"), "1")?;
        sysctl(&format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter"), "0")?;
        sysctl("/proc/sys/net/ipv4/conf/all/rp_filter", "0")?;
    }
    if !addrs.is_empty() {
        // A host's socket on a NodePort of these addresses (what no service has goes back to
        // the host: a health-check node port) would lose its handshake: early demux attaches
        // the socket to the client's ACK as it arrives, and the kernel never forwards a packet
        // that has one, so the ACK could not take its way through the data plane.
        sysctl("/proc/sys/net/ipv4/tcp_early_demux", "0")?;
        sysctl("/proc/sys/net/ipv4/udp_early_demux", "0")?;
    }
    if !addrs.is_empty() {
        tracing::info!("NodePorts {ports} of {addrs:?}: handed to the data plane through {ifname} (table {TABLE}, rules at {PREF}, the local table at {LOCAL_PREF})");
    }
    if !egress.is_empty() {
        tracing::info!("the pods' egress addresses {egress:?}: handed to the data plane through {ifname} (table {TABLE}, rules at {PREF})");
    }
    Ok(())
}

/// Hands one host port of one address to the data plane (`add`), or stops (a pod's
/// `hostPort`, [`crate::host_ports`]); a port inside the NodePort range `range` already is.
/// Needs the table and rules [`node_ports`] made for the address's family.
pub fn host_port(addr: IpAddr, proto: &str, port: u16, range: (u16, u16), add: bool) -> Result<(), String> {
    if (range.0..=range.1).contains(&port) {
        return Ok(());
    }
    let fam = if addr.is_ipv4() { "-4" } else { "-6" };
    let (to, port, pref, table) = (addr.to_string(), port.to_string(), PREF.to_string(), TABLE.to_string());
    let args = [if add { "add" } else { "del" }, "pref", &pref, "to", &to, "ipproto", proto, "dport", &port, "table", &table];
    let mut a = vec!["rule"];
    a.extend(args);
    match ip(fam, &a) {
        // Removing what is not there (a start that flushed it) is done already.
        Err(e) if !add && (e.contains("No such file") || e.contains("not exist")) => Ok(()),
        r => r.map(|_| ()),
    }
}
