//! Decodes `pipeline` fuzz inputs and replays them with the target's harness and checks,
//! printing each frame and its verdict (a failing check panics with the target's message):
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example pipeline_show -- fuzz/artifacts/pipeline/crash-*
//!
//! With `--summary DIR`, replays every input in DIR (a corpus) and prints the summed worker
//! counters instead: which verdicts, drop reasons and slow paths the corpus reaches.

use vectorlb_fuzz::pipeline::{run, Case};
use vectorlb_lb::PacketBuf;
use vectorlb_packet::parse_frame;

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn summary(dir: &str) {
    let mut total = vectorlb_lb::Counters::default();
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
        let data = std::fs::read(e.expect("dir entry").path()).expect("read input");
        total.add(&run(&Case::decode(&data)).worker.counters);
        n += 1;
    }
    println!("{n} inputs: rx {} tx {} kernel {} sessions_created {}", total.rx, total.tx, total.kernel, total.sessions_created);
    println!(
        "icmp: echo_replies {} errors_sent {} errors_translated {}; toa: inserted {} skipped {}",
        total.icmp_echo_replies, total.icmp_errors_sent, total.icmp_errors_translated, total.toa_inserted, total.toa_skipped
    );
    for r in vectorlb_lb::DropReason::ALL {
        println!("  drop {:22} {}", r.name(), total.dropped(r));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--summary") {
        for d in &args[1..] {
            summary(d);
        }
        return;
    }
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let case = Case::decode(&data);
        println!("{path}: flags {:#04x} now0 {} dt {} split {} ({} frames)", case.flags, case.now0, case.dt, case.split, case.frames.len());
        for (i, f) in case.frames.iter().enumerate() {
            println!("  in  {i:2} {:4} bytes {:?}\n         {}", f.len(), parse_frame(f).map(|p| (p.family, p.proto, p.frag)), hex(f));
        }
        let out = run(&case);
        for (i, (v, b)) in out.verdicts.iter().zip(&out.bufs).enumerate() {
            match v {
                vectorlb_lb::Verdict::Tx(_) => println!("  out {i:2} {v:?} {}", hex(b.data())),
                _ => println!("  out {i:2} {v:?}"),
            }
        }
        println!("  counters: {:?}", out.worker.counters);
    }
}
