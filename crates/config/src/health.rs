//! `[services.health]`: health checks.

use crate::error::{bail, Error};
use crate::file::RawHealth;
use crate::values::ms;
use vectorlb_packet::proto;

/// How a service's backends are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// A TCP connection opens.
    Tcp,
    /// `GET path` answers `expect_status` (over TLS when `tls`; the certificate is not
    /// verified, as with keepalived's SSL_GET: a health check asks "is it serving").
    Http { path: String, host: Option<String>, expect_status: u16, tls: bool },
    /// A datagram `send` gets an answer (containing `expect` when given).
    Udp { send: Vec<u8>, expect: Vec<u8> },
    /// A command exits 0 (`VLB_BACKEND_ADDR`, `VLB_BACKEND_PORT`, `VLB_VIP`, `VLB_VPORT` set).
    Exec { command: String },
}

/// What happens to a failed backend's established sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDown {
    /// They continue until they end (the backend only stops getting new ones).
    Keep,
    /// They end at once: the backend leaves the published configuration, and the next packet
    /// of each of its TCP connections is answered with a reset.
    Reset,
}

/// A service's health check (`[services.health]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    pub kind: CheckKind,
    /// Milliseconds between checks of one backend.
    pub interval: u32,
    /// Milliseconds a check may take.
    pub timeout: u32,
    /// Consecutive successes that bring a down backend up.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
    /// Port to check (0: the backend's port).
    pub port: u16,
    pub on_down: OnDown,
}

/// Checks a health check (`f` names it in errors) for a service of `protocol`.
pub fn health_spec(f: &str, h: &RawHealth, protocol: u8) -> Result<HealthSpec, Error> {
    let only = |what: &str, set: bool, kinds: &str| -> Result<(), Error> {
        if set {
            bail!("{f}.{what}: only for kind {kinds}");
        }
        Ok(())
    };
    let kind = match h.kind.as_str() {
        "tcp" => CheckKind::Tcp,
        "http" | "https" => {
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                bail!("{f}.path: '{path}' must start with / and hold no spaces");
            }
            let expect_status = h.expect_status.unwrap_or(200);
            if !(100..=599).contains(&expect_status) {
                bail!("{f}.expect_status: {expect_status} is not an HTTP status");
            }
            if h.host.as_deref().is_some_and(|x| x.is_empty() || x.contains(char::is_whitespace)) {
                bail!("{f}.host: must be a host name");
            }
            CheckKind::Http { path, host: h.host.clone(), expect_status, tls: h.kind == "https" }
        }
        "udp" => {
            let send = h.send.clone().unwrap_or_default().into_bytes();
            if send.is_empty() {
                bail!("{f}.send: a udp check needs the datagram to send");
            }
            CheckKind::Udp { send, expect: h.expect.clone().unwrap_or_default().into_bytes() }
        }
        "exec" => {
            let command = h.command.clone().unwrap_or_default();
            if command.trim().is_empty() {
                bail!("{f}.command: an exec check needs a command");
            }
            CheckKind::Exec { command }
        }
        k => bail!("{f}.kind: '{k}' is not one of tcp, http, https, udp, exec"),
    };
    only("path", h.path.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("host", h.host.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("expect_status", h.expect_status.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("send", h.send.is_some() && !matches!(kind, CheckKind::Udp { .. }), "udp")?;
    only("expect", h.expect.is_some() && !matches!(kind, CheckKind::Udp { .. }), "udp")?;
    only("command", h.command.is_some() && !matches!(kind, CheckKind::Exec { .. }), "exec")?;
    if matches!(kind, CheckKind::Tcp | CheckKind::Http { .. }) && protocol != proto::TCP && h.port.is_none() {
        bail!("{f}.kind: a {} check of a udp service needs an explicit port", h.kind);
    }
    let interval = ms(&format!("{f}.interval"), h.interval, 2000)?;
    let timeout = ms(&format!("{f}.timeout"), h.timeout, interval.min(1000))?;
    if !(50..=3_600_000).contains(&interval) {
        bail!("{f}.interval: must be in 0.05..=3600 seconds");
    }
    if timeout < 10 || timeout > interval.max(10) {
        bail!("{f}.timeout: must be at least 0.01 s and at most the interval");
    }
    let rise = h.rise.unwrap_or(2);
    let fall = h.fall.unwrap_or(3);
    if !(1..=100).contains(&rise) || !(1..=100).contains(&fall) {
        bail!("{f}.rise/fall: must be in 1..=100");
    }
    let on_down = match h.on_down.as_deref().unwrap_or("keep") {
        "keep" => OnDown::Keep,
        "reset" => OnDown::Reset,
        o => bail!("{f}.on_down: '{o}' is not keep or reset"),
    };
    Ok(HealthSpec { kind, interval, timeout, rise, fall, port: h.port.unwrap_or(0), on_down })
}

/// A checked health check as the file writes it.
pub fn raw_health(h: &HealthSpec) -> RawHealth {
    let mut r = RawHealth {
        kind: String::new(),
        interval: Some(h.interval as f64 / 1000.0),
        timeout: Some(h.timeout as f64 / 1000.0),
        rise: Some(h.rise),
        fall: Some(h.fall),
        port: Some(h.port),
        path: None,
        host: None,
        expect_status: None,
        send: None,
        expect: None,
        command: None,
        on_down: Some(if h.on_down == OnDown::Keep { "keep" } else { "reset" }.into()),
    };
    match &h.kind {
        CheckKind::Tcp => r.kind = "tcp".into(),
        CheckKind::Http { path, host, expect_status, tls } => {
            r.kind = if *tls { "https" } else { "http" }.into();
            r.path = Some(path.clone());
            r.host = host.clone();
            r.expect_status = Some(*expect_status);
        }
        CheckKind::Udp { send, expect } => {
            r.kind = "udp".into();
            r.send = Some(String::from_utf8_lossy(send).into_owned());
            r.expect = (!expect.is_empty()).then(|| String::from_utf8_lossy(expect).into_owned());
        }
        CheckKind::Exec { command } => {
            r.kind = "exec".into();
            r.command = Some(command.clone());
        }
    }
    r
}
