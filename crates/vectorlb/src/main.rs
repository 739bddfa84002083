//! The `vectorlb` command: thin glue over the crates that do the work. Test and benchmark
//! tools (probes, the traffic generator, RFC 2544) are in `vectorlb-tools`, not here.

mod replay;

/// mimalloc for Rust's allocations: the proxy allocates per connection and per request
/// (tasks, hyper's buffers); with it the TLS handshake benchmark's proxy ran about 5 % more
/// handshakes per core-second than with glibc's allocator, side by side. C libraries
/// (BoringSSL, DPDK) keep their own allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use vectorlb_lb::Mode;
use vectorlb_packet::proto;

#[derive(Parser)]
#[command(name = "vectorlb", version, about = "A high-performance layer-4 load balancer data plane")]
struct Cli {
    /// Log level: error, warn, info, debug, trace, or a filter such as `info,vectorlb_daemon=debug`
    /// (RUST_LOG, when set, wins).
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
    /// Log format: text, or json (one JSON object per line).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run the packets of a pcap through the load balancer offline; write what would leave.
    Replay {
        /// Configuration file (TOML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        /// Input capture (classic pcap, Ethernet).
        #[arg(long = "in")]
        input: PathBuf,
        /// Directory for one pcap per egress port, plus kernel.pcap.
        #[arg(long)]
        out_dir: PathBuf,
        /// Print the summary as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and print what it defines.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// In-memory benchmarks of the pipeline on one core.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Run the load balancer daemon on DPDK ports (SIGTERM stops, SIGHUP reloads).
    Run {
        #[arg(long)]
        config: PathBuf,
    },
    /// The L7 edge proxy: HTTP/1.1, HTTP/2 and gRPC, TLS, routes, upstream clusters balanced
    /// per request. SIGHUP reloads, SIGTERM drains. See docs/proxy.md.
    Proxy {
        #[arg(long)]
        config: PathBuf,
    },
    /// A node's mesh proxy (docs/mesh.md): run inside its own network namespace, a pod
    /// interface of the daemon's pods port; carries meshed pods' TCP in mutual-TLS tunnels.
    Mesh(MeshArgs),
    /// The mesh's certificate authority by hand (without `vectorlb kube`): create one, issue
    /// workload certificates into a node proxy's directory.
    #[command(subcommand)]
    MeshCa(MeshCaCmd),
    /// Control a running daemon (ipvsadm-like; see `vectorlb ctl --help`).
    Ctl(vectorlb::ctl::CtlArgs),
    /// Application queue sets on an Intel E810 port (ADQ): plan (dry run), apply, reset.
    /// See docs/queue-sets.md.
    #[command(subcommand)]
    Adq(AdqCmd),
    /// The Kubernetes controller: Services of type LoadBalancer, EndpointSlices and address
    /// pools program the daemons (docs/kubernetes.md).
    #[command(subcommand)]
    Kube(KubeCmd),
    /// Print the control API's OpenAPI document (what the daemon serves at /openapi.json).
    Openapi,
    /// The decapsulator for TUN-mode backends (an XDP program; docs/scale-out.md): opens the
    /// load balancer's IPv4/IPv6 tunnels on a host without the kernel's tunnel modules.
    #[command(subcommand)]
    Decap(DecapCmd),
}

#[derive(clap::Args)]
struct MeshArgs {
    /// This node's name (as the state file's workloads name theirs).
    #[arg(long)]
    node: String,
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// The meshed pods and the authorization policies (JSON; re-read when it changes).
    #[arg(long)]
    state: PathBuf,
    /// bundle.pem and each identity's <namespace>.<account>.pem and .key (re-read on change).
    #[arg(long)]
    certs: PathBuf,
    #[arg(long, default_value = "0.0.0.0:15001")]
    outbound: std::net::SocketAddr,
    #[arg(long, default_value = "0.0.0.0:15008")]
    inbound: std::net::SocketAddr,
    /// Serve GET /metrics here.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// The pod interface steered connections arrive on: sets up the routing rule and the socket
    /// lookup program in this namespace. Without it nothing is steered here.
    #[arg(long, value_name = "INTERFACE")]
    steer: Option<String>,
    /// Connect to the pods from the proxy's own address instead of their clients'.
    #[arg(long)]
    no_original_source: bool,
    /// Sign handshakes on the cryptomb provider (crypto_mb where the CPU has AVX-512 IFMA,
    /// else inline).
    #[arg(long)]
    cryptomb: bool,
    /// A tunnel per connection, each with a full handshake (for measuring handshakes; the
    /// default shares tunnels between two identities).
    #[arg(long)]
    no_pool: bool,
    /// Threads serving connections (0: one per CPU; 1: everything on one thread).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Subcommand)]
enum MeshCaCmd {
    /// A new authority (ECDSA P-256): DIR/ca.pem and DIR/ca.key (mode 0600).
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
        /// How long the authority's certificate is valid, in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
    },
    /// Certificates for identities (NAMESPACE/ACCOUNT) into a node proxy's directory.
    Issue {
        /// The authority's directory (from `init`).
        #[arg(long)]
        ca: PathBuf,
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
        #[arg(long)]
        out: PathBuf,
        /// NAMESPACE/ACCOUNT, repeatable.
        #[arg(long = "identity", required = true)]
        identities: Vec<String>,
        /// Lifetime in seconds (renew at half of it).
        #[arg(long, default_value_t = 86_400)]
        ttl_s: u64,
        /// More trust anchors for bundle.pem (another authority's ca.pem while keys change).
        #[arg(long)]
        also_trust: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum KubeCmd {
    /// Run the controller (one replica leads, by a Lease; SIGTERM gives the Lease up).
    Run {
        /// The controller's configuration (TOML; docs/kubernetes.md).
        #[arg(long)]
        config: PathBuf,
        /// A kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// This replica's name in the Lease (default: POD_NAME, else host name and pid).
        #[arg(long)]
        identity: Option<String>,
    },
    /// The mesh's authority (signs workload certificates for the nodes that run them) and node
    /// agent (a node proxy's state, certificates and steering), as the configuration's
    /// `[authority]` and `[node]` sections say (docs/mesh.md).
    Mesh {
        /// The configuration (TOML; docs/mesh.md).
        #[arg(long)]
        config: PathBuf,
        /// A kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Print the custom resource definitions (deploy/kubernetes/crds.yaml).
    Crds,
}

#[derive(Subcommand)]
enum DecapCmd {
    /// Attach it to an interface (replacing an older one; refusing another XDP program).
    Attach {
        iface: String,
        /// Open only tunnels from these prefixes (the load balancers' addresses), repeatable;
        /// without any, every tunnel that reaches the interface is opened.
        #[arg(long, value_name = "PREFIX")]
        from: Vec<String>,
        /// driver or generic (default: driver when the driver can, else generic).
        #[arg(long, value_parser = ["driver", "generic"])]
        mode: Option<String>,
    },
    /// Detach it (another XDP program is left alone).
    Detach { iface: String },
    /// Its counters (JSON).
    Stats { iface: String },
}

/// `ADDRESS/LEN`, or an address alone (one host).
fn prefix(s: &str) -> Result<(std::net::IpAddr, u8), CliError> {
    let bad = || CliError::Usage(format!("--from: '{s}' is not a prefix (ADDRESS/LEN or ADDRESS)"));
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a.parse::<std::net::IpAddr>().map_err(|_| bad())?, Some(l.parse::<u8>().map_err(|_| bad())?)),
        None => (s.parse::<std::net::IpAddr>().map_err(|_| bad())?, None),
    };
    let max = if a.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    if len > max {
        return Err(bad());
    }
    Ok((a, len))
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Nat,
    Fnat,
    Dr,
    Tun,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Nat => Mode::Nat,
            ModeArg::Fnat => Mode::Fnat,
            ModeArg::Dr => Mode::Dr,
            ModeArg::Tun => Mode::Tun,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum ProtoArg {
    Tcp,
    Udp,
}

#[derive(Args)]
struct Common {
    /// IP family: 4 or 6.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(4..=6))]
    family: u8,
    /// Seconds of measurement, split into rounds; the median round is reported.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum AdqCmd {
    /// Print the steps the configuration takes (changes nothing).
    Plan {
        #[arg(long)]
        config: PathBuf,
    },
    /// Check the port and the kernel, then run the steps (undone if one fails).
    Apply {
        #[arg(long)]
        config: PathBuf,
    },
    /// Undo a configuration (parts that are not there are skipped).
    Reset {
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Throughput over N established sessions, packets drawn at random.
    Pipeline {
        #[arg(long, value_enum, default_value = "fnat")]
        mode: ModeArg,
        #[arg(long, value_enum, default_value = "udp")]
        proto: ProtoArg,
        #[arg(long, default_value_t = 1_000_000)]
        sessions: u64,
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Worker threads, each with its own table of sessions / threads flows.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Points of the memory-by-sessions curve sampled during the fill (one thread).
        #[arg(long, default_value_t = 10)]
        memory_points: usize,
        /// Distinct frames the timed loop replays (each of a session drawn at random); fewer
        /// than the sessions keeps the touched part of the table in cache.
        #[arg(long, default_value_t = 1 << 20)]
        pool: usize,
        /// NetworkPolicies isolating the backends (one lets the clients in, the others each
        /// another /32 on another port): sessions are decided as they are created.
        #[arg(long, default_value_t = 0)]
        policies: usize,
        /// Flows routed to a backend's address (pod to pod, no service) instead of the VIP.
        #[arg(long)]
        routed: bool,
        #[command(flatten)]
        common: Common,
    },
    /// A SYN flood through the pipeline: spoofed SYNs answered with SYN cookies (`--synproxy
    /// on`) or each opening a session within the half-open budget (`off`); with `--ack`, bare
    /// ACKs at a continuation service (nat, dr, tun), each a continued session.
    Synflood {
        #[arg(long, value_enum, default_value = "fnat")]
        mode: ModeArg,
        #[arg(long, value_parser = ["on", "off"], default_value = "on")]
        synproxy: String,
        #[arg(long)]
        ack: bool,
        #[arg(long, default_value_t = 256)]
        batch: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Session-sync capacity on one core: full-NAT sessions a second sent (export, encode,
    /// seal with AES-256-GCM) and received (open, decode, install).
    Sync {
        #[arg(long, default_value_t = 200_000)]
        sessions: u32,
        #[command(flatten)]
        common: Common,
    },
    /// Connections per second: complete TCP lifecycles through the pipeline.
    Cps {
        #[arg(long, value_enum, default_value = "fnat")]
        mode: ModeArg,
        /// Connections in flight (one packet each per batch).
        #[arg(long, default_value_t = 256)]
        concurrency: usize,
        /// A table of 262,144 sessions filled before measuring: `half` (established
        /// sessions), `closed` (full, of TIME_WAIT sessions, and the connections keep their
        /// TIME_WAIT of 2 s: each new connection evicts the oldest closed one), `established`
        /// (full: each new connection is refused). Default: none (a table just large enough).
        #[arg(long, value_enum, default_value = "none")]
        fill: FillArg,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum FillArg {
    None,
    Half,
    Closed,
    Established,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Daemon(#[from] vectorlb_daemon::DaemonError),
    #[error(transparent)]
    Config(#[from] vectorlb_config::Error),
    #[error(transparent)]
    Ctl(#[from] vectorlb::ctl::CtlError),
    #[error(transparent)]
    Proxy(#[from] vectorlb_proxy::serve::ServeError),
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
    #[error(transparent)]
    Bench(#[from] vectorlb_bench::BenchError),
    #[error(transparent)]
    Adq(#[from] vectorlb::adq::AdqError),
    #[error(transparent)]
    Kube(#[from] vectorlb_kube::KubeError),
    #[error("writing the result: {0}")]
    Json(#[from] serde_json::Error),
    #[error("--log-level: {0}")]
    LogFilter(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Xdp(#[from] vectorlb_dpdk::Error),
    #[error("mesh: {0}")]
    Mesh(std::io::Error),
}

/// Logs to stderr through `tracing`: the level from RUST_LOG or --log-level, text or JSON lines.
fn init_logs(level: &str, format: LogFormat) -> Result<(), CliError> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(f) if !f.is_empty() => EnvFilter::try_new(f),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| CliError::LogFilter(e.to_string()))?;
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match format {
        LogFormat::Text => b.with_ansi(false).init(),
        LogFormat::Json => b.json().with_current_span(false).init(),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Run { .. } | Cmd::Proxy { .. } | Cmd::Mesh(_) | Cmd::Kube(KubeCmd::Run { .. })) {
        // A server: a peer that closes while we write is an error on that connection (EPIPE),
        // never a signal that ends the process (the controller died of one when kube-apiserver
        // restarted while it wrote); and as many descriptors as the host allows.
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        vectorlb_proxy::client::raise_nofile_limit();
    } else {
        // A CLI piped into `head` ends quietly on SIGPIPE.
        // SAFETY: as above.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match init_logs(&cli.log_level, cli.log_format).and_then(|_| run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The last-resort error exit: the one place that writes to stderr directly, so
            // that the message reaches the operator whatever the log settings.
            eprintln!("vectorlb: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print<T: serde::Serialize + std::fmt::Debug>(r: &T, json: bool) -> Result<(), CliError> {
    if json {
        println!("{}", serde_json::to_string(r)?);
    } else {
        println!("{}", serde_json::to_string_pretty(r)?);
    }
    Ok(())
}

fn mesh_ca(c: MeshCaCmd) -> Result<(), String> {
    use vectorlb_proxy::mesh::ca::{Authority, Bundle};
    use vectorlb_proxy::mesh::identity::SpiffeId;
    match c {
        MeshCaCmd::Init { dir, trust_domain, days } => {
            if dir.join("ca.key").exists() {
                return Err(format!("{}/ca.key exists: an authority is there already (remove it to make another)", dir.display()));
            }
            let ca = Authority::generate(&trust_domain, std::time::Duration::from_secs(days.clamp(1, 36_500) * 86_400)).map_err(|e| e.to_string())?;
            ca.save(&dir).map_err(|e| e.to_string())?;
            println!("{}", serde_json::json!({"ca": dir.join("ca.pem"), "trust_domain": trust_domain}));
            Ok(())
        }
        MeshCaCmd::Issue { ca, trust_domain, out, identities, ttl_s, also_trust } => {
            let authority = Authority::open(&trust_domain, &ca).map_err(|e| e.to_string())?;
            let mut roots = vec![authority.certificate().clone()];
            for p in &also_trust {
                let pem = std::fs::read(p).map_err(|e| format!("--also-trust {}: {e}", p.display()))?;
                roots.extend(Bundle::from_pem(&trust_domain, &pem).map_err(|e| format!("--also-trust {}: {e}", p.display()))?.roots().iter().cloned());
            }
            let bundle = Bundle::new(&trust_domain, roots).map_err(|e| e.to_string())?;
            let ids = identities
                .iter()
                .map(|i| match i.split_once('/') {
                    Some((ns, sa)) => SpiffeId::new(&trust_domain, ns, sa).map_err(|e| format!("--identity {i}: {e}")),
                    None => Err(format!("--identity {i}: not NAMESPACE/ACCOUNT")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            authority.issue_to_dir(&ids, &bundle, std::time::Duration::from_secs(ttl_s), &out).map_err(|e| e.to_string())?;
            println!("{}", serde_json::json!({"issued": ids.iter().map(|i| i.to_string()).collect::<Vec<_>>(), "dir": out}));
            Ok(())
        }
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Run { config } => Ok(vectorlb_daemon::run(&config)?),
        Cmd::Proxy { config } => Ok(vectorlb_proxy::run::run(&config)?),
        Cmd::Mesh(a) => {
            use vectorlb_proxy::config::{CryptoMbBackend, CryptoMbFallback, Provider};
            let provider = a.cryptomb.then_some(Provider::CryptoMb {
                poll_delay: std::time::Duration::from_micros(200),
                backend: CryptoMbBackend::CryptoMb,
                fallback: CryptoMbFallback::Inline,
            });
            let opts = vectorlb_proxy::mesh::run::Options {
                node: a.node,
                trust_domain: a.trust_domain,
                state: a.state,
                certs: a.certs,
                outbound: a.outbound,
                inbound: a.inbound,
                metrics: a.metrics,
                steer: a.steer,
                original_source: !a.no_original_source,
                provider,
                no_pool: a.no_pool,
                threads: a.threads,
            };
            vectorlb_proxy::mesh::run::run(opts).map_err(CliError::Mesh)
        }
        Cmd::MeshCa(c) => mesh_ca(c).map_err(|e| CliError::Usage(format!("mesh-ca: {e}"))),
        Cmd::Ctl(a) => Ok(vectorlb::ctl::run(&a)?),
        Cmd::Kube(KubeCmd::Run { config, kubeconfig, identity }) => Ok(vectorlb_kube::run(vectorlb_kube::Opts { config, kubeconfig, identity })?),
        Cmd::Kube(KubeCmd::Mesh { config, kubeconfig }) => Ok(vectorlb_kube::run_mesh(&config, &kubeconfig)?),
        Cmd::Kube(KubeCmd::Crds) => {
            print!("{}", vectorlb_kube::crd::crds_yaml());
            Ok(())
        }
        Cmd::Adq(AdqCmd::Plan { config }) => {
            print!("{}", vectorlb::adq::render(&vectorlb::adq::load(&config)?));
            Ok(())
        }
        Cmd::Adq(AdqCmd::Apply { config }) => {
            let n = vectorlb::adq::apply(&vectorlb::adq::load(&config)?)?;
            println!("adq: {n} steps applied");
            Ok(())
        }
        Cmd::Decap(DecapCmd::Attach { iface, from, mode }) => {
            let nets = from.iter().map(|f| prefix(f)).collect::<Result<Vec<_>, _>>()?;
            let used = vectorlb_dpdk::xdp::decap_attach(&iface, &nets, mode.map(|m| m == "generic"))?;
            println!("decap: attached to {iface} ({used} mode), {}", if nets.is_empty() { "every tunnel source".to_string() } else { format!("tunnels from {}", from.join(", ")) });
            Ok(())
        }
        Cmd::Decap(DecapCmd::Detach { iface }) => {
            let was = vectorlb_dpdk::xdp::decap_detach(&iface)?;
            println!("decap: {}", if was { format!("detached from {iface}") } else { format!("{iface} had no decapsulator") });
            Ok(())
        }
        Cmd::Decap(DecapCmd::Stats { iface }) => {
            let s = vectorlb_dpdk::xdp::decap_stats(iface.as_str())?;
            let m: serde_json::Map<String, serde_json::Value> = s.named().iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
            println!("{}", serde_json::Value::Object(m));
            Ok(())
        }
        Cmd::Adq(AdqCmd::Reset { config }) => {
            vectorlb::adq::undo(&vectorlb::adq::load(&config)?);
            Ok(())
        }
        Cmd::Openapi => {
            print!("{}", vectorlb_api::openapi_json());
            Ok(())
        }
        Cmd::Replay { config, input, out_dir, json } => {
            let s = replay::run(&config, &input, &out_dir)?;
            if json {
                print(&s, true)
            } else {
                println!("packets: {}", s.packets);
                for (port, n) in &s.tx {
                    println!("  tx {port}: {n}");
                }
                println!("  kernel: {}", s.kernel);
                println!("  dropped: {}", s.dropped);
                for (r, n) in &s.drop_reasons {
                    println!("    {r}: {n}");
                }
                println!("sessions: {} created, {} live", s.sessions_created, s.sessions_live);
                println!("packets per backend:");
                for (b, n) in &s.backends {
                    println!("  {b}: {n}");
                }
                println!("icmp: {} echo replies, {} errors sent, {} errors translated", s.icmp_echo_replies, s.icmp_errors_sent, s.icmp_errors_translated);
                for p in &s.outputs {
                    println!("wrote {}", p.display());
                }
                Ok(())
            }
        }
        Cmd::Check { config } => {
            let c = vectorlb_config::Config::load(&config)?;
            // What `run` would refuse, `check` refuses too; a file for `replay` alone (no
            // devices) is fine, and said to be.
            let for_run = c.devices.iter().any(Option::is_some) || c.memif.iter().any(Option::is_some);
            c.check_memory()?;
            if for_run {
                c.check_for_run()?;
            }
            let (need, resident) = c.session_memory();
            println!(
                "{}: ok: {} ports, {} services, {} snat rules, max_sessions {} per worker ({} MiB of session memory at most for {} worker(s), {} MiB at start; budget {} MiB)",
                config.display(),
                c.spec.ports.len(),
                c.spec.services.len(),
                c.spec.snat.len(),
                c.engine.max_sessions,
                need >> 20,
                c.runtime.workers,
                resident >> 20,
                c.memory_budget(vectorlb_config::mem_total()) >> 20
            );
            if !for_run {
                println!("  (no port has a device: fine for `vectorlb replay`; `vectorlb run` needs one on every port)");
            }
            for s in &c.spec.services {
                println!("  {} {}:{} {} {} ({} backends)", if s.proto == proto::TCP { "tcp" } else { "udp" }, s.vip, s.port, s.mode.name(), s.scheduler.name(), s.backends.len());
            }
            Ok(())
        }
        Cmd::Bench(BenchCmd::Pipeline { mode, proto: p, sessions, batch, threads, memory_points, pool, policies, routed, common }) => {
            let o = vectorlb_bench::pipeline::Options {
                mode: mode.into(),
                v6: common.family == 6,
                protocol: match p {
                    ProtoArg::Tcp => proto::TCP,
                    ProtoArg::Udp => proto::UDP,
                },
                sessions,
                seconds: common.seconds,
                rounds: common.rounds,
                batch,
                threads,
                memory_points,
                pool,
                policies,
                routed,
            };
            print(&vectorlb_bench::pipeline::run(&o)?, common.json)
        }
        Cmd::Bench(BenchCmd::Synflood { mode, synproxy, ack, batch, common }) => {
            let o = vectorlb_bench::synflood::Options {
                mode: mode.into(),
                v6: common.family == 6,
                synproxy: synproxy == "on",
                ack,
                seconds: common.seconds,
                rounds: common.rounds,
                batch,
                ..Default::default()
            };
            print(&vectorlb_bench::synflood::run(&o)?, common.json)
        }
        Cmd::Bench(BenchCmd::Sync { sessions, common }) => {
            let o = vectorlb_bench::sync::Options { v6: common.family == 6, sessions, rounds: common.rounds };
            print(&vectorlb_bench::sync::run(&o)?, common.json)
        }
        Cmd::Bench(BenchCmd::Cps { mode, concurrency, fill, common }) => {
            use vectorlb_bench::cps::Fill;
            let fill = match fill {
                FillArg::None => Fill::None,
                FillArg::Half => Fill::Half,
                FillArg::Closed => Fill::Closed,
                FillArg::Established => Fill::Established,
            };
            let o = vectorlb_bench::cps::Options { mode: mode.into(), v6: common.family == 6, seconds: common.seconds, rounds: common.rounds, concurrency, fill };
            print(&vectorlb_bench::cps::run(&o)?, common.json)
        }
    }
}
