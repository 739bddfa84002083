//! Prometheus text exposition (`GET /metrics`), and the counter reference in the documentation.
//! Both come from the lists declared once: [`DropReason`], [`Events`] and [`IoCounters`].

use crate::health::Target;
use crate::workers::IoCounters;
use crate::Daemon;
use std::fmt::Write;
use vectorlb_lb::service::{backend_slot, key};
use vectorlb_lb::verdict::Events;
use vectorlb_lb::DropReason;

/// The worker loops' counters that are drops (they join `vectorlb_drops_total`).
pub const IO_DROPS: &[&str] = &["tx_full", "multi_segment", "handoff_full", "rate_limited", "offload_failed"];

use vectorlb_http::prom::{esc, head};

fn proto_name(p: u8) -> &'static str {
    vectorlb_api::model::Proto::of(p).name()
}

/// One set's series of a histogram (`bounds` and its sum divided by `divisor`: ns to s).
fn histogram<const N: usize>(o: &mut String, m: &str, set: &str, h: &crate::queue_sets::Histogram<N>, bounds: &[u64; N], divisor: f64) {
    vectorlb_http::prom::histogram(o, m, &format!("set=\"{set}\""), h.cumulative(bounds, divisor), h.sum as f64 / divisor, h.count());
}

pub fn render(d: &Daemon) -> String {
    let snap = d.config.control.snapshot();
    let t = d.workers.totals();
    let c = &t.counters;
    let mut o = String::with_capacity(8192);
    for (name, help, v) in c.events.iter() {
        let m = format!("vectorlb_{name}_total");
        head(&mut o, &m, "counter", help);
        let _ = writeln!(o, "{m} {v}");
    }
    for (name, help, v) in t.io.iter().filter(|(n, _, _)| !IO_DROPS.contains(n)) {
        let m = format!("vectorlb_io_{name}_total");
        head(&mut o, &m, "counter", help);
        let _ = writeln!(o, "{m} {v}");
    }
    head(&mut o, "vectorlb_drops_total", "counter", "Dropped packets by reason (docs/metrics.md lists them).");
    for (name, v) in c.drop_counts() {
        let _ = writeln!(o, "vectorlb_drops_total{{reason=\"{name}\"}} {v}");
    }
    for (name, _, v) in t.io.iter().filter(|(n, _, _)| IO_DROPS.contains(n)) {
        let _ = writeln!(o, "vectorlb_drops_total{{reason=\"{name}\"}} {v}");
    }
    // Network policy: only once a set was pushed.
    let pol = d.policy.status();
    if pol.generation > 0 {
        head(&mut o, "vectorlb_policy_endpoints", "gauge", "This node's pods with a direction under network policy.");
        let _ = writeln!(o, "vectorlb_policy_endpoints {}", pol.enforced);
        head(&mut o, "vectorlb_policy_flows", "gauge", "Flows remembered as allowed by network policy.");
        let _ = writeln!(o, "vectorlb_policy_flows {}", pol.flows);
        head(&mut o, "vectorlb_policy_denied_total", "counter", "New flows denied, by the policy that decided.");
        for (p, v) in &pol.denied_by_policy {
            let _ = writeln!(o, "vectorlb_policy_denied_total{{policy=\"{}\"}} {v}", esc(p));
        }
        head(&mut o, "vectorlb_policy_endpoint_denied_total", "counter", "New flows denied, by pod and direction.");
        for (e, [i, out]) in &pol.denied_by_endpoint {
            let e = esc(e);
            let _ = writeln!(o, "vectorlb_policy_endpoint_denied_total{{endpoint=\"{e}\",direction=\"ingress\"}} {i}");
            let _ = writeln!(o, "vectorlb_policy_endpoint_denied_total{{endpoint=\"{e}\",direction=\"egress\"}} {out}");
        }
    }
    // Queue sets: each set's workers (and the default set's), summed.
    let sets = d.config.queue_sets.load();
    if !sets.is_empty() || d.config.with(|c| c.default_ingress.is_some()) {
        head(&mut o, "vectorlb_queue_set_workers", "gauge", "Workers dedicated to each queue set (default: the rest).");
        head(&mut o, "vectorlb_queue_set_packets_total", "counter", "Packets of each queue set's workers: received (the pipeline's rx), sent (tx), steered to another set's worker, kept for a session, dropped (every reason), dropped by the set's egress limit.");
        use crate::queue_sets::{DEPTH_BOUNDS, TIME_BOUNDS_NS};
        let groups: Vec<_> = (0..sets.members.len()).map(|g| (esc(sets.name(g)), d.workers.group_totals(&sets, g))).collect();
        for ((name, p), members) in groups.iter().zip(&sets.members) {
            let _ = writeln!(o, "vectorlb_queue_set_workers{{set=\"{name}\"}} {}", members.len());
            for (k, v) in p.group_packets() {
                let _ = writeln!(o, "vectorlb_queue_set_packets_total{{set=\"{name}\",kind=\"{k}\"}} {v}");
            }
        }
        let m = "vectorlb_queue_set_wait_seconds";
        head(&mut o, m, "histogram", "How long each packet a queue set's workers received may have waited on its queue: the time since its worker's previous polling round began.");
        for (name, p) in &groups {
            histogram(&mut o, m, name, &p.queues.wait, &TIME_BOUNDS_NS, 1e9);
        }
        let m = "vectorlb_queue_set_residence_seconds";
        head(&mut o, m, "histogram", "Per packet a queue set's workers received: from its polling round's start to the end of that round's transmit.");
        for (name, p) in &groups {
            histogram(&mut o, m, name, &p.queues.residence, &TIME_BOUNDS_NS, 1e9);
        }
        let m = "vectorlb_queue_set_queue_depth";
        head(
            &mut o,
            m,
            "histogram",
            "Packets waiting on a queue set's queues per receive that found any: taken and still queued (where the queue can tell; otherwise taken, at most a burst).",
        );
        for (name, p) in &groups {
            histogram(&mut o, m, name, &p.queues.depth, &DEPTH_BOUNDS, 1.0);
        }
        // Before the ring: what the AF_XDP ports' XDP programs counted (absent without them).
        let xdp: Vec<_> = d.config.xdp_queue_set_stats(&sets).unwrap_or_default().into_iter().enumerate().map(|(g, x)| (esc(sets.name(g)), x)).collect();
        if !xdp.is_empty() {
            head(
                &mut o,
                "vectorlb_queue_set_xdp_packets_total",
                "counter",
                "Packets of each queue set in the XDP program of the AF_XDP ports: passed to the data plane, or dropped by the default set's ingress limit (policed).",
            );
            for (name, x) in &xdp {
                let _ = writeln!(o, "vectorlb_queue_set_xdp_packets_total{{set=\"{name}\",kind=\"passed\"}} {}", x.packets);
                let _ = writeln!(o, "vectorlb_queue_set_xdp_packets_total{{set=\"{name}\",kind=\"policed\"}} {}", x.policed);
            }
            head(&mut o, "vectorlb_queue_set_xdp_bytes_total", "counter", "Bytes of each queue set the XDP program of the AF_XDP ports passed to the data plane.");
            for (name, x) in &xdp {
                let _ = writeln!(o, "vectorlb_queue_set_xdp_bytes_total{{set=\"{name}\"}} {}", x.bytes);
            }
        }
    }
    head(&mut o, "vectorlb_sessions", "gauge", "Live sessions (all workers).");
    let _ = writeln!(o, "vectorlb_sessions {}", t.sessions);
    head(&mut o, "vectorlb_ha_state", "gauge", "HA state of this node (1 for the current one).");
    for st in [crate::ha::STANDALONE, crate::ha::MASTER, crate::ha::BACKUP] {
        let _ = writeln!(o, "vectorlb_ha_state{{state=\"{}\"}} {}", crate::ha::name(st), (d.ha.state() == st) as u8);
    }
    head(&mut o, "vectorlb_ha_transitions_total", "counter", "HA state changes.");
    let _ = writeln!(o, "vectorlb_ha_transitions_total {}", d.ha.transitions.load(std::sync::atomic::Ordering::Relaxed));
    // Session sync's series exist (all zero) when it is not configured, so dashboards and
    // alerts need no special case; vectorlb_sync_configured tells the two apart.
    {
        let st = d.sync.as_ref().map(|sy| sy.status()).unwrap_or_default();
        head(&mut o, "vectorlb_sync_configured", "gauge", "1 when session sync ([ha]) is configured.");
        let _ = writeln!(o, "vectorlb_sync_configured {}", d.sync.is_some() as u8);
        head(&mut o, "vectorlb_sync_ready", "gauge", "1 when this node has its sync group's sessions (always 1 in a pair; 0 unconfigured).");
        let _ = writeln!(o, "vectorlb_sync_ready {}", (d.sync.is_some() && st.ready) as u8);
        head(&mut o, "vectorlb_sync_records_total", "counter", "Session sync records by direction and outcome.");
        for (k, v) in [
            ("sent", st.records_sent),
            ("dropped_over_rate", st.records_dropped),
            ("received", st.records_received),
            ("installed", st.installed),
            ("rejected_unknown", st.rejected.unknown),
            ("rejected_stale", st.rejected.stale),
            ("rejected_port_taken", st.rejected.port_taken),
            ("rejected_table_full", st.rejected.table_full),
            ("bulk_sent", st.bulk.records_sent),
            ("bulk_received", st.bulk.records_received),
        ] {
            let _ = writeln!(o, "vectorlb_sync_records_total{{kind=\"{k}\"}} {v}");
        }
        head(&mut o, "vectorlb_sync_messages_refused_total", "counter", "Sync messages dropped, by reason.");
        let r = &st.refused;
        for (k, v) in [("foreign", r.foreign), ("bad_hmac", r.bad_hmac), ("truncated", r.truncated), ("malformed", r.malformed), ("replayed", r.replayed), ("outdated", r.outdated)]
        {
            let _ = writeln!(o, "vectorlb_sync_messages_refused_total{{reason=\"{k}\"}} {v}");
        }
        head(&mut o, "vectorlb_sync_unacked_datagrams", "gauge", "Sync datagrams the standby has not acknowledged (lag).");
        let _ = writeln!(o, "vectorlb_sync_unacked_datagrams {}", st.unacked_datagrams);
        head(&mut o, "vectorlb_sync_batch_period_seconds", "gauge", "Current batching period (adapts to load and acknowledgements).");
        let _ = writeln!(o, "vectorlb_sync_batch_period_seconds {}", st.batch_period_ms / 1000.0);
    }
    // BGP's series exist only with [bgp] (vectorlb_bgp_configured tells).
    head(&mut o, "vectorlb_bgp_configured", "gauge", "1 when the VIPs are announced by BGP ([bgp]).");
    let _ = writeln!(o, "vectorlb_bgp_configured {}", d.bgp.is_some() as u8);
    if let Some(st) = d.bgp.as_ref().map(|a| a.status()) {
        head(&mut o, "vectorlb_bgp_state", "gauge", "The speaker's state (1 for the current one).");
        for s in ["announcing", "withdrawn", "draining", "drained"] {
            let _ = writeln!(o, "vectorlb_bgp_state{{state=\"{s}\"}} {}", (st.state == s) as u8);
        }
        head(
            &mut o,
            "vectorlb_bgp_announced",
            "gauge",
            "1 for each prefix announced now, 0 for each withheld; route: primary, or backup (a peer's local address, longer AS path).",
        );
        let primary = st.announced.iter().map(|p| (p, "primary", 1)).chain(st.withheld.iter().map(|p| (p, "primary", 0)));
        for (p, r, v) in primary.chain(st.announced_backup.iter().map(|p| (p, "backup", 1))) {
            let _ = writeln!(o, "vectorlb_bgp_announced{{prefix=\"{p}\",route=\"{r}\"}} {v}");
        }
        head(&mut o, "vectorlb_bgp_session_up", "gauge", "1 while the BGP session with a neighbour is established.");
        for n in &st.neighbors {
            let _ = writeln!(o, "vectorlb_bgp_session_up{{neighbor=\"{}\",asn=\"{}\"}} {}", n.address, n.asn, n.established as u8);
        }
        head(&mut o, "vectorlb_bgp_bird_up", "gauge", "1 while BIRD runs.");
        let _ = writeln!(o, "vectorlb_bgp_bird_up {}", st.bird_running as u8);
        head(&mut o, "vectorlb_bgp_bird_restarts_total", "counter", "Times BIRD was started again after it died.");
        let _ = writeln!(o, "vectorlb_bgp_bird_restarts_total {}", st.bird_restarts);
        head(&mut o, "vectorlb_bgp_changes_total", "counter", "Changes of the announced set sent to BIRD.");
        let _ = writeln!(o, "vectorlb_bgp_changes_total {}", st.changes);
    }
    head(&mut o, "vectorlb_config_generation", "gauge", "Generation of the running configuration.");
    let _ = writeln!(o, "vectorlb_config_generation {}", d.config.control.generation());
    head(&mut o, "vectorlb_reloads_total", "counter", "Configuration reloads (API, SIGHUP), by result.");
    let _ = writeln!(o, "vectorlb_reloads_total{{result=\"ok\"}} {}", d.config.reloads.load(std::sync::atomic::Ordering::Relaxed));
    let _ = writeln!(o, "vectorlb_reloads_total{{result=\"failed\"}} {}", d.config.reload_failures.load(std::sync::atomic::Ordering::Relaxed));
    head(&mut o, "vectorlb_mbufs_available", "gauge", "Packet buffers free in the pool.");
    let _ = writeln!(o, "vectorlb_mbufs_available {}", d.pool.available());
    head(&mut o, "vectorlb_uptime_seconds", "gauge", "Seconds since the daemon started.");
    let _ = writeln!(o, "vectorlb_uptime_seconds {}", d.workers.started.elapsed().as_secs_f64());

    // The published services: weights as the workers use them (0 for a backend a health
    // check took down with on_down = "keep").
    let mut svc_lines = Vec::new();
    for s in &snap.spec.services {
        let Some(id) = snap.lookup_service(key(s.vip), s.port, s.proto) else { continue };
        let l = format!("vip=\"{}\",port=\"{}\",proto=\"{}\"", esc(&s.vip.to_string()), s.port, proto_name(s.proto));
        svc_lines.push((l, id, c.services.get(id as usize).copied().unwrap_or_default(), s));
    }
    type Svc<'a> = (String, u16, vectorlb_lb::verdict::ServiceCounters, &'a vectorlb_lb::ServiceSpec);
    let per_service = |o: &mut String, name: &str, kind: &str, help: &str, f: &dyn Fn(&Svc) -> String| {
        head(o, name, kind, help);
        for x in &svc_lines {
            let _ = writeln!(o, "{name}{{{}}} {}", x.0, f(x));
        }
    };
    per_service(&mut o, "vectorlb_service_packets_total", "counter", "Packets per service (both directions).", &|x| x.2.packets.to_string());
    per_service(&mut o, "vectorlb_service_bytes_total", "counter", "Bytes per service.", &|x| x.2.bytes.to_string());
    per_service(&mut o, "vectorlb_service_new_sessions_total", "counter", "Sessions created per service.", &|x| x.2.new_sessions.to_string());
    per_service(&mut o, "vectorlb_service_new_sessions_per_second", "gauge", "Sessions created per service per second, over the last 10 s.", &|x| {
        d.rates.service(&(x.3.proto, x.3.vip, x.3.port)).new_sessions.to_string()
    });

    type Be = (String, vectorlb_lb::verdict::BackendCounters, u32, u32);
    let mut be_lines: Vec<Be> = Vec::new();
    for (l, id, _, s) in &svc_lines {
        for b in &s.backends {
            let Some(x) = snap.backends().find(|x| x.svc == *id && x.addr == b.addr && x.port == b.port) else { continue };
            let slot = backend_slot(x.id) as usize;
            let bl = format!("{l},backend=\"{}\",backend_port=\"{}\"", esc(&b.addr.to_string()), b.port);
            be_lines.push((bl, c.backends.get(slot).copied().unwrap_or_default(), t.active.get(slot).copied().unwrap_or(0), b.weight));
        }
    }
    let per_backend = |o: &mut String, name: &str, kind: &str, help: &str, f: &dyn Fn(&Be) -> String| {
        head(o, name, kind, help);
        for x in &be_lines {
            let _ = writeln!(o, "{name}{{{}}} {}", x.0, f(x));
        }
    };
    per_backend(&mut o, "vectorlb_backend_packets_total", "counter", "Packets per backend.", &|x| x.1.packets.to_string());
    per_backend(&mut o, "vectorlb_backend_bytes_total", "counter", "Bytes per backend.", &|x| x.1.bytes.to_string());
    per_backend(&mut o, "vectorlb_backend_new_sessions_total", "counter", "Sessions scheduled to the backend.", &|x| x.1.new_sessions.to_string());
    per_backend(&mut o, "vectorlb_backend_active_sessions", "gauge", "Live sessions per backend.", &|x| x.2.to_string());
    per_backend(&mut o, "vectorlb_backend_weight", "gauge", "Configured weight (0: draining).", &|x| x.3.to_string());

    let health = d.health.all();
    if !health.is_empty() {
        let label = |t: &Target| {
            format!(
                "vip=\"{}\",port=\"{}\",proto=\"{}\",backend=\"{}\",backend_port=\"{}\"",
                esc(&t.vip.to_string()),
                t.vport,
                proto_name(t.proto),
                esc(&t.addr.to_string()),
                t.port
            )
        };
        head(&mut o, "vectorlb_backend_up", "gauge", "Health check state (1 up, 0 down).");
        for (t, s) in &health {
            let _ = writeln!(o, "vectorlb_backend_up{{{}}} {}", label(t), s.up as u8);
        }
        head(&mut o, "vectorlb_backend_health_checks_total", "counter", "Health checks run, by result.");
        for (t, s) in &health {
            let l = label(t);
            let _ = writeln!(o, "vectorlb_backend_health_checks_total{{{l},result=\"ok\"}} {}", s.checks - s.failed_checks);
            let _ = writeln!(o, "vectorlb_backend_health_checks_total{{{l},result=\"fail\"}} {}", s.failed_checks);
        }
        head(&mut o, "vectorlb_backend_health_transitions_total", "counter", "Up/down transitions.");
        for (t, s) in &health {
            let _ = writeln!(o, "vectorlb_backend_health_transitions_total{{{}}} {}", label(t), s.transitions);
        }
        head(&mut o, "vectorlb_backend_health_check_seconds", "gauge", "Duration of the last check.");
        for (t, s) in &health {
            let _ = writeln!(o, "vectorlb_backend_health_check_seconds{{{}}} {}", label(t), s.last_duration.as_secs_f64());
        }
    }
    let ports: Vec<_> = d.ports.iter().map(|p| (format!("port=\"{}\"", esc(&p.name)), p.stats(), p.xstats(), p.link())).collect();
    head(&mut o, "vectorlb_port_packets_total", "counter", "DPDK port counters.");
    for (l, s, _, _) in &ports {
        let _ = writeln!(o, "vectorlb_port_packets_total{{{l},dir=\"rx\"}} {}\nvectorlb_port_packets_total{{{l},dir=\"tx\"}} {}", s.ipackets, s.opackets);
    }
    head(&mut o, "vectorlb_port_bytes_total", "counter", "DPDK port byte counters.");
    for (l, s, _, _) in &ports {
        let _ = writeln!(o, "vectorlb_port_bytes_total{{{l},dir=\"rx\"}} {}\nvectorlb_port_bytes_total{{{l},dir=\"tx\"}} {}", s.ibytes, s.obytes);
    }
    head(&mut o, "vectorlb_port_errors_total", "counter", "DPDK port errors and misses.");
    for (l, s, _, _) in &ports {
        for (k, v) in s.named().into_iter().filter(|(k, _)| matches!(*k, "imissed" | "ierrors" | "oerrors" | "rx_nombuf")) {
            let _ = writeln!(o, "vectorlb_port_errors_total{{{l},kind=\"{k}\"}} {v}");
        }
    }
    head(&mut o, "vectorlb_port_link_up", "gauge", "Link state.");
    for (l, _, _, link) in &ports {
        let _ = writeln!(o, "vectorlb_port_link_up{{{l}}} {}", link.up as u8);
    }
    head(&mut o, "vectorlb_port_xstat", "untyped", "The driver's extended counters.");
    for (l, _, x, _) in &ports {
        for (n, v) in x {
            let _ = writeln!(o, "vectorlb_port_xstat{{{l},name=\"{}\"}} {v}", esc(n));
        }
    }
    memif_metrics(&mut o, d);
    o
}

/// memif ports: the peer's state and each queue pair's counters.
fn memif_metrics(o: &mut String, d: &crate::Daemon) {
    let memifs: Vec<_> = d
        .ports
        .iter()
        .filter_map(|p| match &p.kind {
            crate::PortKind::Memif(m) => Some((format!("port=\"{}\"", esc(&p.name)), m.status(), m.queue_counters())),
            crate::PortKind::Eth(_) | crate::PortKind::Pods(_) => None,
        })
        .collect();
    if memifs.is_empty() {
        return;
    }
    head(o, "vectorlb_memif_connected", "gauge", "1 while the memif peer is connected.");
    for (l, s, _) in &memifs {
        let _ = writeln!(o, "vectorlb_memif_connected{{{l}}} {}", s.connected as u8);
    }
    head(o, "vectorlb_memif_connects_total", "counter", "memif connections made.");
    for (l, s, _) in &memifs {
        let _ = writeln!(o, "vectorlb_memif_connects_total{{{l}}} {}", s.connects);
    }
    head(o, "vectorlb_memif_packets_total", "counter", "Frames through a memif queue pair.");
    for (l, s, _) in &memifs {
        for q in &s.queues {
            let _ = writeln!(
                o,
                "vectorlb_memif_packets_total{{{l},queue=\"{}\",dir=\"rx\"}} {}\nvectorlb_memif_packets_total{{{l},queue=\"{}\",dir=\"tx\"}} {}",
                q.queue, q.rx_packets, q.queue, q.tx_packets
            );
        }
    }
    head(o, "vectorlb_memif_bytes_total", "counter", "Bytes through a memif queue pair.");
    for (l, s, _) in &memifs {
        for q in &s.queues {
            let _ = writeln!(
                o,
                "vectorlb_memif_bytes_total{{{l},queue=\"{}\",dir=\"rx\"}} {}\nvectorlb_memif_bytes_total{{{l},queue=\"{}\",dir=\"tx\"}} {}",
                q.queue, q.rx_bytes, q.queue, q.tx_bytes
            );
        }
    }
    // The copy and error families come from the counters' declaration (vectorlb-memif's
    // `queue_counters!`), by kind.
    use vectorlb_memif::CounterKind;
    head(o, "vectorlb_memif_copies_total", "counter", "Copies by who did them: cpu, dma, or cpu_fallback (the DMA ring was full).");
    for (l, _, queues) in &memifs {
        for (q, c) in queues.iter().enumerate() {
            for (name, _, v) in c.fields().filter(|f| f.1 == CounterKind::Copy) {
                let e = name.trim_start_matches("copies_");
                let _ = writeln!(o, "vectorlb_memif_copies_total{{{l},queue=\"{q}\",engine=\"{e}\"}} {v}");
            }
        }
    }
    head(o, "vectorlb_memif_errors_total", "counter", "Refused descriptors (bad_desc), broken rings (bad_ring), frames too long or without a buffer, transmits into a full ring, frames that were not IP on an IP-mode port (not_ip).");
    for (l, _, queues) in &memifs {
        for (q, c) in queues.iter().enumerate() {
            for (k, _, v) in c.fields().filter(|f| matches!(f.1, CounterKind::RxError | CounterKind::NoBuffer | CounterKind::TxFull)) {
                let _ = writeln!(o, "vectorlb_memif_errors_total{{{l},queue=\"{q}\",kind=\"{k}\"}} {v}");
            }
        }
    }
}

/// The counter reference of `docs/metrics.md` (between its generated-section markers).
pub fn counters_markdown() -> String {
    let mut o = String::new();
    o.push_str("### Drop reasons (`vectorlb_drops_total{reason=...}`, `drops` in `GET /v1/stats`)\n\n| reason | meaning |\n|---|---|\n");
    for r in DropReason::ALL {
        let _ = writeln!(o, "| `{}` | {} |", r.name(), r.help());
    }
    for (n, h) in IoCounters::NAMES.iter().zip(IoCounters::HELP).filter(|(n, _)| IO_DROPS.contains(n)) {
        let _ = writeln!(o, "| `{n}` | Worker loop: {} |", h.trim());
    }
    o.push_str("\n### Pipeline counters (`vectorlb_<name>_total`, the top level of `GET /v1/stats`)\n\n| name | meaning |\n|---|---|\n");
    for (n, h) in Events::NAMES.iter().zip(Events::HELP) {
        let _ = writeln!(o, "| `{n}` | {} |", h.trim());
    }
    o.push_str("\n### Worker-loop counters (`vectorlb_io_<name>_total`, `io` in `GET /v1/stats`)\n\n| name | meaning |\n|---|---|\n");
    for (n, h) in IoCounters::NAMES.iter().zip(IoCounters::HELP).filter(|(n, _)| !IO_DROPS.contains(n)) {
        let _ = writeln!(o, "| `{n}` | {} |", h.trim());
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md carries the generated counter reference; regenerate it with
    /// `VECTORLB_UPDATE_DOCS=1 cargo test -p vectorlb-daemon`.
    #[test]
    fn docs_list_every_counter() {
        const BEGIN: &str = "<!-- BEGIN generated: counters -->\n";
        const END: &str = "<!-- END generated: counters -->";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let text = std::fs::read_to_string(path).expect("docs/metrics.md");
        let (a, rest) = text.split_once(BEGIN).expect("begin marker");
        let (_, b) = rest.split_once(END).expect("end marker");
        let want = format!("{a}{BEGIN}{}{END}{b}", counters_markdown());
        if std::env::var_os("VECTORLB_UPDATE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
            return;
        }
        assert_eq!(text, want, "docs/metrics.md is stale: VECTORLB_UPDATE_DOCS=1 cargo test -p vectorlb-daemon");
        for r in DropReason::ALL {
            assert!(text.contains(&format!("`{}`", r.name())));
        }
    }
}
