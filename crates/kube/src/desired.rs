//! What each daemon should serve, from Services, their EndpointSlices and the annotations:
//! pure, so it is tested without a cluster.
//!
//! Endpoints: ready → weight 1; serving and terminating → weight 0 (drained: the flows it has
//! keep going, no new ones); when a port has no ready endpoint at all, its serving ones take new
//! connections (as kube-proxy does); anything else is left out.

use crate::ipam::Family;
use crate::reason::Reason;
use std::collections::BTreeMap;
use std::net::IpAddr;
use vectorlb_api::model::{HealthCheck, HealthKind, ModeName, NewBackend, NewService, OnDownName, Proto, SchedulerName, SynProxyName};

/// Annotation prefix of the controller's Service annotations.
use crate::annotation as ann;

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortIn {
    pub name: String,
    /// "TCP", "UDP", "SCTP".
    pub protocol: String,
    pub port: u16,
}

/// A Service with its address.
#[derive(Debug, Clone, Default)]
pub struct SvcSpec {
    pub key: String,
    pub ip: Option<IpAddr>,
    pub ports: Vec<PortIn>,
    pub annotations: BTreeMap<String, String>,
    /// `sessionAffinity: ClientIP`: its timeout in seconds (`sessionAffinityConfig`, 10800 by
    /// default as in Kubernetes); none: no affinity.
    pub affinity_timeout_s: Option<u32>,
    /// Full NAT's source addresses for this Service alone (NodePorts masqueraded to the
    /// node's address, `[cluster_ips] masquerade`); empty: the daemon's `local_addrs`.
    pub local_addrs: Vec<IpAddr>,
    /// A cluster IP's clients that keep their address (the pod networks, `[cluster_ips]
    /// cluster_cidrs`, as ADDRESS/LENGTH): the others are masqueraded to `local_addrs`.
    pub keep_source: Vec<String>,
    /// Only the endpoints on this node are backends (`internalTrafficPolicy: Local` for the
    /// cluster IPs, `externalTrafficPolicy: Local` for the NodePorts).
    pub local_node: Option<String>,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointIn {
    pub addrs: Vec<IpAddr>,
    /// The node it runs on (`nodeName`), when the slice says.
    pub node: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// An EndpointSlice of the Service.
#[derive(Debug, Clone, Default)]
pub struct SliceIn {
    /// "IPv4", "IPv6" or "FQDN" (ignored).
    pub address_type: String,
    /// (name, protocol, port) of its ports.
    pub ports: Vec<(String, String, u16)>,
    pub endpoints: Vec<EndpointIn>,
}

/// The shortest health-check interval an annotation may ask for, in seconds.
pub const MIN_HEALTH_INTERVAL: f64 = 1.0;

/// Whether an endpoint address may be a backend: not loopback, link-local (a node's metadata
/// service, 169.254.169.254, is one), unspecified or multicast. An EndpointSlice is written by
/// whoever may write it, and every load balancer node would connect to and health-check it.
pub fn backend_address(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => !(v.is_loopback() || v.is_link_local() || v.is_unspecified() || v.is_multicast() || v.is_broadcast()),
        IpAddr::V6(v) => !(v.is_loopback() || v.is_unspecified() || v.is_multicast() || v.segments()[0] & 0xffc0 == 0xfe80 || v.to_ipv4_mapped().is_some()),
    }
}

/// A problem to report on the Service (an Event); the rest of it is still programmed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub reason: Reason,
    pub message: String,
}

/// The settings the annotations choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub mode: ModeName,
    pub scheduler: SchedulerName,
    pub synproxy: SynProxyName,
    /// The backends' health check (TCP ports), written out whole as the daemon shows it.
    pub health: Option<HealthCheck>,
}

/// `vectorlb.io/health-check` (`tcp`, `http`, `https`, optionally `:/path`) and
/// `vectorlb.io/health-interval` (seconds, default 2, at least [`MIN_HEALTH_INTERVAL`]: every
/// load balancer node checks every endpoint of every port, so a tenant's interval multiplies
/// into the cluster's load): the check with every default written
/// out, as the daemon's `GET /v1/services` shows it (so that an unchanged check is not sent
/// again).
fn health_check(kind: &str, interval: Option<&str>) -> Result<HealthCheck, String> {
    let (k, path) = match kind.split_once(':') {
        Some((k, p)) => (k.to_ascii_lowercase(), Some(p)),
        None => (kind.to_ascii_lowercase(), None),
    };
    let kind = match k.as_str() {
        "tcp" if path.is_none() => HealthKind::Tcp,
        "http" => HealthKind::Http,
        "https" => HealthKind::Https,
        _ => return Err(format!("{}: '{kind}' is not tcp, http[:/PATH] or https[:/PATH]; no health check", ann::HEALTH_CHECK)),
    };
    let path = match (kind, path) {
        (HealthKind::Tcp, _) => None,
        (_, None) => Some("/".to_string()),
        (_, Some(p)) if p.starts_with('/') && !p.contains(char::is_whitespace) && p.len() <= 1024 => Some(p.to_string()),
        (_, Some(p)) => return Err(format!("{}: path '{p}' must start with / and hold no spaces; no health check", ann::HEALTH_CHECK)),
    };
    let interval_ms = match interval {
        None => 2000,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && (MIN_HEALTH_INTERVAL..=3600.0).contains(&x) => (x * 1000.0).round() as u32,
            _ => return Err(format!("{}: '{v}' is not a number of seconds in {MIN_HEALTH_INTERVAL}..=3600; no health check", ann::HEALTH_INTERVAL)),
        },
    };
    let http = kind != HealthKind::Tcp;
    Ok(HealthCheck {
        kind,
        interval_ms: Some(interval_ms),
        timeout_ms: Some(interval_ms.min(1000)),
        rise: Some(2),
        fall: Some(3),
        port: None,
        path,
        host: None,
        expect_status: http.then_some(200),
        send: None,
        expect: None,
        on_down: Some(OnDownName::Keep),
    })
}

fn parse_settings(s: &SvcSpec, problems: &mut Vec<Problem>) -> Settings {
    let bad = |problems: &mut Vec<Problem>, k: &str, v: &str, allowed: &str| {
        problems.push(Problem { reason: Reason::InvalidAnnotation, message: format!("{k}: '{v}' is not one of {allowed}; the default is used") })
    };
    let get = |k: &str| s.annotations.get(k).map(|v| v.trim().to_ascii_lowercase());
    let mode = match get(ann::MODE).as_deref() {
        None | Some("fnat") => ModeName::Fnat,
        Some("nat") => ModeName::Nat,
        Some("dr") => ModeName::Dr,
        Some("tun") => ModeName::Tun,
        Some(v) => {
            bad(problems, ann::MODE, v, "fnat, nat, dr, tun");
            ModeName::Fnat
        }
    };
    let named = match get(ann::SCHEDULER).as_deref() {
        None => None,
        Some("rr") => Some(SchedulerName::Rr),
        Some("wrr") => Some(SchedulerName::Wrr),
        Some("wlc") => Some(SchedulerName::Wlc),
        Some("sh") => Some(SchedulerName::Sh),
        Some("maglev") => Some(SchedulerName::Maglev),
        Some(v) => {
            bad(problems, ann::SCHEDULER, v, "rr, wrr, wlc, sh, maglev");
            None
        }
    };
    // sessionAffinity ClientIP is kept by the daemon's affinity entries, whatever picks a
    // client's first backend.
    let scheduler = named.unwrap_or(SchedulerName::Maglev);
    let synproxy = match get(ann::SYNPROXY).as_deref() {
        None | Some("off") => SynProxyName::Off,
        Some("on") => SynProxyName::On,
        Some("auto") => SynProxyName::Auto,
        Some(v) => {
            bad(problems, ann::SYNPROXY, v, "on, off, auto");
            SynProxyName::Off
        }
    };
    let health = match s.annotations.get(ann::HEALTH_CHECK).map(|v| v.trim().to_string()) {
        None => None,
        Some(k) => match health_check(&k, s.annotations.get(ann::HEALTH_INTERVAL).map(String::as_str)) {
            Ok(h) => Some(h),
            Err(message) => {
                problems.push(Problem { reason: Reason::InvalidAnnotation, message });
                None
            }
        },
    };
    Settings { mode, scheduler, synproxy, health }
}

/// A daemon's part in the specs: its local addresses for full NAT.
#[derive(Debug, Clone, Default)]
pub struct DaemonSide {
    pub local_addrs: Vec<IpAddr>,
    pub peer_local_addrs: Vec<IpAddr>,
}

/// The daemon services of one Service (one per TCP or UDP port) and its problems.
pub fn build(s: &SvcSpec, slices: &[SliceIn], d: &DaemonSide) -> (Vec<NewService>, Vec<Problem>) {
    let mut problems = Vec::new();
    let Some(ip) = s.ip else { return (Vec::new(), problems) };
    let family = Family::of(&ip);
    let set = parse_settings(s, &mut problems);
    let mut out = Vec::new();
    let (laddrs, peer_laddrs): (Vec<IpAddr>, Vec<IpAddr>) = if set.mode == ModeName::Fnat && !s.local_addrs.is_empty() {
        (s.local_addrs.iter().filter(|a| Family::of(a) == family).copied().collect(), Vec::new())
    } else if set.mode == ModeName::Fnat {
        (d.local_addrs.iter().filter(|a| Family::of(a) == family).copied().collect(), d.peer_local_addrs.iter().filter(|a| Family::of(a) == family).copied().collect())
    } else {
        (Vec::new(), Vec::new())
    };
    // A NAT cluster IP masquerades the clients outside the pod networks to this node's
    // address of its family (when it has one).
    let (laddrs, keep_source): (Vec<IpAddr>, Vec<String>) = if set.mode == ModeName::Nat {
        let keep: Vec<String> = s.keep_source.iter().filter(|p| p.contains(':') == (family == Family::V6)).cloned().collect();
        let masq: Vec<IpAddr> = s.local_addrs.iter().filter(|a| Family::of(a) == family).copied().collect();
        if keep.is_empty() || masq.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            (masq, keep)
        }
    } else {
        (laddrs, Vec::new())
    };
    if set.mode == ModeName::Fnat && laddrs.is_empty() {
        problems.push(Problem {
            reason: Reason::NoLocalAddress,
            message: format!("full NAT needs a local address of the {} family on every daemon; one has none", if family == Family::V4 { "IPv4" } else { "IPv6" }),
        });
        return (out, problems);
    }
    let want_type = if family == Family::V4 { "IPv4" } else { "IPv6" };
    let mut no_endpoints = Vec::new();
    for p in &s.ports {
        let proto = match p.protocol.as_str() {
            "TCP" | "" => Proto::Tcp,
            "UDP" => Proto::Udp,
            other => {
                problems.push(Problem {
                    reason: Reason::UnsupportedProtocol,
                    message: format!("port {} ({other}): only TCP and UDP are load-balanced; this port is not served", p.port),
                });
                continue;
            }
        };
        // (address, port) → weight; ready first, serving-and-terminating as drained.
        let mut ready: BTreeMap<(IpAddr, u16), bool> = BTreeMap::new();
        let mut refused: Vec<IpAddr> = Vec::new();
        for sl in slices.iter().filter(|sl| sl.address_type == want_type) {
            let Some((_, _, target)) = sl.ports.iter().find(|(n, pr, _)| n == &p.name && (pr == &p.protocol || (pr.is_empty() && proto == Proto::Tcp))) else { continue };
            for e in &sl.endpoints {
                if !(e.ready || e.serving) {
                    continue;
                }
                if s.local_node.is_some() && e.node != s.local_node {
                    continue;
                }
                for a in e.addrs.iter().filter(|a| Family::of(a) == family) {
                    if !backend_address(a) {
                        refused.push(*a);
                        continue;
                    }
                    let r = ready.entry((*a, *target)).or_insert(false);
                    *r |= e.ready;
                }
            }
        }
        if !refused.is_empty() {
            refused.sort();
            refused.dedup();
            problems.push(Problem {
                reason: Reason::InvalidEndpoint,
                message: format!("endpoints {refused:?}: loopback, link-local, unspecified or multicast addresses are never backends; left out"),
            });
        }
        let any_ready = ready.values().any(|r| *r);
        let backends: Vec<NewBackend> = ready.iter().map(|((addr, port), r)| NewBackend { addr: *addr, port: *port, weight: u32::from(*r || !any_ready) }).collect();
        if backends.is_empty() {
            no_endpoints.push(format!("{}/{}", p.port, p.protocol));
        }
        let synproxy = if proto == Proto::Tcp && matches!(set.mode, ModeName::Fnat | ModeName::Nat) { set.synproxy } else { SynProxyName::Off };
        if synproxy != set.synproxy {
            problems.push(Problem {
                reason: Reason::InvalidAnnotation,
                message: format!("{}: only TCP ports in fnat or nat mode use the SYN proxy; port {} goes without", ann::SYNPROXY, p.port),
            });
        }
        out.push(NewService {
            vip: ip,
            port: p.port,
            proto,
            mode: set.mode,
            scheduler: Some(set.scheduler),
            table_size: None,
            local_addrs: laddrs.clone(),
            keep_source: keep_source.clone(),
            peer_local_addrs: peer_laddrs.clone(),
            toa: false,
            synproxy: Some(synproxy),
            affinity_timeout_s: s.affinity_timeout_s,
            health: if proto == Proto::Tcp { set.health.clone() } else { None },
            backends,
        });
    }
    if !no_endpoints.is_empty() {
        problems.push(Problem { reason: Reason::NoEndpoints, message: format!("no serving endpoint for port {}: new connections are refused", no_endpoints.join(", ")) });
    }
    problems.sort();
    problems.dedup();
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(a: &str, ready: bool, serving: bool, terminating: bool) -> EndpointIn {
        EndpointIn { addrs: vec![a.parse().unwrap()], node: None, ready, serving, terminating }
    }

    fn svc(ports: &[(&str, &str, u16)]) -> SvcSpec {
        SvcSpec {
            key: "ns/s".into(),
            ip: Some("10.0.0.100".parse().unwrap()),
            ports: ports.iter().map(|(n, p, port)| PortIn { name: n.to_string(), protocol: p.to_string(), port: *port }).collect(),
            ..Default::default()
        }
    }

    fn daemon() -> DaemonSide {
        DaemonSide { local_addrs: vec!["10.1.0.200".parse().unwrap(), "2001:db8:1::200".parse().unwrap()], peer_local_addrs: vec![] }
    }

    #[test]
    fn ready_serving_and_terminating_endpoints() {
        let s = svc(&[("http", "TCP", 80), ("dns", "UDP", 53), ("x", "SCTP", 9)]);
        let slices = [
            SliceIn {
                address_type: "IPv4".into(),
                ports: vec![("http".into(), "TCP".into(), 8080), ("dns".into(), "UDP".into(), 5353)],
                endpoints: vec![ep("10.1.0.101", true, true, false), ep("10.1.0.102", false, true, true), ep("10.1.0.103", false, false, false)],
            },
            SliceIn { address_type: "IPv6".into(), ports: vec![("http".into(), "TCP".into(), 8080)], endpoints: vec![ep("2001:db8::1", true, true, false)] },
        ];
        let (specs, problems) = build(&s, &slices, &daemon());
        assert_eq!(specs.len(), 2);
        let http = &specs[0];
        assert_eq!((http.port, http.proto, http.mode, http.scheduler), (80, Proto::Tcp, ModeName::Fnat, Some(SchedulerName::Maglev)));
        assert_eq!(http.local_addrs, vec!["10.1.0.200".parse::<IpAddr>().unwrap()]);
        let w: Vec<(String, u16, u32)> = http.backends.iter().map(|b| (b.addr.to_string(), b.port, b.weight)).collect();
        assert_eq!(w, vec![("10.1.0.101".into(), 8080, 1), ("10.1.0.102".into(), 8080, 0)]);
        assert_eq!(specs[1].backends.len(), 2);
        assert_eq!(specs[1].proto, Proto::Udp);
        assert_eq!(problems.iter().map(|p| p.reason).collect::<Vec<_>>(), vec![Reason::UnsupportedProtocol]);
    }

    #[test]
    fn endpoints_that_are_no_backends_are_left_out_with_a_problem() {
        let s = svc(&[("", "TCP", 80)]);
        let slices = [SliceIn {
            address_type: "IPv4".into(),
            ports: vec![("".into(), "TCP".into(), 80)],
            endpoints: ["10.1.0.101", "169.254.169.254", "127.0.0.1", "0.0.0.0", "224.0.0.1"].iter().map(|a| ep(a, true, true, false)).collect(),
        }];
        let (specs, problems) = build(&s, &slices, &daemon());
        let addrs: Vec<String> = specs[0].backends.iter().map(|b| b.addr.to_string()).collect();
        assert_eq!(addrs, ["10.1.0.101"], "a link-local (metadata service), loopback, unspecified or multicast endpoint became a backend");
        assert!(problems.iter().any(|p| p.reason == Reason::InvalidEndpoint && p.message.contains("169.254.169.254")), "{problems:?}");
        for (a, ok) in [("fe80::1", false), ("::1", false), ("::ffff:10.0.0.1", false), ("ff02::1", false), ("2001:db8::5", true), ("10.244.1.5", true)] {
            assert_eq!(backend_address(&a.parse().unwrap()), ok, "{a}");
        }
    }

    #[test]
    fn terminating_endpoints_serve_when_no_endpoint_is_ready_and_none_is_reported() {
        let s = svc(&[("", "TCP", 80)]);
        let slices = [SliceIn { address_type: "IPv4".into(), ports: vec![("".into(), "TCP".into(), 80)], endpoints: vec![ep("10.1.0.102", false, true, true)] }];
        let (specs, problems) = build(&s, &slices, &daemon());
        assert_eq!(specs[0].backends[0].weight, 1);
        assert!(problems.is_empty());
        let (specs, problems) = build(&s, &[], &daemon());
        assert!(specs[0].backends.is_empty());
        assert_eq!(problems[0].reason, Reason::NoEndpoints);
    }

    #[test]
    fn a_local_policy_takes_only_the_nodes_endpoints() {
        let mut s = svc(&[("", "TCP", 80)]);
        let mut here = ep("10.244.1.5", true, true, false);
        here.node = Some("node-1".into());
        let mut there = ep("10.244.2.5", true, true, false);
        there.node = Some("node-2".into());
        let slices = [SliceIn { address_type: "IPv4".into(), ports: vec![("".into(), "TCP".into(), 8080)], endpoints: vec![here, there] }];
        let addrs = |s: &SvcSpec| build(s, &slices, &daemon()).0[0].backends.iter().map(|b| b.addr.to_string()).collect::<Vec<_>>();
        s.annotations.insert("vectorlb.io/mode".into(), "nat".into());
        assert_eq!(addrs(&s), ["10.244.1.5", "10.244.2.5"]);
        s.local_node = Some("node-1".into());
        assert_eq!(addrs(&s), ["10.244.1.5"]);
        s.local_node = Some("node-3".into());
        let (specs, problems) = build(&s, &slices, &daemon());
        assert!(specs[0].backends.is_empty(), "no endpoint on the node: refused");
        assert!(problems.iter().any(|p| p.reason == Reason::NoEndpoints));
    }

    #[test]
    fn annotations_and_affinity() {
        let mut s = svc(&[("", "UDP", 53)]);
        s.annotations.insert("vectorlb.io/mode".into(), "NAT".into());
        s.annotations.insert("vectorlb.io/scheduler".into(), "wrr".into());
        s.annotations.insert("vectorlb.io/synproxy".into(), "on".into());
        s.affinity_timeout_s = Some(10_800);
        let (specs, problems) = build(&s, &[], &daemon());
        assert_eq!((specs[0].mode, specs[0].scheduler, specs[0].synproxy), (ModeName::Nat, Some(SchedulerName::Wrr), Some(SynProxyName::Off)));
        assert_eq!(specs[0].affinity_timeout_s, Some(10_800), "affinity by entries, beside any scheduler");
        assert!(specs[0].local_addrs.is_empty());
        let reasons: Vec<&str> = problems.iter().map(|p| p.reason.as_str()).collect();
        assert!(reasons.contains(&"InvalidAnnotation") && reasons.contains(&"NoEndpoints"), "{problems:?}");
        s.annotations.insert("vectorlb.io/mode".into(), "bogus".into());
        let (specs, problems) = build(&s, &[], &DaemonSide::default());
        assert!(specs.is_empty(), "full NAT without a local address programs nothing");
        assert!(problems.iter().any(|p| p.reason == Reason::NoLocalAddress));
        assert!(problems.iter().any(|p| p.message.contains("'bogus'")));
    }

    #[test]
    fn health_check_annotations() {
        let mut s = svc(&[("http", "TCP", 80), ("dns", "UDP", 53)]);
        s.annotations.insert("vectorlb.io/health-check".into(), "HTTP:/Healthz".into());
        s.annotations.insert("vectorlb.io/health-interval".into(), "1.5".into());
        let (specs, problems) = build(&s, &[], &daemon());
        let h = specs.iter().find(|x| x.proto == Proto::Tcp).and_then(|x| x.health.clone()).expect("a check on the TCP port");
        assert_eq!((h.kind, h.path.as_deref(), h.interval_ms, h.timeout_ms, h.expect_status), (HealthKind::Http, Some("/Healthz"), Some(1500), Some(1000), Some(200)));
        assert!(specs.iter().find(|x| x.proto == Proto::Udp).is_some_and(|x| x.health.is_none()), "UDP ports are not checked by TCP or HTTP");
        assert!(!problems.iter().any(|p| p.reason == Reason::InvalidAnnotation), "{problems:?}");
        for (k, v, want) in [
            ("health-check", "icmp", "is not tcp"),
            ("health-check", "http:healthz", "must start with /"),
            ("health-interval", "0", "1..=3600"),
            ("health-interval", "0.05", "1..=3600"),
        ] {
            let mut s = s.clone();
            s.annotations.insert(format!("vectorlb.io/{k}"), v.into());
            let (specs, problems) = build(&s, &[], &daemon());
            assert!(specs.iter().all(|x| x.health.is_none()), "{k}={v}");
            assert!(problems.iter().any(|p| p.reason == Reason::InvalidAnnotation && p.message.contains(want)), "{k}={v}: {problems:?}");
        }
    }
}
