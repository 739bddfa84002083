//! Announcing VIPs by BGP through BIRD 2 (docs/scale-out.md): the daemon writes BIRD's
//! configuration from `[bgp]` and the prefixes it wants announced, runs BIRD as its child,
//! reconfigures it when the set changes, restarts it when it dies, and reads its sessions'
//! states. BIRD speaks BGP and BFD over the host's kernel sockets (the data plane hands the
//! node's own traffic to the kernel). The VIPs' blackholes never reach the host's routing
//! table; only with `[bgp] import` is a kernel protocol added, which exports the BGP routes it
//! took (the other nodes' pod networks) and nothing else.
//!
//! The prefixes live in static protocols as blackhole routes that only the BGP channels export:
//! IPv4 prefixes to IPv4 neighbours, IPv6 to IPv6 ones. `vips4` and `vips6` hold the primary
//! routes (VIPs, this node's full-NAT local addresses); `backup4` and `backup6` the sync
//! group's other nodes' local addresses, exported with this node's AS prepended
//! [`BACKUP_PREPEND`] more times, so a router prefers the owner's route and falls back to
//! these only when the owner's is gone.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vectorlb_config::BgpSpec;

/// The longest the daemon waits for `birdc`.
pub const BIRDC_DEADLINE: Duration = Duration::from_secs(3);

/// A prefix to announce: an address and its length.
pub type Prefix = (IpAddr, u8);

/// How many extra times a backup route carries this node's AS: a longer path than any owner's
/// route (one AS), so never chosen while that route exists.
pub const BACKUP_PREPEND: usize = 3;

/// What to announce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    pub primary: BTreeSet<Prefix>,
    /// Announced with a longer AS path ([`BACKUP_PREPEND`]).
    pub backup: BTreeSet<Prefix>,
}

impl Routes {
    pub fn is_empty(&self) -> bool {
        self.primary.is_empty() && self.backup.is_empty()
    }
}

/// BIRD's configuration for `spec` announcing `routes`. Every value comes from the checked
/// configuration (addresses, numbers, passwords without quotes or backslashes), so nothing
/// here can inject configuration.
pub fn bird_config(spec: &BgpSpec, routes: &Routes) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "# Written by vectorlb from [bgp]; rewritten on every change. Do not edit.");
    let _ = writeln!(c, "router id {};", spec.router_id);
    let _ = writeln!(c, "log stderr all;");
    let _ = writeln!(c, "protocol device {{ scan time 10; }}");
    if spec.bfd {
        let _ = writeln!(
            c,
            "protocol bfd {{ interface \"*\" {{ min rx interval {i} ms; min tx interval {i} ms; idle tx interval 1000 ms; multiplier {m}; }}; }}",
            i = spec.bfd_interval_ms,
            m = spec.bfd_multiplier
        );
    }
    let communities: String = spec.communities.iter().map(|(a, v)| format!(" bgp_community.add(({a},{v}));")).collect();
    for (name, v4, prefixes) in [("vips4", true, &routes.primary), ("vips6", false, &routes.primary), ("backup4", true, &routes.backup), ("backup6", false, &routes.backup)] {
        let _ = writeln!(c, "protocol static {name} {{");
        let _ = writeln!(c, "  {};", if v4 { "ipv4" } else { "ipv6" });
        for (a, len) in prefixes.iter().filter(|(a, _)| a.is_ipv4() == v4) {
            if communities.is_empty() {
                let _ = writeln!(c, "  route {a}/{len} blackhole;");
            } else {
                let _ = writeln!(c, "  route {a}/{len} blackhole {{{communities} }};");
            }
        }
        let _ = writeln!(c, "}}");
    }
    // What the neighbours announce inside `[bgp] import` goes into the host's routing table
    // (BIRD's kernel protocol exports the BGP routes only: never the static blackholes above).
    for (name, v4) in [("kernel4", true), ("kernel6", false)] {
        if spec.import.iter().any(|(a, _)| a.is_ipv4() == v4) {
            let _ = writeln!(c, "protocol kernel {name} {{ {} {{ import none; export where source = RTS_BGP; }}; }}", if v4 { "ipv4" } else { "ipv6" });
        }
    }
    let prepend: String = (0..BACKUP_PREPEND).map(|_| format!(" bgp_path.prepend({});", spec.asn)).collect();
    for (i, n) in spec.neighbors.iter().enumerate() {
        let (channel, source, backup) = if n.address.is_ipv4() { ("ipv4", "vips4", "backup4") } else { ("ipv6", "vips6", "backup6") };
        let next_hop = match spec.next_hop {
            Some(a) if a.is_ipv4() == n.address.is_ipv4() => format!("next hop address {a}"),
            _ => "next hop self".to_string(),
        };
        let _ = writeln!(c, "protocol bgp peer{i} {{");
        let _ = writeln!(c, "  local as {};", spec.asn);
        let _ = writeln!(c, "  neighbor {} as {};", n.address, n.asn);
        let _ = writeln!(c, "  hold time {};", spec.hold_time);
        if spec.hold_time != 0 {
            let _ = writeln!(c, "  keepalive time {};", (spec.hold_time / 3).max(1));
        }
        // Come back quickly after a failure (BIRD's defaults wait minutes).
        let _ = writeln!(c, "  connect retry time 2;");
        let _ = writeln!(c, "  error wait time 1, 10;");
        if spec.bfd {
            let _ = writeln!(c, "  bfd on;");
        }
        if let Some(p) = &n.password {
            let _ = writeln!(c, "  password \"{p}\";");
        }
        let _ = writeln!(
            c,
            "  {channel} {{ {}; export filter {{ if proto = \"{source}\" then accept; if proto = \"{backup}\" then {{{prepend} accept; }} reject; }}; {next_hop}; }};",
            import_clause(spec, n.address.is_ipv4())
        );
        let _ = writeln!(c, "}}");
    }
    c
}

/// A channel's import: routes of exactly a node's pod network length (`import_length4/6`)
/// inside the `[bgp] import` prefixes of its family, never one of this node's own pod networks
/// (nor anything inside them), at most `import_limit` of them from the neighbour (then its
/// further routes are blocked); next hops on the shared link (the node-to-node mesh). Or
/// nothing.
fn import_clause(spec: &BgpSpec, v4: bool) -> String {
    let block = if v4 { spec.import_length4 } else { spec.import_length6 };
    let nets: Vec<String> = spec.import.iter().filter(|(a, _)| a.is_ipv4() == v4).map(|(a, l)| format!("{a}/{l}{{{block},{block}}}")).collect();
    if nets.is_empty() {
        return "import none".into();
    }
    let own: Vec<String> = spec.own_pods.iter().filter(|(a, _)| a.is_ipv4() == v4).map(|(a, l)| format!("{a}/{l}+")).collect();
    let not_own = if own.is_empty() { String::new() } else { format!(" && !(net ~ [ {} ])", own.join(", ")) };
    format!("import where net ~ [ {} ]{not_own}; import limit {} action block; gateway direct", nets.join(", "), spec.import_limit)
}

/// One BGP session as BIRD reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub neighbor: IpAddr,
    /// BIRD's protocol state (`up`, `start`, `down`, ...).
    pub state: String,
    /// The BGP state (`Established`, `Active`, `Connect`, ...), with BIRD's last error if any.
    pub info: String,
}

impl Session {
    pub fn established(&self) -> bool {
        self.state == "up" && self.info.starts_with("Established")
    }
}

/// Parses `birdc show protocols`: the BGP protocols `peerN` in order.
pub fn parse_protocols(text: &str, spec: &BgpSpec) -> Vec<Session> {
    let mut out: Vec<Session> = spec.neighbors.iter().map(|n| Session { neighbor: n.address, state: "unknown".into(), info: String::new() }).collect();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Name Proto Table State Since(1 or 2 words) Info...
        if cols.len() < 5 || cols[1] != "BGP" {
            continue;
        }
        let Some(i) = cols[0].strip_prefix("peer").and_then(|n| n.parse::<usize>().ok()) else { continue };
        let Some(s) = out.get_mut(i) else { continue };
        s.state = cols[3].to_string();
        // "Since" is a time, or a date and a time; the rest is the information.
        let rest = if cols.len() > 5 && cols[5].contains(':') && cols[4].contains('-') { &cols[6..] } else { &cols[5..] };
        s.info = rest.join(" ");
    }
    out
}

/// BIRD, run and supervised by the daemon.
pub struct Bird {
    spec: BgpSpec,
    dir: PathBuf,
    child: Option<Child>,
    announced: Routes,
    /// Times BIRD was started again after it died (or could not be started).
    pub restarts: u64,
    /// Why the last start or reconfiguration failed, if it did.
    pub error: Option<String>,
    next_start: Instant,
}

impl Bird {
    /// Starts BIRD with nothing announced; its files (configuration, control socket, log) in
    /// `dir`, created mode 0700.
    pub fn start(spec: &BgpSpec, dir: &Path) -> io::Result<Bird> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut b = Bird { spec: spec.clone(), dir: dir.to_path_buf(), child: None, announced: Routes::default(), restarts: 0, error: None, next_start: Instant::now() };
        b.write_config()?;
        b.spawn()?;
        Ok(b)
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("bird.conf")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("bird.ctl")
    }

    /// BIRD's configuration (it holds the neighbours' passwords: 0600).
    fn write_config(&self) -> io::Result<()> {
        vectorlb_http::files::write_atomic(&self.conf(), bird_config(&self.spec, &self.announced).as_bytes(), vectorlb_http::files::Mode::Always(0o600))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("bird.log"))?;
        let _ = std::fs::remove_file(self.socket());
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut cmd = Command::new(&self.spec.bird);
        cmd.arg("-f").arg("-c").arg(self.conf()).arg("-s").arg(self.socket()).arg("-P").arg(self.dir.join("bird.pid")).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        // BIRD must not outlive the daemon: a BIRD left behind by a killed daemon would go on
        // announcing VIPs that nothing serves. The kernel kills it when the thread that
        // started it ends (the daemon's main or BGP thread, which live as long as it does).
        // SAFETY: between fork and exec the closure only calls prctl and getppid, which are
        // async-signal-safe, and allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent died between fork and prctl: nothing would kill us later.
                if libc::getppid() != parent {
                    return Err(io::Error::other("the daemon exited while starting bird"));
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", self.spec.bird)))?;
        self.child = Some(child);
        // Its control socket appears once it has read the configuration.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.socket().exists() {
            if let Some(st) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                let tail = std::fs::read_to_string(self.dir.join("bird.log")).unwrap_or_default();
                let last = tail.lines().last().unwrap_or("").to_string();
                return Err(io::Error::other(format!("bird exited ({st}): {last}")));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("bird did not open its control socket within 5 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Runs `birdc` with `args` on this BIRD's socket; its output. A BIRD that does not answer
    /// within [`BIRDC_DEADLINE`] is an error (birdc killed), never a wait without end.
    fn birdc(&self, args: &[&str]) -> io::Result<String> {
        let what = || format!("birdc {}", args.join(" "));
        let mut c = Command::new(&self.spec.birdc).arg("-s").arg(self.socket()).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let deadline = Instant::now() + BIRDC_DEADLINE;
        while c.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{}: no answer within {BIRDC_DEADLINE:?}", what())));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // (birdc's replies are a few KB: they fit the pipes, so it never blocked writing them.)
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(io::Error::other(format!("{}: {}{}", what(), text.trim(), String::from_utf8_lossy(&out.stderr).trim())));
        }
        Ok(text)
    }

    /// Announces exactly `routes` (withdrawing the rest): BIRD reconfigures without touching
    /// its sessions. Nothing happens when the set is unchanged.
    pub fn announce(&mut self, routes: &Routes) -> io::Result<()> {
        if *routes == self.announced {
            return Ok(());
        }
        let previous = std::mem::replace(&mut self.announced, routes.clone());
        let r = self.write_config().and_then(|()| {
            if self.child.is_none() {
                // Read at the next start.
                return Ok(());
            }
            let out = self.birdc(&["configure"])?;
            if !out.contains("Reconfigured") && !out.contains("Reconfiguration in progress") {
                return Err(io::Error::other(format!("bird refused its configuration: {}", out.trim())));
            }
            Ok(())
        });
        if r.is_err() {
            // Not announced: the next call tries again.
            self.announced = previous;
        }
        r
    }

    /// Whether BIRD runs now (as of the last [`Bird::supervise`]).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn announced(&self) -> &Routes {
        &self.announced
    }

    /// Whether BIRD runs; starts it again (at most once a second) when it died.
    pub fn supervise(&mut self) -> bool {
        if let Some(c) = self.child.as_mut() {
            match c.try_wait() {
                Ok(None) => return true,
                Ok(Some(st)) => self.error = Some(format!("bird exited: {st}")),
                Err(e) => self.error = Some(format!("bird: {e}")),
            }
            self.child = None;
        }
        if Instant::now() < self.next_start {
            return false;
        }
        self.next_start = Instant::now() + Duration::from_secs(1);
        self.restarts += 1;
        match self.spawn() {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e.to_string());
                false
            }
        }
    }

    /// The BGP sessions (in `[bgp] neighbors` order), as BIRD reports them; all `unknown`
    /// when it cannot be asked.
    pub fn sessions(&self) -> Vec<Session> {
        let text = if self.child.is_some() { self.birdc(&["show", "protocols"]).unwrap_or_default() } else { String::new() };
        parse_protocols(&text, &self.spec)
    }

    /// Withdraws everything, gives the routers `grace` to hear it, and stops BIRD.
    pub fn stop(mut self, grace: Duration) {
        if self.child.is_some() && !self.announced.is_empty() && self.announce(&Routes::default()).is_ok() {
            std::thread::sleep(grace);
        }
        if let Some(mut c) = self.child.take() {
            let _ = self.birdc(&["down"]);
            let deadline = Instant::now() + Duration::from_secs(2);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectorlb_config::BgpNeighbor;

    fn spec() -> BgpSpec {
        let mut s = BgpSpec::new(
            65001,
            "10.0.0.1".parse().unwrap(),
            vec![
                BgpNeighbor { address: "10.0.0.254".parse().unwrap(), asn: 65000, password: Some("s3cret".into()) },
                BgpNeighbor { address: "2001:db8::fe".parse().unwrap(), asn: 65000, password: None },
            ],
        );
        s.communities = vec![(65001, 100)];
        s
    }

    #[test]
    fn writes_what_bird_needs() {
        let p = Routes { primary: [("10.0.0.100".parse().unwrap(), 32), ("2001:db8::100".parse().unwrap(), 128)].into(), backup: [("10.200.0.2".parse().unwrap(), 32)].into() };
        let c = bird_config(&spec(), &p);
        for want in [
            "router id 10.0.0.1;",
            "protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; idle tx interval 1000 ms; multiplier 3; }; }",
            "  route 10.0.0.100/32 blackhole { bgp_community.add((65001,100)); };",
            "  route 2001:db8::100/128 blackhole { bgp_community.add((65001,100)); };",
            "  neighbor 10.0.0.254 as 65000;",
            "  password \"s3cret\";",
            "  route 10.200.0.2/32 blackhole { bgp_community.add((65001,100)); };",
            "  ipv4 { import none; export filter { if proto = \"vips4\" then accept; if proto = \"backup4\" then { bgp_path.prepend(65001); bgp_path.prepend(65001); bgp_path.prepend(65001); accept; } reject; }; next hop self; };",
            "  ipv6 { import none; export filter { if proto = \"vips6\" then accept; if proto = \"backup6\" then { bgp_path.prepend(65001); bgp_path.prepend(65001); bgp_path.prepend(65001); accept; } reject; }; next hop self; };",
            "  hold time 9;",
            "  keepalive time 3;",
            "  bfd on;",
        ] {
            assert!(c.lines().any(|l| l == want), "missing {want:?} in\n{c}");
        }
        assert_eq!(c.matches("protocol bgp").count(), 2);
        // Each family's routes in its own static protocol only.
        let v4 = &c[c.find("protocol static vips4").unwrap()..c.find("protocol static vips6").unwrap()];
        assert!(v4.contains("10.0.0.100/32") && !v4.contains("2001:db8::100") && !v4.contains("10.200.0.2"));
        let b4 = &c[c.find("protocol static backup4").unwrap()..c.find("protocol static backup6").unwrap()];
        assert!(b4.contains("10.200.0.2/32") && !b4.contains("10.0.0.100"));
        let mut s = spec();
        s.bfd = false;
        s.communities.clear();
        s.next_hop = Some("10.0.0.9".parse().unwrap());
        let c = bird_config(&s, &Routes::default());
        assert!(!c.contains("bfd"), "{c}");
        assert!(c.contains("reject; }; next hop address 10.0.0.9; };"), "{c}");
        assert!(c.contains("\"vips6\" then accept;") && c.contains("reject; }; next hop self; };"), "the other family keeps self: {c}");
        assert!(!c.contains("protocol kernel") && c.matches("import none;").count() == 2, "nothing is taken without [bgp] import: {c}");
        s.import = vec![("10.244.0.0".parse().unwrap(), 16)];
        (s.import_length4, s.import_limit) = (24, 256);
        s.own_pods = vec![("10.244.1.0".parse().unwrap(), 24), ("fd00:244:1::".parse().unwrap(), 64)];
        let c = bird_config(&s, &Routes::default());
        // Exactly the nodes' /24s inside, never this node's own, 256 at most per neighbour.
        assert!(
            c.contains("  ipv4 { import where net ~ [ 10.244.0.0/16{24,24} ] && !(net ~ [ 10.244.1.0/24+ ]); import limit 256 action block; gateway direct; export filter"),
            "{c}"
        );
        assert!(c.contains("  ipv6 { import none; export filter"), "{c}");
        assert!(c.contains("protocol kernel kernel4 { ipv4 { import none; export where source = RTS_BGP; }; }") && !c.contains("kernel6"), "{c}");
    }

    /// Compares `got` with `crates/daemon/tests/golden/NAME` (`VECTORLB_UPDATE_GOLDEN=1`
    /// writes it instead), and has BIRD itself parse it (`bird -p`).
    fn golden(name: &str, got: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
        if std::env::var_os("VECTORLB_UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (VECTORLB_UPDATE_GOLDEN=1 writes it)", path.display()));
        if let Some((i, (w, g))) = want.lines().zip(got.lines()).enumerate().find(|(_, (w, g))| w != g) {
            panic!("{name} differs from the golden file at line {}:\n  golden: {w}\n  now:    {g}\n(if the change is meant, VECTORLB_UPDATE_GOLDEN=1 writes it)", i + 1);
        }
        assert_eq!(want.lines().count(), got.lines().count(), "{name}: the golden file and the output differ in length");
        // BIRD's own parser: the file is what BIRD takes, not only what we expect.
        let bird = ["/usr/sbin/bird", "/usr/bin/bird"].into_iter().find(|b| std::path::Path::new(b).exists()).expect("bird (scripts/setup.sh installs bird2)");
        let tmp = std::env::temp_dir().join(format!("vectorlb-golden-{}-{name}", std::process::id()));
        std::fs::write(&tmp, got).unwrap();
        let o = std::process::Command::new(bird).arg("-p").arg("-c").arg(&tmp).output().unwrap();
        let _ = std::fs::remove_file(&tmp);
        assert!(o.status.success(), "bird -p refuses {name}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }

    #[test]
    fn the_bird_configuration_is_the_golden_one_for_every_option() {
        let routes = Routes {
            primary: [("10.0.0.100".parse().unwrap(), 32), ("10.0.0.101".parse().unwrap(), 32), ("2001:db8::100".parse().unwrap(), 128)].into(),
            backup: [("10.200.0.2".parse().unwrap(), 32), ("2001:db8:200::2".parse().unwrap(), 128)].into(),
        };
        // Every option on: BFD, communities, a password, both families, backup routes.
        golden("bird-full.conf", &bird_config(&spec(), &routes));
        // Every option off: no BFD, no community, a fixed next hop, nothing announced.
        let mut s = spec();
        s.bfd = false;
        s.communities.clear();
        s.next_hop = Some("10.0.0.9".parse().unwrap());
        s.neighbors.truncate(1);
        s.neighbors[0].password = None;
        golden("bird-minimal.conf", &bird_config(&s, &Routes::default()));
        // Importing the other nodes' pod routes (both families), this node's own left out.
        let mut s = spec();
        s.hold_time = 30;
        s.bfd_interval_ms = 300;
        s.bfd_multiplier = 5;
        s.communities.push((65001, 200));
        s.import = vec![("10.244.0.0".parse().unwrap(), 16), ("fd00:244::".parse().unwrap(), 48)];
        (s.import_length4, s.import_length6, s.import_limit) = (24, 64, 256);
        s.own_pods = vec![("10.244.1.0".parse().unwrap(), 24), ("fd00:244:0:1::".parse().unwrap(), 64)];
        golden("bird-import.conf", &bird_config(&s, &routes));
    }

    #[test]
    fn a_bird_that_does_not_answer_is_given_up_on() {
        // A BIRD that hangs: its birdc never returns. The daemon's call ends at the deadline.
        let dir = std::env::temp_dir().join(format!("vectorlb-bird-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hang = dir.join("birdc");
        std::fs::write(&hang, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut s = spec();
        s.birdc = hang.display().to_string();
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let b = Bird { spec: s, dir: dir.clone(), child: Some(child), announced: Routes::default(), restarts: 0, error: None, next_start: Instant::now() };
        let t = Instant::now();
        assert!(b.sessions().iter().all(|s| s.state == "unknown"));
        let e = b.birdc(&["show", "protocols"]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() < 2 * BIRDC_DEADLINE + Duration::from_secs(1), "{:?}", t.elapsed());
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_sessions_from_birdc() {
        let text = "BIRD 2.0.12 ready.\nName       Proto      Table      State  Since         Info\ndevice1    Device     ---        up     03:10:00.123  \nvips4      Static     master4    up     03:10:00.123  \npeer0      BGP        ---        up     03:10:01.456  Established   \npeer1      BGP        ---        start  2026-11-27 03:10:00  Active        Socket: Connection refused\n";
        let s = parse_protocols(text, &spec());
        assert_eq!(s[0], Session { neighbor: "10.0.0.254".parse().unwrap(), state: "up".into(), info: "Established".into() });
        assert!(s[0].established());
        assert_eq!((s[1].state.as_str(), s[1].info.as_str()), ("start", "Active Socket: Connection refused"));
        assert!(!s[1].established());
        assert!(parse_protocols("", &spec()).iter().all(|s| s.state == "unknown"));
    }
}
