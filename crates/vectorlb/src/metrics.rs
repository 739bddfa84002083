//! Prometheus text exposition (`GET /metrics`).

use crate::daemon::{lock, Shared};
use std::fmt::Write;
use vectorlb_lb::service::{backend_slot, key};
use vectorlb_lb::DropReason;
use vectorlb_packet::proto;

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn render(shared: &Shared) -> String {
    let snap = shared.control.snapshot();
    let t = shared.totals();
    let c = &t.counters;
    let rates = lock(&shared.rates).clone();
    let mut o = String::with_capacity(8192);
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    head(&mut o, "vectorlb_packets_total", "counter", "Packets by direction (rx: received by the pipeline, tx: sent, kernel: ARP/ND and non-LB traffic).");
    let _ = writeln!(o, "vectorlb_packets_total{{dir=\"rx\"}} {}\nvectorlb_packets_total{{dir=\"tx\"}} {}\nvectorlb_packets_total{{dir=\"kernel\"}} {}", c.rx, c.tx, c.kernel);
    head(&mut o, "vectorlb_drops_total", "counter", "Dropped packets by reason.");
    for r in DropReason::ALL {
        let _ = writeln!(o, "vectorlb_drops_total{{reason=\"{}\"}} {}", r.name(), c.dropped(r));
    }
    for (name, v) in [("tx_full", t.io.tx_full), ("multi_segment", t.io.multi_segment)] {
        let _ = writeln!(o, "vectorlb_drops_total{{reason=\"{name}\"}} {v}");
    }
    head(&mut o, "vectorlb_sessions", "gauge", "Live sessions (all workers).");
    let _ = writeln!(o, "vectorlb_sessions {}", t.sessions);
    head(&mut o, "vectorlb_sessions_created_total", "counter", "Sessions created.");
    let _ = writeln!(o, "vectorlb_sessions_created_total {}", c.sessions_created);
    head(&mut o, "vectorlb_icmp_total", "counter", "ICMP handled by the LB.");
    let _ = writeln!(o, "vectorlb_icmp_total{{kind=\"echo_reply\"}} {}\nvectorlb_icmp_total{{kind=\"error_sent\"}} {}\nvectorlb_icmp_total{{kind=\"error_translated\"}} {}", c.icmp_echo_replies, c.icmp_errors_sent, c.icmp_errors_translated);
    head(&mut o, "vectorlb_ha_state", "gauge", "HA state of this node (1 for the current one).");
    for st in [crate::daemon::ha::STANDALONE, crate::daemon::ha::MASTER, crate::daemon::ha::BACKUP] {
        let _ = writeln!(o, "vectorlb_ha_state{{state=\"{}\"}} {}", crate::daemon::ha::name(st), (shared.ha.state() == st) as u8);
    }
    head(&mut o, "vectorlb_ha_transitions_total", "counter", "HA state changes.");
    let _ = writeln!(o, "vectorlb_ha_transitions_total {}", shared.ha.transitions.load(std::sync::atomic::Ordering::Relaxed));
    if let Some(sy) = &shared.sync {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let st = &sy.stats;
        head(&mut o, "vectorlb_sync_records_total", "counter", "Session sync records by direction and outcome.");
        for (k, v) in [
            ("sent", g(&st.records_sent)),
            ("received", g(&st.records_received)),
            ("installed", g(&st.installed)),
            ("rejected_unknown", g(&st.rejected_unknown)),
            ("rejected_stale", g(&st.rejected_stale)),
            ("rejected_port_taken", g(&st.rejected_port)),
            ("rejected_table_full", g(&st.rejected_full)),
            ("bulk_sent", g(&st.bulk_sent)),
            ("bulk_received", g(&st.bulk_received)),
        ] {
            let _ = writeln!(o, "vectorlb_sync_records_total{{kind=\"{k}\"}} {v}");
        }
        head(&mut o, "vectorlb_sync_messages_refused_total", "counter", "Sync messages dropped, by reason.");
        for (k, v) in [("bad_hmac", g(&st.refused_mac)), ("truncated", g(&st.refused_truncated)), ("malformed", g(&st.refused_malformed)), ("replayed", g(&st.refused_replayed))] {
            let _ = writeln!(o, "vectorlb_sync_messages_refused_total{{reason=\"{k}\"}} {v}");
        }
        head(&mut o, "vectorlb_sync_unacked_datagrams", "gauge", "Sync datagrams the standby has not acknowledged (lag).");
        let _ = writeln!(o, "vectorlb_sync_unacked_datagrams {}", g(&st.sent_seq).saturating_sub(g(&st.acked_seq)));
        head(&mut o, "vectorlb_sync_batch_period_seconds", "gauge", "Current batching period (adapts to load and acknowledgements).");
        let _ = writeln!(o, "vectorlb_sync_batch_period_seconds {}", g(&st.period_us) as f64 / 1e6);
    }
    head(&mut o, "vectorlb_config_generation", "gauge", "Generation of the running configuration.");
    let _ = writeln!(o, "vectorlb_config_generation {}", shared.control.generation());

    head(&mut o, "vectorlb_service_packets_total", "counter", "Packets per service (both directions).");
    let mut svc_lines = Vec::new();
    for s in &snap.spec.services {
        let Some(id) = snap.lookup_service(key(s.vip), s.port, s.proto) else { continue };
        let p = if s.proto == proto::UDP { "udp" } else { "tcp" };
        let l = format!("vip=\"{}\",port=\"{}\",proto=\"{p}\"", esc(&s.vip.to_string()), s.port);
        let sc = c.services.get(id as usize).copied().unwrap_or_default();
        svc_lines.push((l, id, sc, s));
    }
    for (l, _, sc, _) in &svc_lines {
        let _ = writeln!(o, "vectorlb_service_packets_total{{{l}}} {}", sc.packets);
    }
    head(&mut o, "vectorlb_service_bytes_total", "counter", "Bytes per service.");
    for (l, _, sc, _) in &svc_lines {
        let _ = writeln!(o, "vectorlb_service_bytes_total{{{l}}} {}", sc.bytes);
    }
    head(&mut o, "vectorlb_service_new_sessions_total", "counter", "Sessions created per service.");
    for (l, _, sc, _) in &svc_lines {
        let _ = writeln!(o, "vectorlb_service_new_sessions_total{{{l}}} {}", sc.new_sessions);
    }
    head(&mut o, "vectorlb_service_new_sessions_per_second", "gauge", "Sessions created per service over the last second.");
    for (l, id, _, _) in &svc_lines {
        let _ = writeln!(o, "vectorlb_service_new_sessions_per_second{{{l}}} {}", rates.get(*id as usize).copied().unwrap_or(0.0));
    }
    let mut be_lines = Vec::new();
    for (l, id, _, s) in &svc_lines {
        for b in &s.backends {
            let Some(x) = snap.backends().find(|x| x.svc == *id && x.addr == b.addr && x.port == b.port) else { continue };
            let slot = backend_slot(x.id) as usize;
            let bl = format!("{l},backend=\"{}\",backend_port=\"{}\"", esc(&b.addr.to_string()), b.port);
            be_lines.push((bl, c.backends.get(slot).copied().unwrap_or_default(), t.active.get(slot).copied().unwrap_or(0), b.weight));
        }
    }
    head(&mut o, "vectorlb_backend_packets_total", "counter", "Packets per backend.");
    for (l, bc, _, _) in &be_lines {
        let _ = writeln!(o, "vectorlb_backend_packets_total{{{l}}} {}", bc.packets);
    }
    head(&mut o, "vectorlb_backend_bytes_total", "counter", "Bytes per backend.");
    for (l, bc, _, _) in &be_lines {
        let _ = writeln!(o, "vectorlb_backend_bytes_total{{{l}}} {}", bc.bytes);
    }
    head(&mut o, "vectorlb_backend_active_sessions", "gauge", "Live sessions per backend.");
    for (l, _, a, _) in &be_lines {
        let _ = writeln!(o, "vectorlb_backend_active_sessions{{{l}}} {a}");
    }
    head(&mut o, "vectorlb_backend_weight", "gauge", "Configured weight (0: draining).");
    for (l, _, _, w) in &be_lines {
        let _ = writeln!(o, "vectorlb_backend_weight{{{l}}} {w}");
    }
    let health = shared.health.all();
    if !health.is_empty() {
        let label = |t: &crate::daemon::health::Target| {
            let p = if t.proto == proto::UDP { "udp" } else { "tcp" };
            format!("vip=\"{}\",port=\"{}\",proto=\"{p}\",backend=\"{}\",backend_port=\"{}\"", esc(&t.vip.to_string()), t.vport, esc(&t.addr.to_string()), t.port)
        };
        head(&mut o, "vectorlb_backend_up", "gauge", "Health check state (1 up, 0 down).");
        for (t, s) in &health {
            let _ = writeln!(o, "vectorlb_backend_up{{{}}} {}", label(t), s.up as u8);
        }
        head(&mut o, "vectorlb_backend_health_checks_total", "counter", "Health checks run, by result.");
        for (t, s) in &health {
            let l = label(t);
            let _ = writeln!(o, "vectorlb_backend_health_checks_total{{{l},result=\"ok\"}} {}\nvectorlb_backend_health_checks_total{{{l},result=\"fail\"}} {}", s.checks - s.failed_checks, s.failed_checks);
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
    head(&mut o, "vectorlb_port_packets_total", "counter", "DPDK port counters.");
    let mut xs = Vec::new();
    for p in &shared.ports {
        let s = p.port.stats();
        let l = format!("port=\"{}\"", esc(&p.name));
        let _ = writeln!(o, "vectorlb_port_packets_total{{{l},dir=\"rx\"}} {}\nvectorlb_port_packets_total{{{l},dir=\"tx\"}} {}", s.ipackets, s.opackets);
        xs.push((l, s, p.port.xstats(), p.port.link()));
    }
    head(&mut o, "vectorlb_port_bytes_total", "counter", "DPDK port byte counters.");
    for (l, s, _, _) in &xs {
        let _ = writeln!(o, "vectorlb_port_bytes_total{{{l},dir=\"rx\"}} {}\nvectorlb_port_bytes_total{{{l},dir=\"tx\"}} {}", s.ibytes, s.obytes);
    }
    head(&mut o, "vectorlb_port_errors_total", "counter", "DPDK port errors and misses.");
    for (l, s, _, _) in &xs {
        let _ = writeln!(
            o,
            "vectorlb_port_errors_total{{{l},kind=\"imissed\"}} {}\nvectorlb_port_errors_total{{{l},kind=\"ierrors\"}} {}\nvectorlb_port_errors_total{{{l},kind=\"oerrors\"}} {}\nvectorlb_port_errors_total{{{l},kind=\"rx_nombuf\"}} {}",
            s.imissed, s.ierrors, s.oerrors, s.rx_nombuf
        );
    }
    head(&mut o, "vectorlb_port_link_up", "gauge", "Link state.");
    for (l, _, _, link) in &xs {
        let _ = writeln!(o, "vectorlb_port_link_up{{{l}}} {}", link.up as u8);
    }
    head(&mut o, "vectorlb_port_xstat", "untyped", "The driver's extended counters.");
    for (l, _, x, _) in &xs {
        for (n, v) in x {
            let _ = writeln!(o, "vectorlb_port_xstat{{{l},name=\"{}\"}} {v}", esc(n));
        }
    }
    o
}
