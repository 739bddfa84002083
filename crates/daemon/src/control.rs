//! The control thread: signals, neighbour learning and resolution, per-service rates. It never
//! touches packets; it publishes configurations and asks workers to send the frames it builds.

use crate::workers::Event;
use crate::Daemon;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use vectorlb_lb::neigh;

/// Set from signal handlers (only atomic stores there: async-signal-safe).
pub static SIG_STOP: AtomicBool = AtomicBool::new(false);
pub static SIG_RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGHUP {
        SIG_RELOAD.store(true, Ordering::SeqCst);
    } else {
        SIG_STOP.store(true, Ordering::SeqCst);
    }
}

/// SIGTERM and SIGINT stop, SIGHUP reloads, SIGPIPE is ignored.
pub fn install_signals() {
    // SAFETY: the handler only stores to atomics, which is async-signal-safe; the handler
    // function lives for the whole process.
    unsafe {
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// The frame that asks for `ip`'s MAC on `port` (ARP or a neighbour solicitation).
/// Resolves `ip` on an IP-mode memif port at once (its peer is every next hop there, and there
/// is no ARP to ask with); true when that changed the neighbours.
fn resolve_ip_link(d: &Daemon, ip: IpAddr, port: u16) -> Option<bool> {
    let mac = d.config.with(|c| crate::memif_ports::ip_peer_mac(c, port as usize))?;
    Some(d.neighbours.learn(ip, mac, port))
}

fn request(d: &Daemon, ip: IpAddr, port: u16) -> Option<Vec<u8>> {
    let snap = d.config.control.snapshot();
    match ip {
        IpAddr::V4(a) => neigh::arp_request(&snap, port, a),
        IpAddr::V6(a) => neigh::solicit(&snap, port, a),
    }
}

/// Runs until a stop signal or `stop`.
pub fn run(d: &Daemon, events: Receiver<Event>, stop: &AtomicBool) {
    let timeout = Duration::from_secs(d.config.with(|c| c.runtime.neighbor_timeout) as u64);
    let mut last_resolve = Instant::now() - Duration::from_secs(3600);
    let mut last_rate = Instant::now() - crate::rates::STEP;
    let mut asked: BTreeMap<IpAddr, Instant> = BTreeMap::new();
    loop {
        if SIG_STOP.load(Ordering::SeqCst) || stop.load(Ordering::SeqCst) {
            return;
        }
        if SIG_RELOAD.swap(false, Ordering::SeqCst) {
            match d.config.reload() {
                Ok(g) => tracing::info!("SIGHUP: reloaded {} (generation {g})", d.config.path().display()),
                Err(e) => tracing::error!("SIGHUP: reload failed, running configuration kept: {e}"),
            }
        }
        match events.recv_timeout(Duration::from_millis(20)) {
            Ok(first) => {
                // Take every pending event, publish once, then send the held answers.
                let mut dirty = false;
                let mut replies = Vec::new();
                let mut ev = Some(first);
                while let Some(e) = ev.take() {
                    match e {
                        Event::Learned { ip, mac, port, reply } => {
                            dirty |= d.neighbours.learn(ip, mac, port);
                            asked.remove(&ip);
                            replies.extend(reply.map(|r| (port, r)));
                        }
                        Event::Update { ip, mac, port } => dirty |= d.neighbours.update(ip, mac, port),
                        Event::HealthChanged => dirty = true,
                        Event::Resolve { ip, port } => {
                            // At most one request per address per second.
                            let now = Instant::now();
                            if let Some(changed) = resolve_ip_link(d, ip, port) {
                                dirty |= changed;
                            } else if asked.get(&ip).is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
                                if let Some(f) = request(d, ip, port) {
                                    replies.push((port, f));
                                    asked.insert(ip, now);
                                }
                            }
                        }
                    }
                    ev = events.try_recv().ok();
                }
                if dirty {
                    d.config.republish();
                }
                for (port, r) in replies {
                    d.workers.send(port, r);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Resolve next hops: unknown ones every second, known ones when a third of their
        // lifetime has passed (a reply refreshes them); forget the silent ones.
        if last_resolve.elapsed() >= Duration::from_secs(1) {
            last_resolve = Instant::now();
            d.config.refresh_host();
            if d.neighbours.expire(timeout) {
                d.config.republish();
            }
            let hops = neigh::next_hops(&d.config.control.snapshot());
            let statics: Vec<IpAddr> = d.config.with(|c| c.spec.neighbors.iter().map(|(a, _)| *a).collect());
            let now = Instant::now();
            for (ip, port) in hops {
                if statics.contains(&ip) {
                    continue;
                }
                let due = match d.neighbours.age(&ip) {
                    None => true,
                    Some(a) => a > timeout / 3 && asked.get(&ip).is_none_or(|t| now.duration_since(*t) > Duration::from_secs(5)),
                };
                if !due {
                    continue;
                }
                if let Some(changed) = resolve_ip_link(d, ip, port) {
                    if changed {
                        d.config.republish();
                    }
                    continue;
                }
                if let Some(f) = request(d, ip, port) {
                    d.workers.send(port, f);
                    asked.insert(ip, now);
                }
            }
        }
        if last_rate.elapsed() >= crate::rates::STEP {
            last_rate = Instant::now();
            d.rates.record(crate::rates::sample(d));
        }
    }
}
