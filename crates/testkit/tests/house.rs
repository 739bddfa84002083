//! The house rules that keep the tree walkable, checked so they cannot drift:
//! - `docs/architecture.md`'s crate table names exactly the workspace crates each crate uses
//!   (as `cargo metadata` sees them), listed leaves first;
//! - no import circle spans more than one file inside a crate, except the ones listed in
//!   `ALLOWED_CIRCLES` with the reason they must stay.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Workspace crate (short name, without `vectorlb-`) → the workspace crates it depends on
/// (normal and build dependencies; dev-dependencies are the tests' business).
fn metadata() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo).args(["metadata", "--no-deps", "--format-version", "1", "--offline"]).current_dir(root()).output().expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let short = |n: &str| n.strip_prefix("vectorlb-").unwrap_or(n).to_string();
    let members: BTreeSet<String> = v["packages"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    let mut graph = BTreeMap::new();
    for p in v["packages"].as_array().unwrap() {
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .map(|d| d["name"].as_str().unwrap())
            .filter(|n| members.contains(*n))
            .map(short)
            .collect();
        graph.insert(short(p["name"].as_str().unwrap()), deps);
    }
    graph
}

/// The crate table of docs/architecture.md: (crate, the workspace crates its last column names),
/// in the table's order. The column may name outside libraries too and explain in parentheses.
fn documented(names: &BTreeSet<String>) -> Vec<(String, BTreeSet<String>)> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut rows = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `vectorlb-x` | role | depends on |
        if cells.len() < 5 || !cells[1].starts_with("`vectorlb") {
            continue;
        }
        let name = cells[1].trim_matches('`');
        let name = name.strip_prefix("vectorlb-").unwrap_or(if name == "vectorlb" { name } else { "" });
        let last = cells[cells.len() - 2];
        let mut depth = 0;
        let mut plain = String::new();
        for c in last.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let deps = plain.split(',').map(|w| w.trim().trim_matches('`').to_string()).filter(|w| names.contains(w)).collect();
        rows.push((name.to_string(), deps));
    }
    rows
}

#[test]
fn architecture_table_matches_cargo_metadata() {
    let graph = metadata();
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    let rows = documented(&names);
    assert!(rows.len() >= 10, "docs/architecture.md: the crate table was not found ({} rows)", rows.len());
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, deps) in &rows {
        let Some(real) = graph.get(name) else {
            problems.push(format!("the table lists `{name}`, which is not a workspace crate"));
            continue;
        };
        if deps != real {
            let missing: Vec<_> = real.difference(deps).collect();
            let extra: Vec<_> = deps.difference(real).collect();
            problems.push(format!("`{name}`: the table leaves out {missing:?} and names {extra:?} it does not use"));
        }
        let later: Vec<_> = real.iter().filter(|d| !seen.contains(*d)).collect();
        if !later.is_empty() {
            problems.push(format!("`{name}` is listed before {later:?}, which it uses (the table goes from the leaves up)"));
        }
        seen.insert(name.clone());
    }
    for name in names.difference(&seen) {
        problems.push(format!("workspace crate `{name}` is missing from the table"));
    }
    assert!(problems.is_empty(), "docs/architecture.md's crate table against cargo metadata:\n  {}", problems.join("\n  "));
}

/// Import circles that span files and stay, with the reason. Each must still exist (so a
/// circle that was cut cannot come back unnoticed behind a stale entry).
const ALLOWED_CIRCLES: &[(&str, &[&str], &str)] = &[];

/// Removes comments and `#[cfg(test)]` items (a test module may use anything).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<i32> = None;
    let mut depth = 0i32;
    let mut pending_cfg_test = false;
    let mut in_block_comment = false;
    for raw in text.lines() {
        let mut line = raw.to_string();
        if in_block_comment {
            match line.find("*/") {
                Some(i) => {
                    line = line[i + 2..].to_string();
                    in_block_comment = false;
                }
                None => continue,
            }
        }
        if let Some(i) = line.find("/*") {
            if !line[..i].contains('"') {
                match line[i..].find("*/") {
                    Some(j) => line = format!("{}{}", &line[..i], &line[i + j + 2..]),
                    None => {
                        line.truncate(i);
                        in_block_comment = true;
                    }
                }
            }
        }
        if let Some(i) = line.find("//") {
            // not inside a string literal on this line (good enough for use paths)
            if line[..i].matches('"').count() % 2 == 0 {
                line.truncate(i);
            }
        }
        let t = line.trim();
        if t.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        let opens = t.matches('{').count() as i32;
        let closes = t.matches('}').count() as i32;
        if pending_cfg_test && skip_depth.is_none() && !t.is_empty() && !t.starts_with("#[") {
            pending_cfg_test = false;
            if opens > closes {
                skip_depth = Some(depth);
            }
            depth += opens - closes;
            continue;
        }
        depth += opens - closes;
        if let Some(d) = skip_depth {
            if depth <= d {
                skip_depth = None;
            }
            continue;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The crate's top-level modules that `code` names through `crate::` paths, grouped ones
/// (`crate::{a::X, b}`) included.
fn referenced(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + 7..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` in macros or `foo_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut top = String::new();
            let mut at_top = true;
            for c in group.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        at_top = false
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        refs.insert(std::mem::take(&mut top));
                        at_top = true;
                    }
                    ':' if depth == 1 => at_top = false,
                    c if at_top && depth == 1 && (c.is_alphanumeric() || c == '_') => top.push(c),
                    _ => {}
                }
            }
            refs.insert(top);
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            refs.insert(name);
        }
    }
    refs.retain(|r| modules.contains(r));
    refs
}

/// The strongly connected components with more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T { g: graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Every `.rs` file under `dir`, one after another (sorted, so the result is stable).
fn folder_code(dir: &std::path::Path) -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            if p.is_dir() {
                folder_code(p)
            } else if p.extension().is_some_and(|e| e == "rs") {
                std::fs::read_to_string(p).unwrap() + "\n"
            } else {
                String::new()
            }
        })
        .collect()
}

#[test]
fn no_import_circle_spans_files() {
    let mut found = Vec::new();
    for dir in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = dir.unwrap().path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let krate = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut files = BTreeMap::new();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            let stem = f.file_stem().unwrap().to_string_lossy().to_string();
            if f.is_dir() {
                // A module folder is one top-level module: its files together (they name each
                // other through `super::`, which is not a circle between top-level modules).
                files.insert(stem, code_of(&folder_code(&f)));
                continue;
            }
            if f.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
                files.insert(stem, code_of(&std::fs::read_to_string(&f).unwrap()));
            }
        }
        let modules: BTreeSet<String> = files.keys().cloned().collect();
        let graph: BTreeMap<String, BTreeSet<String>> = files
            .iter()
            .map(|(m, code)| {
                let mut r = referenced(code, &modules);
                r.remove(m);
                (m.clone(), r)
            })
            .collect();
        for c in circles(&graph) {
            found.push((krate.clone(), c));
        }
    }
    let mut problems = Vec::new();
    for (krate, c) in &found {
        if !ALLOWED_CIRCLES.iter().any(|(k, m, _)| k == krate && m.iter().map(|s| s.to_string()).collect::<Vec<_>>() == *c) {
            problems.push(format!("crates/{krate}: the modules {c:?} import each other in a circle"));
        }
    }
    for (k, m, _) in ALLOWED_CIRCLES {
        if !found.iter().any(|(krate, c)| krate == k && c.iter().map(String::as_str).eq(m.iter().copied())) {
            problems.push(format!("ALLOWED_CIRCLES lists crates/{k} {m:?}, which is no longer a circle: remove the entry"));
        }
    }
    assert!(problems.is_empty(), "import circles:\n  {}", problems.join("\n  "));
}

#[test]
fn the_checker_sees_grouped_and_plain_paths_and_skips_tests_and_comments() {
    let modules: BTreeSet<String> = ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect();
    let code = code_of("use crate::{a::X, b::{Y, Z}};\n// crate::c in a comment\nfn f() { crate::d::g() }\n#[cfg(test)]\nmod tests {\n    use crate::e;\n}\n");
    assert_eq!(referenced(&code, &modules), ["a", "b", "d"].iter().map(|s| s.to_string()).collect());
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])].iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect();
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
}

/// The C experiments the docs cite as evidence (`bench/experiments/*.c`) still build, warnings
/// as errors, so a claim cannot rest on a program that no longer compiles. (The Rust ones are
/// examples of crates/bench, built and linted with the workspace.)
#[test]
fn the_c_experiments_build() {
    let dir = root().join("bench/experiments");
    let out = std::env::temp_dir().join(format!("vectorlb-experiments-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let dpdk = Command::new("pkg-config").args(["--cflags", "--libs", "libdpdk"]).output().expect("pkg-config runs");
    assert!(dpdk.status.success(), "pkg-config libdpdk: {} (scripts/setup.sh installs libdpdk-dev)", String::from_utf8_lossy(&dpdk.stderr));
    let dpdk_flags: Vec<String> = String::from_utf8(dpdk.stdout).unwrap().split_whitespace().map(String::from).collect();
    let mut built = 0;
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_none_or(|e| e != "c") {
            continue;
        }
        let bin = out.join(f.file_stem().unwrap());
        let mut cc = Command::new("cc");
        cc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&bin).arg(&f);
        if std::fs::read_to_string(&f).unwrap().contains("rte_") {
            cc.args(&dpdk_flags);
        }
        let r = cc.output().expect("cc runs");
        assert!(r.status.success(), "{}: {}", f.display(), String::from_utf8_lossy(&r.stderr));
        built += 1;
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(built >= 2, "expected the C experiments in {}, built {built}", dir.display());
}

/// docs/benchmarks.md is exactly what bench/report.py writes from bench/results/ and
/// bench/notes/: regenerating the page from the repository loses nothing, and nobody edits the
/// page by hand (a hand edit belongs in bench/notes/).
#[test]
fn the_benchmark_page_is_what_the_report_writes() {
    let out = std::env::temp_dir().join(format!("vectorlb-benchmarks-{}.md", std::process::id()));
    let r = Command::new("python3").arg("bench/report.py").arg("--no-charts").arg("--out").arg(&out).current_dir(root()).output().expect("python3 runs");
    assert!(r.status.success(), "bench/report.py: {}{}", String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    let written = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let page = std::fs::read_to_string(root().join("docs/benchmarks.md")).unwrap();
    let headings = |t: &str| t.lines().filter(|l| l.starts_with('#')).map(String::from).collect::<Vec<_>>();
    assert_eq!(headings(&page), headings(&written), "docs/benchmarks.md and bench/report.py's page differ in their sections");
    if let Some((i, (a, b))) = page.lines().zip(written.lines()).enumerate().find(|(_, (a, b))| a != b) {
        panic!("docs/benchmarks.md differs from what `make bench-report` writes at line {}:\n  page:   {a}\n  report: {b}\n(edit bench/notes/ or bench/results/, then make bench-report)", i + 1);
    }
    assert_eq!(page.lines().count(), written.lines().count(), "docs/benchmarks.md and the report's page differ in length");
}

/// Files of the product (not the tools, the test kit or the benchmarks) that may call the HTTP
/// client directly, and why. Every other call between our binaries goes through
/// `vectorlb_wire::Api`, which takes and returns only wire types.
const DIRECT_CLIENT: &[(&str, &str)] = &[
    ("crates/wire/src/call.rs", "the typed call itself"),
    ("crates/daemon/src/health.rs", "health checks of backends, which are not ours"),
    ("crates/vectorlb/src/ctl.rs", "`ctl --raw`: the operator's own request, passed through as given"),
];

/// The servers of our APIs: their bodies are wire types, never JSON built by hand.
const API_SERVERS: &[&str] = &["crates/api/src", "crates/http/src/error.rs", "crates/daemon/src/control_api.rs", "crates/proxy/src/admin.rs"];

fn product_sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = dir.unwrap().path();
        let krate = dir.file_name().unwrap().to_string_lossy().to_string();
        if ["tools", "testkit", "bench", "client"].contains(&krate.as_str()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.join("src")) else { continue };
        for f in files {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "rs") {
                let rel = f.strip_prefix(root()).unwrap().to_string_lossy().to_string();
                out.push((rel, code_of(&std::fs::read_to_string(&f).unwrap())));
            }
        }
    }
    out
}

/// What breaks the contract in `code` (a file of `path`), if anything.
fn contract_problems(path: &str, code: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let direct = ["vectorlb_client::request(", "vectorlb_client::request_blocking(", "request_blocking(&", "vectorlb_client::Request {", "vectorlb_client::{"];
    if !DIRECT_CLIENT.iter().any(|(p, _)| *p == path) {
        for d in direct {
            if code.contains(d) {
                problems.push(format!("{path}: calls the HTTP client directly (`{d}`); call through vectorlb_wire::Api with wire types"));
            }
        }
    }
    if API_SERVERS.iter().any(|s| path.starts_with(s)) {
        for u in ["json!(", "serde_json::Value", "Json<Value>"] {
            if code.contains(u) {
                problems.push(format!("{path}: an API server builds or reads untyped JSON (`{u}`); answer with a wire type"));
            }
        }
    }
    problems
}

#[test]
fn no_body_between_our_binaries_is_untyped_json() {
    let sources = product_sources();
    assert!(sources.len() > 100, "the product's sources were not found ({})", sources.len());
    let mut problems = Vec::new();
    for (path, code) in &sources {
        problems.extend(contract_problems(path, code));
    }
    for (p, _) in DIRECT_CLIENT {
        assert!(
            sources.iter().any(|(s, c)| s == p && (c.contains("request(") || c.contains("request_blocking("))),
            "DIRECT_CLIENT lists {p}, which no longer calls the client: remove it"
        );
    }
    assert!(problems.is_empty(), "the contract between our binaries:\n  {}", problems.join("\n  "));
}

#[test]
fn the_contract_check_sees_what_it_forbids() {
    assert_eq!(contract_problems("crates/kube/src/x.rs", "let r = vectorlb_client::request(&t, &r, &o).await;").len(), 1);
    assert!(contract_problems(
        "crates/kube/src/x.rs",
        &code_of("// vectorlb_client::request(&t)\n#[cfg(test)]\nmod t {\n    fn f() { vectorlb_client::request(&t, &r, &o); }\n}\n")
    )
    .is_empty());
    assert_eq!(contract_problems("crates/proxy/src/admin.rs", "Json(serde_json::json!({\"ok\": true}))").len(), 1);
    assert!(contract_problems("crates/kube/src/controller.rs", "Patch::Merge(&json!({\"status\": s}))").is_empty(), "kube-apiserver's objects are not our contract");
}

/// The layer diagram of docs/architecture.md: rows from the binaries down to the leaves.
fn layers() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let start = doc.find("<!-- layers -->").expect("docs/architecture.md: the layer diagram is marked <!-- layers -->");
    let block = &doc[start..];
    let body = block.split("```").nth(1).expect("the layer diagram's code block");
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let l = l.trim();
            let (row, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let crates = rest.split('·').map(|c| c.split_whitespace().next().unwrap_or("").to_string()).filter(|c| !c.is_empty()).collect();
            (row.to_string(), crates)
        })
        .collect()
}

#[test]
fn the_layer_diagram_holds_every_crate_and_every_edge_points_down() {
    let graph = metadata();
    let rows = layers();
    let short = |c: &str| c.strip_prefix("vectorlb-").unwrap_or(c).to_string();
    let mut row_of = BTreeMap::new();
    let mut problems = Vec::new();
    // Rows are listed from the top: a higher row has a lower index.
    for (i, (row, crates)) in rows.iter().enumerate() {
        for c in crates {
            if row_of.insert(short(c), (i, row.clone())).is_some() {
                problems.push(format!("{c} is in two rows"));
            }
        }
    }
    for name in graph.keys() {
        if !row_of.contains_key(name) {
            problems.push(format!("vectorlb-{name} is in no row of the layer diagram"));
        }
    }
    for (name, deps) in &graph {
        let Some((i, row)) = row_of.get(name) else { continue };
        for d in deps {
            let Some((j, drow)) = row_of.get(d) else { continue };
            if j <= i {
                problems.push(format!("vectorlb-{name} ({row}) uses vectorlb-{d} ({drow}): dependencies only point to lower rows"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/architecture.md's layer diagram against cargo metadata:\n  {}", problems.join("\n  "));
}
