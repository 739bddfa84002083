//! `[[services]]` (with their health checks) and `[[snat]]`: what the LB balances and translates.

use crate::error::{bail, Error};
use crate::file::{RawService, RawSnat};
use crate::health::{health_spec, HealthSpec};
use crate::values::{ip, prefix, timeouts};
use std::net::IpAddr;
use vectorlb_lb::{BackendSpec, Mode, ServiceSpec, SnatSpec, SynProxy, Timeouts};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

/// The services and, by index, their health checks.
pub(crate) fn services(raw: &[RawService], base: &Timeouts) -> Result<(Vec<ServiceSpec>, Vec<Option<HealthSpec>>), Error> {
    let mut services = Vec::new();
    let mut health = Vec::new();
    // A unicast address, or an error naming the field.
    let unicast = |field: String, a: IpAddr| -> Result<IpAddr, Error> {
        match vectorlb_lb::service::not_unicast(a) {
            Some(why) => Err(Error::Invalid { field, problem: format!("'{a}' is {why}") }),
            None => Ok(a),
        }
    };
    for (i, s) in raw.iter().enumerate() {
        let f = format!("services[{i}]");
        let vip = unicast(format!("{f}.vip"), ip(&format!("{f}.vip"), &s.vip)?)?;
        let protocol = match s.proto.as_str() {
            "tcp" => proto::TCP,
            "udp" => proto::UDP,
            p => bail!("{f}.proto: '{p}' is not tcp or udp"),
        };
        let mode = Mode::parse(&s.mode).ok_or_else(|| Error::invalid(format!("{f}.mode: '{}' is not one of nat, fnat, dr, tun", s.mode)))?;
        let sched_name = s.scheduler.as_deref().unwrap_or("wrr");
        let mut scheduler = Algorithm::parse(sched_name).ok_or_else(|| Error::invalid(format!("{f}.scheduler: '{sched_name}' is not one of rr, wrr, wlc, sh, maglev")))?;
        if let Some(n) = s.table_size {
            match &mut scheduler {
                Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => *table_size = n,
                _ => bail!("{f}.table_size: only sh and maglev have a table"),
            }
        }
        let mut local_addrs: Vec<IpAddr> = Vec::new();
        for (k, a) in s.local_addrs.iter().enumerate() {
            let lf = format!("{f}.local_addrs[{k}]");
            let a = unicast(lf.clone(), ip(&lf, a)?)?;
            if local_addrs.contains(&a) {
                bail!("{lf}: '{a}' is listed twice");
            }
            local_addrs.push(a);
        }
        if !matches!(mode, Mode::Fnat | Mode::Nat) && !local_addrs.is_empty() {
            bail!("{f}.local_addrs: only fnat services (and nat services masquerading clients outside keep_source) use local addresses");
        }
        let mut keep_source = Vec::new();
        for (k, p) in s.keep_source.iter().enumerate() {
            let kf = format!("{f}.keep_source[{k}]");
            let (a, len) = prefix(&kf, p)?;
            if a.is_ipv4() != vip.is_ipv4() {
                bail!("{kf}: '{p}' is not of the VIP's family");
            }
            keep_source.push((a, len));
        }
        if !keep_source.is_empty() && (mode != Mode::Nat || local_addrs.is_empty()) {
            bail!("{f}.keep_source: only nat services with local_addrs (the clients outside it are masqueraded to them)");
        }
        let mut peer_local_addrs: Vec<IpAddr> = Vec::new();
        for (k, a) in s.peer_local_addrs.iter().enumerate() {
            let lf = format!("{f}.peer_local_addrs[{k}]");
            let a = unicast(lf.clone(), ip(&lf, a)?)?;
            if peer_local_addrs.contains(&a) || local_addrs.contains(&a) {
                bail!("{lf}: '{a}' is listed twice (a peer's local address is not also this node's)");
            }
            peer_local_addrs.push(a);
        }
        if mode != Mode::Fnat && !peer_local_addrs.is_empty() {
            bail!("{f}.peer_local_addrs: only fnat services use local addresses");
        }
        if s.toa && (mode != Mode::Fnat || protocol != proto::TCP) {
            bail!("{f}.toa: only tcp fnat services can insert the TOA option");
        }
        let sp_word = s.synproxy.as_deref().unwrap_or("off");
        let synproxy = SynProxy::parse(sp_word, s.synproxy_half_open).ok_or_else(|| Error::invalid(format!("{f}.synproxy: '{sp_word}' is not one of off, on, auto")))?;
        if synproxy != SynProxy::Off && (protocol != proto::TCP || !matches!(mode, Mode::Nat | Mode::Fnat)) {
            bail!("{f}.synproxy: only tcp nat and fnat services (the proxy must see both directions)");
        }
        match (s.synproxy_half_open, synproxy) {
            (Some(_), SynProxy::On | SynProxy::Off) => bail!("{f}.synproxy_half_open: only with synproxy = \"auto\""),
            (Some(0), _) => bail!("{f}.synproxy_half_open: must be at least 1"),
            _ => {}
        }
        let mut backends = Vec::new();
        for (j, b) in s.backends.iter().enumerate() {
            let bf = format!("{f}.backends[{j}]");
            backends.push(BackendSpec {
                addr: unicast(format!("{bf}.addr"), ip(&format!("{bf}.addr"), &b.addr)?)?,
                port: b.port,
                weight: b.weight.unwrap_or(1),
                quic_id: b.quic_id,
            });
        }
        let t = match &s.timeouts {
            Some(r) => timeouts(&format!("{f}.timeouts"), r, base)?,
            None => *base,
        };
        let continuation = match s.continuation {
            None => ServiceSpec::continuation_default(protocol, mode, scheduler, synproxy),
            Some(true) if protocol != proto::TCP => bail!("{f}.continuation: only tcp services (every UDP datagram opens its flow)"),
            Some(true) => match ServiceSpec::continuation_refused(mode, scheduler, synproxy) {
                Some(why) => bail!("{f}.continuation: {why}"),
                None => true,
            },
            Some(false) => false,
        };
        if s.quic && protocol != proto::UDP {
            bail!("{f}.quic: only udp services (QUIC runs over UDP)");
        }
        for (j, b) in backends.iter().enumerate() {
            match b.quic_id {
                Some(_) if !s.quic => bail!("{f}.backends[{j}].quic_id: the service's quic is off"),
                Some(0) => bail!("{f}.backends[{j}].quic_id: 0 is no server id (1..=4294967295)"),
                Some(q) if backends[..j].iter().any(|o| o.quic_id == Some(q)) => bail!("{f}.backends[{j}].quic_id: {q} is given to another backend too"),
                _ => {}
            }
        }
        services.push(ServiceSpec {
            vip,
            port: s.port,
            proto: protocol,
            mode,
            scheduler,
            backends,
            local_addrs,
            keep_source,
            peer_local_addrs,
            toa: s.toa,
            synproxy,
            timeouts: t,
            continuation,
            quic: s.quic,
            affinity_ms: match s.affinity_timeout_s.map(vectorlb_lb::affinity::timeout_ms) {
                Some(Ok(ms)) => ms,
                Some(Err(e)) => bail!("{f}.affinity_timeout_s: {e}"),
                None => 0,
            },
        });
        health.push(match &s.health {
            Some(h) => Some(health_spec(&format!("{f}.health"), h, protocol)?),
            None => None,
        });
    }
    // No backend is a local address of the load balancer, or a VIP's port a service has (it
    // would forward to itself); another port of a VIP may be (hostNetwork endpoints listen on
    // a node's address that has NodePorts).
    let laddrs: Vec<IpAddr> = services.iter().flat_map(|s| s.local_addrs.iter().chain(s.peer_local_addrs.iter()).copied()).collect();
    for (i, s) in services.iter().enumerate() {
        for (j, b) in s.backends.iter().enumerate() {
            let port = if b.port == 0 { s.port } else { b.port };
            let on_vip = services.iter().any(|o| o.vip == b.addr && o.proto == s.proto && (port == 0 || o.port == 0 || o.port == port));
            if laddrs.contains(&b.addr) || on_vip {
                bail!("services[{i}].backends[{j}].addr: '{}' is a local address of this load balancer, or a VIP with a service on that port", b.addr);
            }
        }
    }
    Ok((services, health))
}

pub(crate) fn snat(raw: &[RawSnat], base: &Timeouts) -> Result<Vec<SnatSpec>, Error> {
    let mut snat = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let f = format!("snat[{i}]");
        let (source, prefix_len) = prefix(&format!("{f}.source"), &r.source)?;
        let addrs = r.addrs.iter().map(|a| ip(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
        let t = match &r.timeouts {
            Some(x) => timeouts(&format!("{f}.timeouts"), x, base)?,
            None => *base,
        };
        let mut except = Vec::with_capacity(r.except.len());
        for (k, p) in r.except.iter().enumerate() {
            let (a, len) = prefix(&format!("{f}.except[{k}]"), p)?;
            if a.is_ipv4() != source.is_ipv4() {
                bail!("{f}.except[{k}]: '{p}' is not of the source's family");
            }
            except.push((a, len));
        }
        snat.push(SnatSpec { source, prefix_len, addrs, timeouts: t, except, outbound_only: r.outbound_only });
    }
    Ok(snat)
}
