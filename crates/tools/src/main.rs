//! `vectorlb-tools`: the test and benchmark tools (see the crate's documentation).

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use vectorlb_tools::{gen, httpload, memcload, memif, podmemif, probe, tunfwd};

#[derive(Parser)]
#[command(name = "vectorlb-tools", version, about = "vectorlb's test and benchmark tools (not for production hosts)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Test clients and servers for the demo and the end-to-end tests.
    #[command(subcommand)]
    Probe(probe::ProbeCmd),
    /// Traffic generator on DPDK ports: UDP or TCP flows at a rate; loss, reordering, latency.
    Gen(gen::GenArgs),
    /// RFC 2544 throughput per frame size: MAX, NDR (no loss) and PDR, by binary search.
    Rfc2544(gen::Rfc2544Args),
    /// A memif server that forwards every frame back out of its queue (io mode), over
    /// vectorlb's memif queues and a copy engine; prints one JSON line.
    MemifFwd(memif::FwdArgs),
    /// The memif benchmark: vectorlb's memif (cpu and dma engines) and DPDK's net_memif
    /// (testpmd) against the L3 forwarder example, by frame size, MTU and queue pairs.
    BenchMemif(memif::BenchArgs),
    /// An application in a pod on its memif (the memif client library's example): UDP echo,
    /// sender or sink; one JSON line.
    #[command(subcommand)]
    PodMemif(podmemif::PodMemifCmd),
    /// Open-loop HTTP/1.1 load (fixed arrival rate, latency from the intended send time) with a
    /// mix of request types; latency percentiles per type, one JSON line.
    HttpLoad(httpload::HttpLoadArgs),
    /// Open-loop memcached load (fixed arrival rate, pipelined requests, latency from the
    /// intended send time; gets and sets); percentiles to P99.99, one JSON line.
    MemcacheLoad(memcload::MemcacheLoadArgs),
    /// Two tun interfaces and every packet of one written to the other, untouched (a read and a
    /// write each): the ceiling of a data plane on tun interfaces, for `make bench-pods`.
    TunForward(tunfwd::TunForwardArgs),
}

fn main() -> ExitCode {
    let cmd = Cli::parse().cmd;
    // The servers (probe servers, memif-fwd) outlive their peers: a closed peer is an error on
    // its connection (EPIPE), not the end of the process. The rest print and end; piped into
    // `head`, they end quietly on SIGPIPE.
    let server = matches!(cmd, Cmd::Probe(probe::ProbeCmd::ServeUdp { .. } | probe::ProbeCmd::ServeTcp { .. }) | Cmd::MemifFwd(_));
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, if server { libc::SIG_IGN } else { libc::SIG_DFL }) };
    let r = match cmd {
        Cmd::Probe(p) => probe::run(&p),
        Cmd::Gen(a) => gen::run(&a).map(|r| {
            if a.json {
                println!("{r}");
            } else {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            }
        }),
        Cmd::Rfc2544(a) => gen::rfc2544(&a).map(|rs| rs.iter().for_each(|r| println!("{r}"))),
        Cmd::MemifFwd(a) => memif::fwd(&a).map(|r| println!("{r}")),
        Cmd::BenchMemif(a) => memif::bench(&a),
        Cmd::PodMemif(c) => podmemif::run(&c).map(|r| println!("{r}")),
        Cmd::TunForward(a) => tunfwd::run(&a).map(|r| println!("{r}")),
        Cmd::HttpLoad(a) => httpload::run(&a).map_err(vectorlb_tools::ToolError::Usage).map(|r| {
            if a.json {
                println!("{r}");
            } else {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            }
        }),
        Cmd::MemcacheLoad(a) => memcload::run(&a).map_err(vectorlb_tools::ToolError::Usage).map(|r| {
            if a.json {
                println!("{r}");
            } else {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            }
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vectorlb-tools: {e}");
            ExitCode::FAILURE
        }
    }
}
