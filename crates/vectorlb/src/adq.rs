//! The NIC side of application queue sets on Intel E810 ports (ADQ, seed 002): what Intel's
//! `adqsetup` configures, from a TOML file, as a list of steps. `vectorlb adq plan` prints
//! them (a dry run, the default); `vectorlb adq apply` checks that the port and the kernel
//! can take them, then runs them in order and undoes them if one fails; `vectorlb adq reset`
//! undoes a configuration.
//!
//! The steps, in the order the hardware needs them: busy-poll sysctls; the port's TC offload,
//! n-tuple filters and inline flow director; one traffic class per queue set (`mqprio` in
//! channel mode, TC0 for everything else); `clsact`; the independent pollers' devlink
//! parameters; a `flower` filter per (address, port) steering the set's traffic to its TC in
//! hardware (`skip_sw hw_tc`), and optionally one marking its egress with the TC's priority
//! (`skbedit`); per-queue interrupt coalescing of the sets' queues; NAPI threads for pollers;
//! interrupt affinity (one CPU per queue, or per poller); symmetric XPS (transmit queue i for
//! receive queue i). See docs/queue-sets.md.

use serde::Deserialize;
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The most queue sets (traffic classes besides TC0) an E810 port takes.
pub const MAX_SETS: usize = 15;
/// The most queues (channels) of a port.
pub const MAX_QUEUES: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum AdqError {
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("adq apply refused: {0}")]
    Refused(String),
    #[error("adq apply: step {step} failed ({cmd}): {why}; the steps before it were undone")]
    Step { step: usize, cmd: String, why: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdqConfig {
    pub nic: Nic,
    #[serde(default)]
    pub queue_sets: Vec<QueueSet>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// The network interface (an E810 port, driver `ice`).
    pub dev: String,
    /// Its PCI address, for devlink (`0000:3b:00.0`); needed when a set has pollers.
    #[serde(default)]
    pub pci: Option<String>,
    /// Queues of TC0, the traffic of no set.
    #[serde(default = "default_queues")]
    pub default_queues: u32,
    /// `net.core.busy_poll` / `busy_read` in microseconds (left alone when absent; forced to 0
    /// when a set has independent pollers, which replace them).
    #[serde(default)]
    pub busy_poll: Option<u32>,
    #[serde(default)]
    pub busy_read: Option<u32>,
    /// Mark each set's egress with its TC's priority (`skbedit`).
    #[serde(default)]
    pub egress_priority: bool,
    /// Interrupt coalescing of the sets' queues (left alone when absent).
    #[serde(default)]
    pub rx_usecs: Option<u32>,
    #[serde(default)]
    pub tx_usecs: Option<u32>,
    /// Symmetric queues: transmit queue i serves receive queue i (XPS by receive queue).
    #[serde(default = "yes")]
    pub symmetric: bool,
}

fn default_queues() -> u32 {
    2
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSet {
    pub name: String,
    /// `tcp` or `udp`.
    #[serde(default = "tcp")]
    pub protocol: String,
    /// Local addresses of the application (any address when empty).
    #[serde(default)]
    pub addrs: Vec<IpAddr>,
    /// Local ports of the application.
    pub ports: Vec<u16>,
    /// Queues of the set's traffic class.
    pub queues: u32,
    /// Independent pollers serving the queues (0: interrupts).
    #[serde(default)]
    pub pollers: u32,
    /// Microseconds a poller keeps polling an idle queue.
    #[serde(default = "poller_timeout")]
    pub poller_timeout: u32,
    /// CPUs for the queues' interrupts (or the pollers' threads): one per queue (per poller);
    /// left as they are when empty.
    #[serde(default)]
    pub cpus: Vec<u32>,
}

fn tcp() -> String {
    "tcp".into()
}

fn poller_timeout() -> u32 {
    10_000
}

/// One change to the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A program and its arguments (run without a shell).
    Run(Vec<String>),
    /// A value written to a file (sysctl, sysfs, procfs).
    Write { path: String, value: String },
    /// The interrupt of queue `queue` of the port (found in /proc/interrupts at apply time)
    /// goes to `cpu`.
    IrqAffinity { queue: u32, cpu: u32 },
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Run(argv) => write!(f, "{}", argv.join(" ")),
            Step::Write { path, value } => write!(f, "echo {value} > {path}"),
            Step::IrqAffinity { queue, cpu } => {
                write!(f, "echo {cpu} > /proc/irq/<irq of TxRx queue {queue}>/smp_affinity_list")
            }
        }
    }
}

fn run(args: &[&str]) -> Step {
    Step::Run(args.iter().map(|s| s.to_string()).collect())
}

fn fail(path: &Path, msg: impl Into<String>) -> AdqError {
    AdqError::Config { path: path.to_path_buf(), msg: msg.into() }
}

/// Reads and checks a configuration; every error names its field.
pub fn load(path: &Path) -> Result<AdqConfig, AdqError> {
    let text = std::fs::read_to_string(path).map_err(|e| fail(path, format!("cannot read: {e}")))?;
    let cfg: AdqConfig = toml::from_str(&text).map_err(|e| fail(path, e.to_string()))?;
    validate(&cfg).map_err(|m| fail(path, m))?;
    Ok(cfg)
}

fn validate(c: &AdqConfig) -> Result<(), String> {
    let n = &c.nic;
    if n.dev.is_empty() || n.dev.len() > 15 || n.dev.contains(['/', ' ']) {
        return Err(format!("nic.dev: {:?} is not an interface name", n.dev));
    }
    if n.default_queues == 0 {
        return Err("nic.default_queues: at least 1 (TC0 carries everything else)".into());
    }
    if c.queue_sets.is_empty() {
        return Err("queue_sets: none defined".into());
    }
    if c.queue_sets.len() > MAX_SETS {
        return Err(format!("queue_sets: {} sets, an E810 port takes at most {MAX_SETS}", c.queue_sets.len()));
    }
    let mut names = HashSet::new();
    let mut total = n.default_queues;
    for (i, s) in c.queue_sets.iter().enumerate() {
        let at = format!("queue_sets[{i}] ({})", s.name);
        if s.name.is_empty() || !names.insert(s.name.as_str()) {
            return Err(format!("queue_sets[{i}].name: empty or repeated"));
        }
        if s.protocol != "tcp" && s.protocol != "udp" {
            return Err(format!("{at}.protocol: {:?}, expected \"tcp\" or \"udp\"", s.protocol));
        }
        if s.ports.is_empty() || s.ports.contains(&0) {
            return Err(format!("{at}.ports: at least one, none 0"));
        }
        if s.queues == 0 {
            return Err(format!("{at}.queues: at least 1"));
        }
        if s.pollers > s.queues {
            return Err(format!("{at}.pollers: {} pollers for {} queues", s.pollers, s.queues));
        }
        if s.pollers > 0 && n.pci.is_none() {
            return Err(format!("{at}.pollers: nic.pci (the devlink handle) is needed for pollers"));
        }
        let want = if s.pollers > 0 { s.pollers } else { s.queues };
        if !s.cpus.is_empty() && s.cpus.len() != want as usize {
            return Err(format!("{at}.cpus: {} CPUs for {want} {}", s.cpus.len(), if s.pollers > 0 { "pollers" } else { "queues" }));
        }
        total = total.saturating_add(s.queues);
    }
    if total > MAX_QUEUES {
        return Err(format!("queue_sets: {total} queues in all, a port has at most {MAX_QUEUES}"));
    }
    Ok(())
}

/// The steps that configure `c`, in order.
pub fn plan(c: &AdqConfig) -> Vec<(String, Vec<Step>)> {
    let n = &c.nic;
    let dev = n.dev.as_str();
    let pollers = c.queue_sets.iter().any(|s| s.pollers > 0);
    let mut out = Vec::new();

    let mut g = Vec::new();
    let sysctl = |name: &str, v: u32| Step::Write { path: format!("/proc/sys/net/core/{name}"), value: v.to_string() };
    if pollers {
        g.push(sysctl("busy_poll", 0));
        g.push(sysctl("busy_read", 0));
    } else {
        g.extend(n.busy_poll.map(|v| sysctl("busy_poll", v)));
        g.extend(n.busy_read.map(|v| sysctl("busy_read", v)));
    }
    g.push(run(&["ethtool", "--features", dev, "hw-tc-offload", "on"]));
    g.push(run(&["ethtool", "--features", dev, "rx-ntuple-filter", "on"]));
    g.push(run(&["ethtool", "--set-priv-flags", dev, "channel-inline-flow-director", "on"]));
    let title = if pollers { "global settings (busy_poll and busy_read off: the sets' pollers replace them)" } else { "global settings" };
    out.push((title.to_string(), g));

    // TC0 then one class per set, each with its queue count at the running offset.
    let k = c.queue_sets.len() + 1;
    let mut mqprio: Vec<String> = ["tc", "qdisc", "add", "dev", dev, "root", "mqprio", "num_tc"].map(String::from).into();
    mqprio.push(k.to_string());
    mqprio.push("map".into());
    mqprio.extend((0..k).map(|i| i.to_string()));
    mqprio.push("queues".into());
    let mut off = 0;
    for q in std::iter::once(n.default_queues).chain(c.queue_sets.iter().map(|s| s.queues)) {
        mqprio.push(format!("{q}@{off}"));
        off += q;
    }
    mqprio.extend(["hw", "1", "mode", "channel"].map(String::from));
    let mut tcs = vec![Step::Run(mqprio)];
    tcs.push(run(&["tc", "qdisc", "add", "dev", dev, "clsact"]));
    out.push(("traffic classes: TC0 for other traffic, then one per queue set".to_string(), tcs));

    if let Some(pci) = n.pci.as_deref().filter(|_| pollers) {
        let mut p = Vec::new();
        for (i, s) in c.queue_sets.iter().enumerate().filter(|(_, s)| s.pollers > 0) {
            let tc = i + 1;
            let per = s.queues.div_ceil(s.pollers).to_string();
            let handle = format!("pci/{pci}");
            p.push(run(&["devlink", "dev", "param", "set", &handle, "name", &format!("tc{tc}_qps_per_poller"), "value", &per, "cmode", "runtime"]));
            let to = s.poller_timeout.to_string();
            p.push(run(&["devlink", "dev", "param", "set", &handle, "name", &format!("tc{tc}_poller_timeout"), "value", &to, "cmode", "runtime"]));
        }
        out.push(("independent pollers".to_string(), p));
    }

    let mut f = Vec::new();
    for (i, s) in c.queue_sets.iter().enumerate() {
        let (tc, prio) = ((i + 1).to_string(), (i + 1).to_string());
        let addrs: Vec<Option<IpAddr>> = if s.addrs.is_empty() { vec![None] } else { s.addrs.iter().copied().map(Some).collect() };
        for a in &addrs {
            for port in &s.ports {
                let port = port.to_string();
                // tc keeps one protocol per filter priority: IPv6 filters of set i take
                // priority i + 1 + MAX_SETS.
                let v6 = a.is_some_and(|a| a.is_ipv6());
                let family = if v6 { "ipv6" } else { "ip" };
                let prio = if v6 { (i + 1 + MAX_SETS).to_string() } else { prio.clone() };
                let host = a.map(|a| if a.is_ipv6() { format!("{a}/128") } else { format!("{a}/32") });
                // The same match on the local side: destination on ingress, source on egress.
                let filter = |hook: &str, ip: &str, port_key: &str, action: &[&str]| {
                    let mut argv = vec!["tc", "filter", "add", "dev", dev, hook, "prio", &prio, "protocol", family, "flower", "ip_proto", &s.protocol];
                    if let Some(h) = &host {
                        argv.extend([ip, h.as_str()]);
                    }
                    argv.extend([port_key, &port]);
                    argv.extend(action);
                    run(&argv)
                };
                f.push(filter("ingress", "dst_ip", "dst_port", &["skip_sw", "hw_tc", &tc]));
                if n.egress_priority {
                    // The skb priority is the set's TC, whatever filter priority the family took.
                    f.push(filter("egress", "src_ip", "src_port", &["action", "skbedit", "priority", &tc]));
                }
            }
        }
    }
    out.push(("filters: each set's traffic to its TC in hardware".to_string(), f));

    if n.rx_usecs.is_some() || n.tx_usecs.is_some() {
        // The sets' queues: from TC0's count to the end (at most 256 bits: a hex mask).
        let total: u32 = n.default_queues + c.queue_sets.iter().map(|s| s.queues).sum::<u32>();
        let mask = queue_mask(n.default_queues, total);
        let mut argv = vec!["ethtool".to_string(), "--per-queue".into(), dev.into(), "queue_mask".into(), mask, "--coalesce".into()];
        if let Some(v) = n.rx_usecs {
            argv.extend(["adaptive-rx".into(), "off".into(), "rx-usecs".into(), v.to_string()]);
        }
        if let Some(v) = n.tx_usecs {
            argv.extend(["adaptive-tx".into(), "off".into(), "tx-usecs".into(), v.to_string()]);
        }
        out.push(("interrupt coalescing of the sets' queues".to_string(), vec![Step::Run(argv)]));
    }

    let mut a = Vec::new();
    if pollers {
        a.push(Step::Write { path: format!("/sys/class/net/{dev}/threaded"), value: "1".into() });
    }
    let mut first = n.default_queues;
    for s in &c.queue_sets {
        for (k, cpu) in s.cpus.iter().enumerate() {
            // With pollers, the first queue of each poller's share carries its interrupt.
            let q = if s.pollers > 0 { first + k as u32 * s.queues.div_ceil(s.pollers) } else { first + k as u32 };
            a.push(Step::IrqAffinity { queue: q, cpu: *cpu });
        }
        first += s.queues;
    }
    if n.symmetric {
        for q in 0..first {
            a.push(Step::Write { path: format!("/sys/class/net/{dev}/queues/tx-{q}/xps_rxqs"), value: sysfs_mask(q) });
            a.push(Step::Write { path: format!("/sys/class/net/{dev}/queues/tx-{q}/xps_cpus"), value: "0".into() });
        }
    }
    out.push(("threads, interrupts and transmit queues".to_string(), a));
    out
}

/// The steps that undo a configuration (errors ignored when applied: parts may be absent).
pub fn reset(c: &AdqConfig) -> Vec<Step> {
    let dev = c.nic.dev.as_str();
    let mut v = vec![Step::Write { path: format!("/sys/class/net/{dev}/threaded"), value: "0".into() }, run(&["tc", "filter", "del", "dev", dev, "ingress"])];
    if c.nic.egress_priority {
        v.push(run(&["tc", "filter", "del", "dev", dev, "egress"]));
    }
    v.push(run(&["tc", "qdisc", "del", "dev", dev, "clsact"]));
    v.push(run(&["tc", "qdisc", "del", "dev", dev, "root", "mqprio"]));
    v.push(run(&["ethtool", "--features", dev, "rx-ntuple-filter", "off"]));
    v
}

/// The kernel's bitmap format with only bit `bit` set (what sysfs queue masks take):
/// hexadecimal 32-bit words, most significant first, separated by commas.
fn sysfs_mask(bit: u32) -> String {
    let mut words = vec!["00000000".to_string(); bit as usize / 32 + 1];
    words[0] = format!("{:x}", 1u32 << (bit % 32));
    words.join(",")
}

/// `ethtool`'s queue mask with bits [lo, hi) set: one hexadecimal number.
fn queue_mask(lo: u32, hi: u32) -> String {
    let mut words = vec![0u64; (hi as usize).div_ceil(64).max(1)];
    for b in lo..hi {
        words[b as usize / 64] |= 1 << (b % 64);
    }
    let mut s = String::new();
    for (i, w) in words.iter().enumerate().rev() {
        if s.is_empty() {
            if *w != 0 || i == 0 {
                s = format!("{w:x}");
            }
        } else {
            s.push_str(&format!("{w:016x}"));
        }
    }
    format!("0x{s}")
}

/// The plan as text: numbered sections, one step per line.
pub fn render(c: &AdqConfig) -> String {
    let k = c.queue_sets.len();
    let mut s = format!("# ADQ for {} ({k} queue set{}); dry run: nothing was changed\n", c.nic.dev, if k == 1 { "" } else { "s" });
    for (i, (title, steps)) in plan(c).iter().enumerate() {
        s.push_str(&format!("# {}. {title}\n", i + 1));
        for st in steps {
            s.push_str(&format!("{st}\n"));
        }
    }
    s.push_str("# to undo: vectorlb adq reset\n");
    s
}

/// Why `dev` cannot take the plan on this host, if it cannot: the port must exist and be
/// driven by `ice`, and the kernel must have mqprio, flower and (for egress priority) skbedit.
pub fn preflight(c: &AdqConfig, sys: &Path) -> Result<(), AdqError> {
    let dev = &c.nic.dev;
    let netdev = sys.join("class/net").join(dev);
    if !netdev.exists() {
        return Err(AdqError::Refused(format!("no network interface {dev}")));
    }
    let driver = std::fs::read_link(netdev.join("device/driver")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    match driver.as_deref() {
        Some("ice") => {}
        Some(d) => return Err(AdqError::Refused(format!("{dev} is driven by {d}, not ice: ADQ needs an Intel E810 port"))),
        None => return Err(AdqError::Refused(format!("{dev} has no device driver (a virtual interface): ADQ needs an Intel E810 port"))),
    }
    let mut need = vec![("CONFIG_NET_SCH_MQPRIO", "mqprio"), ("CONFIG_NET_CLS_FLOWER", "flower")];
    if c.nic.egress_priority {
        need.push(("CONFIG_NET_ACT_SKBEDIT", "skbedit"));
    }
    if let Some(kconfig) = kernel_config() {
        let missing: Vec<&str> = need.iter().filter(|(opt, _)| !kconfig.lines().any(|l| l == format!("{opt}=y") || l == format!("{opt}=m"))).map(|(_, name)| *name).collect();
        if !missing.is_empty() {
            return Err(AdqError::Refused(format!("this kernel lacks {} (traffic-class offload cannot be set up)", missing.join(", "))));
        }
    }
    Ok(())
}

/// The running kernel's build configuration, where the host publishes it.
fn kernel_config() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
}

/// Runs the plan after [`preflight`]; a failing step undoes what ran before it.
pub fn apply(c: &AdqConfig) -> Result<usize, AdqError> {
    preflight(c, Path::new("/sys"))?;
    let steps: Vec<Step> = plan(c).into_iter().flat_map(|(_, s)| s).collect();
    for (i, st) in steps.iter().enumerate() {
        if let Err(why) = execute(&c.nic.dev, st) {
            for undo in reset(c) {
                let _ = execute(&c.nic.dev, &undo);
            }
            return Err(AdqError::Step { step: i + 1, cmd: st.to_string(), why });
        }
    }
    Ok(steps.len())
}

/// Undoes a configuration; parts that are not there are skipped.
pub fn undo(c: &AdqConfig) {
    for st in reset(c) {
        let _ = execute(&c.nic.dev, &st);
    }
}

fn execute(dev: &str, st: &Step) -> Result<(), String> {
    match st {
        Step::Run(argv) => {
            let out = std::process::Command::new(&argv[0]).args(&argv[1..]).output().map_err(|e| format!("{}: {e}", argv[0]))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        }
        Step::Write { path, value } => std::fs::write(path, value).map_err(|e| e.to_string()),
        Step::IrqAffinity { queue, cpu } => {
            let irq = irq_of(dev, *queue).ok_or_else(|| format!("no interrupt for {dev} queue {queue} in /proc/interrupts"))?;
            std::fs::write(format!("/proc/irq/{irq}/smp_affinity_list"), cpu.to_string()).map_err(|e| e.to_string())
        }
    }
}

/// The interrupt number of an ice port's queue (`ice-<dev>-TxRx-<queue>` in /proc/interrupts).
fn irq_of(dev: &str, queue: u32) -> Option<u32> {
    let name = format!("ice-{dev}-TxRx-{queue}");
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    text.lines().find(|l| l.split_whitespace().last() == Some(name.as_str()))?.split(':').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<AdqConfig, String> {
        let c: AdqConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        validate(&c)?;
        Ok(c)
    }

    #[test]
    fn masks() {
        assert_eq!(queue_mask(2, 6), "0x3c");
        assert_eq!(queue_mask(0, 1), "0x1");
        assert_eq!(queue_mask(64, 65), "0x10000000000000000");
        assert_eq!(queue_mask(3, 3), "0x0");
        assert_eq!(sysfs_mask(0), "1");
        assert_eq!(sysfs_mask(5), "20");
        assert_eq!(sysfs_mask(33), "2,00000000");
    }

    #[test]
    fn bad_configs_name_their_field() {
        let base = "[nic]\ndev = \"eth0\"\n";
        let cases = [
            ("", "queue_sets: none"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 0\n", "queue_sets[0] (a).queues"),
            ("[[queue_sets]]\nname = \"a\"\nports = []\nqueues = 1\n", "queue_sets[0] (a).ports"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 2\npollers = 3\n", "queue_sets[0] (a).pollers"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 2\npollers = 1\n", "nic.pci"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 2\ncpus = [1]\n", "queue_sets[0] (a).cpus"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 2\nprotocol = \"sctp\"\n", "queue_sets[0] (a).protocol"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 300\n", "at most 256"),
            ("[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 1\nbogus = 1\n", "unknown field `bogus`"),
        ];
        for (extra, want) in cases {
            let e = cfg(&format!("{base}{extra}")).unwrap_err();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        let dup = format!("{base}[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 1\n[[queue_sets]]\nname = \"a\"\nports = [2]\nqueues = 1\n");
        assert!(cfg(&dup).unwrap_err().contains("queue_sets[1].name"));
    }

    #[test]
    fn refuses_where_there_is_no_e810() {
        let c = cfg("[nic]\ndev = \"lo\"\n[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 1\n").unwrap();
        let e = preflight(&c, Path::new("/sys")).unwrap_err().to_string();
        assert!(e.contains("lo has no device driver"), "{e}");
        let c = cfg("[nic]\ndev = \"nosuchdev0\"\n[[queue_sets]]\nname = \"a\"\nports = [1]\nqueues = 1\n").unwrap();
        let e = preflight(&c, Path::new("/sys")).unwrap_err().to_string();
        assert!(e.contains("no network interface nosuchdev0"), "{e}");
    }
}
