//! Golden packet fixtures, in the manner of Katran's tester: a table of cases
//! (`golden/fixtures.json`), each a topology variant and a sequence of steps (frame in,
//! expected verdict, expected frame out) whose frames live in `golden/pcap/<case>.pcap`.
//!
//! The expected frames are made by `golden/gen.py` with scapy, an oracle that shares no code
//! with the pipeline (in particular not its checksum routines). See `golden/README.md`.

mod common;

use common::*;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use vectorlb_lb::*;
use vectorlb_packet::proto;

/// Fewer cases than this means the table was truncated or not read: fail rather than pass on
/// nothing.
const MIN_CASES: usize = 50;
const MIN_STEPS: usize = 80;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    generator: String,
    scapy_version: String,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    description: String,
    setup: Setup,
    /// Relative to the golden directory.
    pcap: String,
    steps: Vec<Step>,
    #[serde(default)]
    after: After,
    /// Set when the case shows a pipeline bug not fixed yet: what is wrong. Such a case must
    /// fail (its failure is printed); once it passes, the mark must go.
    #[serde(default)]
    known_bug: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Setup {
    /// nat, fnat, dr, tun; none: no service (SNAT-only cases).
    mode: Option<String>,
    family: u8,
    proto: String,
    port: u16,
    /// (backend index as in `common::Fam::backend`, port, weight).
    backends: Vec<(u8, u16, u32)>,
    toa: bool,
    /// VLAN tag of the backends' port ("int").
    int_vlan: Option<u16>,
    int_mtu: u16,
    /// Source NAT for the backends' network through the SNAT address of the family.
    snat: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    note: String,
    /// Record index in the case's pcap.
    input: usize,
    /// `tx:<port>`, `drop:<DropReason::name()>` or `kernel`.
    verdict: String,
    /// Record index of the expected frame; present exactly for `tx` verdicts.
    output: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct After {
    /// Sessions in the table after the last step.
    sessions: Option<usize>,
    /// Counter values after the last step: an event counter (`Counters::events`) by name, or
    /// `drop:<reason>`.
    #[serde(default)]
    counters: BTreeMap<String, u64>,
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn load() -> Table {
    let path = golden_dir().join("fixtures.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn frames(case: &Case) -> Vec<Vec<u8>> {
    let path = golden_dir().join(&case.pcap);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {}: {e}", case.name, path.display()));
    vectorlb_pcap::Reader::new(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{}: {}: {e}", case.name, path.display()))
        .map(|r| r.unwrap_or_else(|e| panic!("{}: {}: {e}", case.name, path.display())).data)
        .collect()
}

fn parse_verdict(s: &str) -> Result<Verdict, String> {
    if s == "kernel" {
        return Ok(Verdict::Kernel);
    }
    if let Some(p) = s.strip_prefix("tx:") {
        return p.parse().map(Verdict::Tx).map_err(|_| format!("bad port in verdict {s:?}"));
    }
    if let Some(r) = s.strip_prefix("drop:") {
        return drop_reason(r).map(Verdict::Drop).ok_or_else(|| format!("unknown drop reason in verdict {s:?}"));
    }
    Err(format!("unknown verdict {s:?}"))
}

fn drop_reason(name: &str) -> Option<DropReason> {
    DropReason::ALL.iter().copied().find(|r| r.name() == name)
}

fn verdict_name(v: Verdict) -> String {
    match v {
        Verdict::Tx(p) => format!("tx:{p}"),
        Verdict::Drop(r) => format!("drop:{}", r.name()),
        Verdict::Kernel => "kernel".into(),
        other => format!("{other:?}"),
    }
}

fn protocol(name: &str) -> u8 {
    match name {
        "tcp" => proto::TCP,
        "udp" => proto::UDP,
        _ => panic!("unknown protocol {name:?}"),
    }
}

fn spec_for(s: &Setup) -> LbSpec {
    assert!(s.family == 4 || s.family == 6, "family {}", s.family);
    let f = Fam { v6: s.family == 6 };
    let mut spec = topology();
    spec.ports[1].vlan = s.int_vlan;
    spec.ports[1].mtu = s.int_mtu;
    if let Some(m) = &s.mode {
        let mode = Mode::parse(m).unwrap_or_else(|| panic!("unknown mode {m:?}"));
        let mut svc = service(&f, mode, protocol(&s.proto), s.port, &s.backends);
        svc.toa = s.toa;
        spec.services.push(svc);
    }
    if s.snat {
        let (net, len, addr) = if f.v6 { ("2001:db8:1::", 64, "2001:db8::200") } else { ("10.1.0.0", 24, "10.0.0.200") };
        spec.snat.push(SnatSpec { source: ip(net), prefix_len: len, addrs: vec![ip(addr)], timeouts: Timeouts::default(), except: Vec::new(), outbound_only: false });
    }
    spec
}

fn counter(c: &Counters, name: &str) -> u64 {
    if let Some(r) = name.strip_prefix("drop:") {
        return c.dropped(drop_reason(r).unwrap_or_else(|| panic!("unknown drop reason {r:?}")));
    }
    c.events.iter().find(|(n, _, _)| *n == name).map(|(_, _, v)| v).unwrap_or_else(|| panic!("unknown counter {name:?}"))
}

/// Both frames in rows of 16 bytes, differing bytes marked, with the first difference named.
fn hex_diff(got: &[u8], expected: &[u8]) -> String {
    let mut out = String::new();
    let first = got.iter().zip(expected).position(|(a, b)| a != b).unwrap_or(got.len().min(expected.len()));
    out += &format!("  lengths: got {}, expected {}; first difference at byte {first} ({})\n", got.len(), expected.len(), where_is(expected, first));
    let rows = got.len().max(expected.len()).div_ceil(16);
    for row in 0..rows {
        let at = row * 16;
        let line = |b: &[u8], other: &[u8]| -> String {
            (at..at + 16)
                .map(|i| match b.get(i) {
                    Some(x) if other.get(i) == Some(x) => format!(" {x:02x}"),
                    Some(x) => format!("*{x:02x}"),
                    None => "   ".into(),
                })
                .collect()
        };
        let (g, e) = (line(got, expected), line(expected, got));
        if g == e {
            out += &format!("  {at:04x}       {g}\n");
        } else {
            out += &format!("  {at:04x} got  {g}\n  {at:04x} want {e}\n");
        }
    }
    out
}

/// A rough name for a byte offset of an untagged or single-tagged frame.
fn where_is(f: &[u8], at: usize) -> String {
    if f.len() < 14 {
        return "frame".into();
    }
    let (et, l3) = if f[12..14] == [0x81, 0x00] && f.len() >= 18 { ([f[16], f[17]], 18) } else { ([f[12], f[13]], 14) };
    if at < l3 {
        return "Ethernet header".into();
    }
    let off = at - l3;
    match et {
        [0x08, 0x00] if f.len() > l3 => {
            let hl = ((f[l3] & 0x0f) as usize) * 4;
            let names = [
                (0, "version/IHL"),
                (1, "TOS"),
                (2, "total length"),
                (4, "ident"),
                (6, "flags/fragment"),
                (8, "TTL"),
                (9, "protocol"),
                (10, "header checksum"),
                (12, "source"),
                (16, "destination"),
            ];
            if off < hl {
                let n = names.iter().rev().find(|(o, _)| off >= *o).map(|x| x.1).unwrap_or("?");
                return format!("IPv4 {}", if off >= 20 { "options" } else { n });
            }
            format!("IPv4 payload byte {} (protocol {})", off - hl, f[l3 + 9])
        }
        [0x86, 0xdd] => {
            let names = [(0, "version/class/flow"), (4, "payload length"), (6, "next header"), (7, "hop limit"), (8, "source"), (24, "destination")];
            if off < 40 {
                let n = names.iter().rev().find(|(o, _)| off >= *o).map(|x| x.1).unwrap_or("?");
                return format!("IPv6 {n}");
            }
            format!("IPv6 payload byte {}", off - 40)
        }
        _ => format!("byte {off} after the Ethernet header"),
    }
}

/// Runs one case; returns its failures.
fn run_case(case: &Case, steps_run: &mut usize) -> Vec<String> {
    let mut fails = Vec::new();
    let frames = frames(case);
    let mut lb = Lb::new(spec_for(&case.setup));
    for (k, step) in case.steps.iter().enumerate() {
        let what = format!("case {} step {k} ({})", case.name, step.note);
        let want = match parse_verdict(&step.verdict) {
            Ok(v) => v,
            Err(e) => {
                fails.push(format!("{what}: {e}"));
                continue;
            }
        };
        let input = &frames[step.input];
        let (got, out) = lb.run(input);
        *steps_run += 1;
        if got != want {
            fails.push(format!("{what}: verdict {} expected {}\n  input: {}", verdict_name(got), step.verdict, hex(input)));
            continue;
        }
        if let Some(o) = step.output {
            let expected = &frames[o];
            if &out != expected {
                fails.push(format!("{what}: output differs\n{}", hex_diff(&out, expected)));
            }
        }
    }
    if let Some(n) = case.after.sessions {
        let len = lb.worker.flows.table.len() as usize;
        if len != n {
            fails.push(format!("case {}: {len} sessions after the last step, expected {n}", case.name));
        }
    }
    for (name, want) in &case.after.counters {
        let got = counter(&lb.worker.flows.counters, name);
        if got != *want {
            fails.push(format!("case {}: counter {name} is {got}, expected {want}", case.name));
        }
    }
    fails
}

#[test]
fn golden_cases() {
    let table = load();
    assert!(table.cases.len() >= MIN_CASES, "only {} cases in the table (at least {MIN_CASES} expected)", table.cases.len());
    let total: usize = table.cases.iter().map(|c| c.steps.len()).sum();
    assert!(total >= MIN_STEPS, "only {total} steps in the table (at least {MIN_STEPS} expected)");
    let mut steps_run = 0;
    let mut failures = Vec::new();
    let mut known = Vec::new();
    for case in &table.cases {
        let f = run_case(case, &mut steps_run);
        match (&case.known_bug, f.is_empty()) {
            (None, true) => {}
            (None, false) => failures.push(format!("--- {}: {}\n{}", case.name, case.description, f.join("\n"))),
            (Some(bug), false) => known.push(format!("--- {} (known bug: {bug})\n{}", case.name, f.join("\n"))),
            (Some(_), true) => failures.push(format!("--- {}: passes but is marked as a known bug: the bug is fixed, remove `known_bug` from the case in gen.py", case.name)),
        }
    }
    assert_eq!(steps_run, total, "every step of every case ran");
    eprintln!(
        "golden: {} cases, {steps_run} steps, {} known pipeline bugs (expected frames by {} with scapy {})",
        table.cases.len(),
        known.len(),
        table.generator,
        table.scapy_version
    );
    for k in &known {
        eprintln!("{k}\n");
    }
    if !failures.is_empty() {
        panic!("{} of {} golden cases failed:\n{}", failures.len(), table.cases.len(), failures.join("\n\n"));
    }
}

/// Deleting the cases of a mode, family or protocol must fail: each combination needs a case
/// that forwards a client's packet to a backend, frame for frame.
#[test]
fn golden_table_covers_every_mode_family_protocol() {
    let table = load();
    let mut missing = Vec::new();
    for mode in ["nat", "fnat", "dr", "tun"] {
        for family in [4u8, 6] {
            for p in ["tcp", "udp"] {
                let covered = table.cases.iter().any(|c| {
                    c.setup.mode.as_deref() == Some(mode) && c.setup.family == family && c.setup.proto == p && c.steps.iter().any(|s| s.verdict == "tx:1" && s.output.is_some())
                });
                if !covered {
                    missing.push(format!("{mode}/ipv{family}/{p}"));
                }
            }
        }
    }
    // And the replies of the modes that see them.
    for mode in ["nat", "fnat"] {
        for family in [4u8, 6] {
            for p in ["tcp", "udp"] {
                let covered = table.cases.iter().any(|c| {
                    c.setup.mode.as_deref() == Some(mode) && c.setup.family == family && c.setup.proto == p && c.steps.iter().any(|s| s.verdict == "tx:0" && s.output.is_some())
                });
                if !covered {
                    missing.push(format!("{mode}/ipv{family}/{p} reply"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "no golden case for: {}", missing.join(", "));
}

/// The table is consistent: unique names, frames that exist, outputs exactly for `tx`, known
/// verdicts and counters, and every frame of a pcap used by its case.
#[test]
fn golden_table_is_well_formed() {
    let table = load();
    assert!(table.cases.len() >= MIN_CASES);
    let mut names = BTreeSet::new();
    let mut drop_names = BTreeSet::new();
    for c in &table.cases {
        assert!(names.insert(c.name.as_str()), "duplicate case name {}", c.name);
        assert!(!c.description.is_empty(), "{}: no description", c.name);
        assert!(!c.steps.is_empty(), "{}: no steps", c.name);
        let frames = frames(c);
        let mut used = vec![false; frames.len()];
        for (k, s) in c.steps.iter().enumerate() {
            let v = parse_verdict(&s.verdict).unwrap_or_else(|e| panic!("{} step {k}: {e}", c.name));
            if let Verdict::Drop(r) = v {
                drop_names.insert(r.name());
            }
            assert_eq!(s.output.is_some(), matches!(v, Verdict::Tx(_)), "{} step {k}: an output exactly for tx", c.name);
            for i in std::iter::once(s.input).chain(s.output) {
                assert!(i < frames.len(), "{} step {k}: frame {i} of {}", c.name, frames.len());
                used[i] = true;
            }
        }
        assert!(used.iter().all(|u| *u), "{}: the pcap has frames no step uses", c.name);
        for name in c.after.counters.keys() {
            counter(&Counters::default(), name);
        }
        // The setup builds.
        Control::new(&spec_for(&c.setup)).unwrap_or_else(|e| panic!("{}: {e:?}", c.name));
    }
    // The malformed-input drops the table must keep.
    for r in ["truncated", "malformed", "bad_checksum", "fragment", "unsupported_protocol", "no_session", "mtu_exceeded"] {
        assert!(drop_names.contains(r), "no golden case drops for {r}");
    }
}
