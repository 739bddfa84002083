//! The status page in headless Chromium against the daemon on the demo's topology with
//! traffic flowing (three backends up with non-zero rates, then one stopped and shown down by
//! the page itself, without a reload; no request leaves the daemon's origin; the API behind a
//! token), and the Grafana dashboard checked against a live `/metrics`.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use vectorlb_testkit::browser::Browser;
use vectorlb_testkit::*;

/// Labels Prometheus adds when it scrapes; the dashboard may use them on every metric.
const SCRAPE_LABELS: [&str; 2] = ["instance", "job"];

/// Metric name -> label names, from Prometheus text.
fn exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name: String = line.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        let labels = m.entry(name.clone()).or_default();
        if let Some(rest) = line[name.len()..].strip_prefix('{') {
            for (l, _) in matchers(rest) {
                labels.insert(l);
            }
        }
    }
    m
}

/// The `label op "value"` pairs of a `{...}` body (given without its `{`), up to its `}`.
fn matchers(body: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_')).collect();
        if name.is_empty() {
            return out;
        }
        let op: String = std::iter::from_fn(|| chars.next_if(|c| matches!(c, '=' | '!' | '~'))).collect();
        assert!(chars.next() == Some('"'), "matcher {name}{op} without a quoted value in {body:?}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((name, value));
    }
}

/// Every PromQL expression of a Grafana dashboard: panel targets and variable queries.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) | ("definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains("vectorlb_") => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

/// What in `expr` does not exist in the exposition `have`: unknown metrics, and labels (in
/// matchers, `by`/`without` lists, `label_values`, legends) that its metrics do not carry.
fn missing(expr: &str, legend: Option<&str>, have: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut metrics = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("vectorlb_") {
        let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let after = &rest[i + name.len()..];
        match have.get(&name) {
            None => bad.push(format!("metric {name}")),
            Some(ls) => {
                if let Some(body) = after.strip_prefix('{') {
                    for (l, _) in matchers(body) {
                        if !ls.contains(&l) && !SCRAPE_LABELS.contains(&l.as_str()) {
                            bad.push(format!("label {l} of {name}"));
                        }
                    }
                }
                metrics.push(name.clone());
            }
        }
        rest = after;
    }
    for kw in ["by (", "without ("] {
        let mut r = expr;
        while let Some(i) = r.find(kw) {
            let list = &r[i + kw.len()..];
            let end = list.find(')').unwrap_or(list.len());
            labels.extend(list[..end].split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
            r = &list[end..];
        }
    }
    if let Some(i) = expr.find("label_values(") {
        let args = &expr[i + "label_values(".len()..];
        let end = args.rfind(')').unwrap_or(args.len());
        if let Some(last) = args[..end].rsplit(',').next() {
            labels.push(last.trim().to_string());
        }
    }
    if let Some(l) = legend {
        let mut r = l;
        while let Some(i) = r.find("{{") {
            let end = r[i..].find("}}").map(|e| i + e).unwrap_or(r.len());
            labels.push(r[i + 2..end].trim().to_string());
            r = &r[(end + 2).min(r.len())..];
        }
    }
    for l in labels {
        if SCRAPE_LABELS.contains(&l.as_str()) {
            continue;
        }
        for m in &metrics {
            if !have[m].contains(&l) {
                bad.push(format!("label {l} of {m}"));
            }
        }
    }
    bad
}

/// Every problem of the dashboard against a daemon's `/metrics`.
fn dashboard_problems(dashboard: &Value, metrics_text: &str) -> Vec<String> {
    let have = exposition(metrics_text);
    let mut problems = Vec::new();
    let mut n = 0;
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            n += 1;
            for m in missing(expr, t["legendFormat"].as_str(), &have) {
                problems.push(format!("panel {:?}: {m} (in {expr})", p["title"]));
            }
        }
    }
    let mut all = Vec::new();
    queries(&dashboard["templating"], &mut all);
    for q in all {
        n += 1;
        for m in missing(&q, None, &have) {
            problems.push(format!("variable query: {m} (in {q})"));
        }
    }
    assert!(n >= 20, "only {n} queries found in the dashboard");
    problems
}

fn dashboard() -> Value {
    let path = repo().join("deploy/grafana/vectorlb.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_dashboard_checker_finds_what_is_missing() {
    let text = "# HELP x\nvectorlb_backend_up{vip=\"1.2.3.4\",port=\"80\",backend=\"10.0.0.1\"} 1\nvectorlb_rx_total 5\n";
    let have = exposition(text);
    assert_eq!(missing("sum by (vip, backend) (vectorlb_backend_up{instance=~\"$instance\",vip=~\"$vip\"})", Some("{{backend}}"), &have), Vec::<String>::new());
    assert_eq!(missing("rate(vectorlb_rx_totl[1m])", None, &have), ["metric vectorlb_rx_totl"]);
    assert_eq!(missing("vectorlb_rx_total{port=\"a\"}", None, &have), ["label port of vectorlb_rx_total"]);
    assert_eq!(missing("sum by (reason) (rate(vectorlb_rx_total[1m]))", None, &have), ["label reason of vectorlb_rx_total"]);
    assert_eq!(missing("vectorlb_rx_total", Some("{{ dir }}"), &have), ["label dir of vectorlb_rx_total"]);
    assert_eq!(missing("label_values(vectorlb_rx_total, vip)", None, &have), ["label vip of vectorlb_rx_total"]);
    // The shipped dashboard, with one name changed, fails against the same text.
    let d = dashboard();
    let broken: Value = serde_json::from_str(&d.to_string().replace("vectorlb_backend_up", "vectorlb_backend_upp")).unwrap();
    assert!(dashboard_problems(&broken, text).iter().any(|p| p.contains("metric vectorlb_backend_upp")));
}

/// One row of the page's backend table.
const ROWS: &str = "JSON.stringify([...document.querySelectorAll('#services tr.backend')].map(r => ({ \
    backend: r.dataset.backend, state: r.dataset.state, \
    new_rate: +r.querySelector('td.new-rate').dataset.value, pkt_rate: +r.querySelector('td.pkt-rate').dataset.value })))";

fn rows(b: &mut Browser) -> Vec<Value> {
    serde_json::from_str(b.eval(ROWS).as_str().unwrap()).unwrap()
}

#[test]
fn status_page_in_chromium_and_the_grafana_dashboard_against_live_metrics() {
    let mut t = Topo::new("pg", Shape::TwoArm, 1500);
    t.nginx();
    // The demo's service (full NAT, Maglev, three backends) with an HTTP health check; the API
    // on the unix socket (for the test) and on TCP in the LB's namespace behind a token (for
    // the browser, which runs there too).
    let token = "page-test-token-0123456789";
    let token_file = t.dir.join("api.token");
    std::fs::write(&token_file, token).unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let base =
        t.base_config(None).replace(&format!("api = \"{}\"\n", t.api()), &format!("api = [\"{}\", \"127.0.0.1:9180\"]\napi_token_file = \"{}\"\n", t.api(), token_file.display()));
    assert!(base.contains("127.0.0.1:9180"), "{base}");
    let svc = service("10.0.0.100", 80, "tcp", "fnat", "maglev", Some("10.1.0.200"), &backends(false, 80))
        .replace("backends = [", "health = { kind = \"http\", path = \"/\", interval = 0.2, timeout = 0.2, rise = 2, fall = 2 }\nbackends = [");
    // A default-set ingress limit far above the test's traffic, so that the queue-set series
    // the dashboard charts exist (without sets or a limit they are not exported).
    t.start_lb(&(base + &svc + "\n[default_set]\ningress = { pps = 10000000 }\n"));

    // Traffic for the whole test (bounded: the probe stops after its requests).
    t.spawn("cl", &[tools(), "probe", "http", "--url", "http://10.0.0.100/", "--requests", "200000", "--concurrency", "2"]);

    let profile = t.dir.join("chromium");
    let mut b = Browser::launch(Some(&t.ns("lb")), &profile);
    let origin = "http://127.0.0.1:9180";
    b.navigate(&format!("http://ui:{token}@127.0.0.1:9180/"));
    let up = "(() => { const r = [...document.querySelectorAll('#services tr.backend')]; \
              return r.length === 3 && r.every(x => x.dataset.state === 'up' && +x.querySelector('td.new-rate').dataset.value > 0 \
              && +x.querySelector('td.pkt-rate').dataset.value > 0); })()";
    if let Err(last) = b.wait_for(up, Duration::from_secs(20)) {
        panic!("the page did not show three backends up with traffic: {last}; rows {:?}; error banner {:?}", rows(&mut b), b.eval("document.querySelector('#error').textContent"));
    }
    let shown = rows(&mut b);
    let mut names: Vec<&str> = shown.iter().map(|r| r["backend"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["10.1.0.11:80", "10.1.0.12:80", "10.1.0.13:80"]);
    // The page's figures are the API's (the same 10 s window), not numbers of its own.
    let api: Vec<f64> = t.get("/v1/services")[0]["backends"].as_array().unwrap().iter().map(|x| x["rates"]["new_sessions_per_second"].as_f64().unwrap()).collect();
    assert!(api.iter().all(|r| *r > 0.0), "{api:?}");
    // The charts start from the daemon's history (GET /v1/history), not empty.
    let hist = t.get("/v1/history");
    let series = &hist["services"][0]["backends"][0]["series"]["new_sessions_per_second"];
    assert!(series.as_array().is_some_and(|s| !s.is_empty()), "{hist}");
    let points = b.eval("document.querySelector('#services tr.backend svg polyline').getAttribute('points').split(' ').length");
    assert!(points.as_u64().unwrap() >= 2, "chart points: {points}");
    // ctl shows the same window's rates.
    let o = std::process::Command::new(bin()).args(["ctl", "--api", &t.api(), "-Ln", "--rate"]).output().unwrap();
    let out = stdout(&o);
    let rated =
        out.lines().filter(|l| l.trim_start().starts_with("->")).filter(|l| l.split_whitespace().nth(2).and_then(|c| c.parse::<f64>().ok()).is_some_and(|c| c > 0.0)).count();
    assert_eq!(rated, 3, "ctl -Ln --rate:\n{out}");
    if std::env::var_os("VECTORLB_UPDATE_DOCS").is_some() {
        // For the documentation's picture: charts with some history.
        std::thread::sleep(Duration::from_secs(40));
    }
    // The ports' rates come from the API's window too.
    let ports = b.eval("[...document.querySelectorAll('#ports tbody tr')].map(r => +r.children[2].dataset.value).join(',')");
    assert!(ports.as_str().unwrap().split(',').all(|v| v.parse::<f64>().unwrap() > 0.0), "port rx rates: {ports}");
    // The queue-set table: the default set (policed far above the traffic), its packets as
    // the API counts them, passed before the ring and none policed.
    let qs = "(() => { const r = document.querySelector('#queuesets tr[data-set=\"default\"]'); \
              return !document.querySelector('#qs-section').hidden && !!r && +r.querySelector('td.rx').dataset.value > 0 \
              && +r.querySelector('td.xdp-passed').dataset.value > 0 && r.querySelector('td.xdp-policed').dataset.value === '0'; })()";
    if let Err(last) = b.wait_for(qs, Duration::from_secs(10)) {
        panic!("no default set row with traffic: {last}; {:?}", b.eval("document.querySelector('#queuesets').outerHTML"));
    }
    let png = b.screenshot();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000, "screenshot: {} bytes", png.len());
    std::fs::write(t.dir.join("status-page.png"), &png).unwrap();
    if std::env::var_os("VECTORLB_UPDATE_DOCS").is_some() {
        std::fs::write(repo().join("docs/img/status-page.png"), &png).unwrap();
    }

    // A backend stops: the open page turns it down by itself (no reload: same document).
    b.eval("window.__sameDocument = 1");
    t.kill_nginx(2);
    let down = "(() => { const r = document.querySelector('#services tr.backend[data-backend=\"10.1.0.12:80\"]'); return !!r && r.dataset.state === 'down'; })()";
    if let Err(last) = b.wait_for(down, Duration::from_secs(15)) {
        panic!("10.1.0.12 not shown down: {last}; rows {:?}", rows(&mut b));
    }
    assert_eq!(b.eval("window.__sameDocument"), Value::from(1), "the page was reloaded");
    let after = rows(&mut b);
    assert_eq!(after.iter().filter(|r| r["state"] == "up").count(), 2, "{after:?}");
    assert_eq!(b.eval("document.querySelector('#services tr.service td:nth-child(3)').textContent"), "2/3 up");

    // Every request the page made went to the daemon that served it, and it kept polling.
    // (The first loads carry the login in their URL; the origin is what follows it.)
    let urls: Vec<String> = b.requested_urls().into_iter().map(|u| u.replacen(&format!("ui:{token}@"), "", 1)).collect();
    let foreign: Vec<&String> = urls.iter().filter(|u| !u.starts_with(&format!("{origin}/")) && !u.starts_with("data:")).collect();
    assert!(foreign.is_empty(), "requests to other origins: {foreign:?}");
    let polls = urls.iter().filter(|u| u.ends_with("/v1/services")).count();
    // (At least the load and the update that showed the backend down.)
    assert!(polls >= 2, "the page polled /v1/services {polls} times: {urls:?}");
    for asset in ["/ui/status.js", "/ui/status.css"] {
        assert!(urls.iter().any(|u| u == &format!("{origin}{asset}")), "{asset} not loaded: {urls:?}");
    }
    // Nothing went wrong in the page.
    let errors: Vec<&Value> = b.events.iter().filter(|e| e["method"] == "Runtime.exceptionThrown").collect();
    assert!(errors.is_empty(), "exceptions in the page: {errors:?}");

    // Without the token the API and the page answer 401, from the same browser.
    let status = b.eval("fetch(location.origin + '/v1/stats', { credentials: 'omit' }).then(r => r.status)");
    assert_eq!(status, Value::from(401));
    drop(b);

    // The Grafana dashboard's every metric and label exists in this daemon's /metrics.
    let (code, text) = api_call(&t.api(), "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    let problems = dashboard_problems(&dashboard(), &String::from_utf8_lossy(&text));
    assert!(problems.is_empty(), "deploy/grafana/vectorlb.json queries what /metrics lacks:\n{}", problems.join("\n"));
}
