//! `[ports.pods]`: the port of a Kubernetes node's pods. Each pod gets a tun interface in its
//! own network namespace, created and attached at run time (`POST /v1/pods`, the CNI plugin);
//! the port's addresses give the node's pod networks (their first address is the port's own).

use crate::error::{bail, Error};
use serde::{Deserialize, Serialize};

/// A pods port (`[ports.pods]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodsSpec {
    /// Where each attached pod is recorded (one file per interface), so that a restarted
    /// daemon takes its pods back.
    #[serde(default = "PodsSpec::default_state_dir")]
    pub state_dir: String,
    /// The tun interface in the daemon's own network namespace through which the host reaches
    /// the pods and the pods reach everything that is not a pod of this node or a service
    /// ("" for none).
    #[serde(default = "PodsSpec::default_host_interface")]
    pub host_interface: String,
    /// The worker that reads the pods' interfaces (both directions of a pod's flows meet on
    /// one worker, which NAT sessions need).
    #[serde(default)]
    pub worker: u16,
    /// Prefixes the host also reaches through its interface: the Services' cluster IP ranges
    /// (the host's own traffic to a ClusterIP then goes through the data plane, as the pods'
    /// does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_cidrs: Vec<String>,
    /// At most this many pod interfaces.
    #[serde(default = "PodsSpec::default_max_pods")]
    pub max_pods: u32,
    /// The host's own addresses (a Kubernetes node's InternalIPs) whose NodePorts the data
    /// plane serves: the daemon has the host's kernel hand TCP and UDP to `node_port_range` of
    /// these addresses to it through the host's interface (routing rules ahead of the local
    /// table); every other port stays the host's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_port_addresses: Vec<String>,
    /// The NodePort range, `FIRST-LAST` (the API server's `--service-node-port-range`).
    #[serde(default = "PodsSpec::default_node_port_range")]
    pub node_port_range: String,
    /// The host's addresses (one per family) that pods' traffic leaving the cluster is
    /// source-NATed to by the data plane (Calico's `natOutgoing`): addresses of the host set
    /// aside for it, which its kernel hands to the data plane whole (routing rules). None: the
    /// pods' own addresses leave as they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_addresses: Vec<String>,
    /// The cluster's pod networks (prefixes): with `egress_addresses`, traffic to these, to the
    /// node's own pod networks and to `service_cidrs` keeps the pod's address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_cidrs: Vec<String>,
    /// Offloads on the pods' interfaces (docs/pod-network.md): each packet after a virtio-net
    /// header, the pods' kernels leaving TCP and UDP checksums to the data plane and handing
    /// TCP over up to 64 KB at once, kept whole from pod to pod on the node and cut into
    /// packets for anywhere else. Where the kernel has no such interfaces, plain ones. False:
    /// plain interfaces (one packet of at most the MTU per read or write).
    #[serde(default = "PodsSpec::default_offloads")]
    pub offloads: bool,
}

/// The pods port's MAC when the file gives none (locally administered; pods' interfaces get
/// `02:76:` and their slot, see the daemon's `pods.rs`).
pub const PODS_MAC: [u8; 6] = [0x02, 0x76, 0xff, 0xff, 0xff, 0xfe];

/// The most pod interfaces a port takes.
pub const MAX_PODS: u32 = 65_536;

impl PodsSpec {
    fn default_state_dir() -> String {
        "/var/lib/vectorlb/pods".into()
    }
    fn default_host_interface() -> String {
        "vlb0".into()
    }
    fn default_offloads() -> bool {
        true
    }
    fn default_max_pods() -> u32 {
        1024
    }
    fn default_node_port_range() -> String {
        "30000-32767".into()
    }

    /// `node_port_range` as (first, last).
    pub fn node_ports(&self) -> Result<(u16, u16), String> {
        let bad = || format!("'{}' is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535", self.node_port_range);
        let (a, b) = self.node_port_range.split_once('-').ok_or_else(bad)?;
        let (a, b): (u16, u16) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if a == 0 || a > b {
            return Err(bad());
        }
        Ok((a, b))
    }

    pub(crate) fn check(&self, f: &str, workers: u16) -> Result<(), Error> {
        if self.state_dir.is_empty() || !self.state_dir.starts_with('/') {
            bail!("{f}.state_dir: '{}' is not an absolute path", self.state_dir);
        }
        let h = &self.host_interface;
        if h.len() > 15 || h.contains(['/', ' ', '\0', ':']) || h == "." || h == ".." {
            bail!("{f}.host_interface: '{h}' is not an interface name (1..=15 bytes, no '/', ':' or spaces)");
        }
        if self.worker >= workers {
            bail!("{f}.worker: {} but there are {workers} worker(s) (runtime.workers)", self.worker);
        }
        if !self.service_cidrs.is_empty() && self.host_interface.is_empty() {
            bail!("{f}.service_cidrs: routed through the host's interface, but host_interface is \"\"");
        }
        if let Err(e) = self.node_ports() {
            bail!("{f}.node_port_range: {e}");
        }
        for (j, a) in self.node_port_addresses.iter().enumerate() {
            match a.parse::<std::net::IpAddr>() {
                Ok(ip) if !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast()) => {}
                _ => bail!("{f}.node_port_addresses[{j}]: '{a}' is not a unicast address of the host"),
            }
        }
        if !self.node_port_addresses.is_empty() && self.host_interface.is_empty() {
            bail!("{f}.node_port_addresses: handed to the data plane through the host's interface, but host_interface is \"\"");
        }
        for (j, a) in self.egress_addresses.iter().enumerate() {
            match a.parse::<std::net::IpAddr>() {
                Ok(ip) if !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast()) => {
                    if self.egress_addresses.iter().filter_map(|b| b.parse::<std::net::IpAddr>().ok()).filter(|b| b.is_ipv4() == ip.is_ipv4()).count() > 1 {
                        bail!("{f}.egress_addresses: one address per family ({a} has another of its family)");
                    }
                    if self.node_port_addresses.contains(a) {
                        bail!("{f}.egress_addresses[{j}]: '{a}' is also in node_port_addresses (an egress address is the data plane's whole)");
                    }
                }
                _ => bail!("{f}.egress_addresses[{j}]: '{a}' is not a unicast address of the host"),
            }
        }
        if !self.egress_addresses.is_empty() && self.host_interface.is_empty() {
            bail!("{f}.egress_addresses: handed to the data plane through the host's interface, but host_interface is \"\"");
        }
        for (j, c) in self.cluster_cidrs.iter().enumerate() {
            let ok = c.split_once('/').is_some_and(|(a, l)| match a.parse::<std::net::IpAddr>() {
                Ok(ip) => l.parse::<u8>().is_ok_and(|l| l <= if ip.is_ipv4() { 32 } else { 128 }),
                Err(_) => false,
            });
            if !ok {
                bail!("{f}.cluster_cidrs[{j}]: '{c}' is not a prefix (ADDRESS/LENGTH)");
            }
        }
        if !(1..=MAX_PODS).contains(&self.max_pods) {
            bail!("{f}.max_pods: {} is out of range 1..={MAX_PODS}", self.max_pods);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_addresses_and_cluster_cidrs_are_checked() {
        let spec = |extra: &str| -> PodsSpec { toml::from_str(&format!("node_port_addresses = [\"192.168.77.1\"]\n{extra}")).unwrap() };
        let err = |extra: &str| spec(extra).check("ports[0].pods", 1).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(err("egress_addresses = [\"192.168.77.201\", \"fd00:77::201\"]\ncluster_cidrs = [\"10.244.0.0/16\", \"fd00:244::/32\"]"), "");
        assert!(err("egress_addresses = [\"192.168.77.1\"]").contains("also in node_port_addresses"));
        assert!(err("egress_addresses = [\"192.168.77.201\", \"192.168.77.202\"]").contains("one address per family"));
        assert!(err("egress_addresses = [\"127.0.0.1\"]").contains("egress_addresses[0]"));
        assert!(err("egress_addresses = [\"192.168.77.201\"]\nhost_interface = \"\"").contains("host_interface"));
        for bad in ["10.244.0.0", "10.244.0.0/33", "nope/16"] {
            assert!(err(&format!("cluster_cidrs = [\"{bad}\"]")).contains("cluster_cidrs[0]"), "{bad}");
        }
    }
}
