//! The annotations the controller reads, named once (docs/kubernetes.md lists them; a test
//! checks that it names each).

/// The prefix of every annotation of ours.
pub const PREFIX: &str = "vectorlb.io/";
/// The forwarding mode: `fnat`, `nat`, `dr` or `tun`.
pub const MODE: &str = "vectorlb.io/mode";
/// The scheduler: `rr`, `wrr`, `wlc`, `sh` or `maglev`.
pub const SCHEDULER: &str = "vectorlb.io/scheduler";
/// The SYN proxy: `on`, `off` or `auto`.
pub const SYNPROXY: &str = "vectorlb.io/synproxy";
/// The daemon's health check of the endpoints: `tcp`, `http[:/PATH]` or `https[:/PATH]`.
pub const HEALTH_CHECK: &str = "vectorlb.io/health-check";
/// Its interval in seconds.
pub const HEALTH_INTERVAL: &str = "vectorlb.io/health-interval";
/// The address asked for (the first of a comma-separated list).
pub const LOAD_BALANCER_IPS: &str = "vectorlb.io/load-balancer-ips";
/// The address pool to take the address from (Services and Gateways).
pub const ADDRESS_POOL: &str = "vectorlb.io/address-pool";
/// Services of one namespace with the same key may share an address.
pub const ALLOW_SHARED_IP: &str = "vectorlb.io/allow-shared-ip";

/// Every annotation above.
pub const ALL: &[&str] = &[MODE, SCHEDULER, SYNPROXY, HEALTH_CHECK, HEALTH_INTERVAL, LOAD_BALANCER_IPS, ADDRESS_POOL, ALLOW_SHARED_IP];

#[cfg(test)]
mod tests {
    #[test]
    fn every_annotation_is_documented() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kubernetes.md")).unwrap();
        for a in super::ALL {
            assert!(a.starts_with(super::PREFIX));
            assert!(doc.contains(a), "docs/kubernetes.md does not name the annotation {a}");
        }
    }
}
