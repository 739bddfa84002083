//! Headless Chromium driven over the DevTools protocol (`--remote-debugging-pipe`: JSON
//! messages ended by a NUL byte, commands on the browser's fd 3, answers and events on its
//! fd 4), for tests that load a page, read its rendered DOM, watch its network requests and
//! take screenshots. No websocket, no extra crate.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long one command may take before the test fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    child: Child,
    to: std::fs::File,
    from: Receiver<Value>,
    next_id: u64,
    session: Option<String>,
    /// Every event received so far (method and params), in order.
    pub events: Vec<Value>,
}

/// The Chromium binary: `CHROMIUM`, or Debian's `chromium`.
pub fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`; each is owned once, below.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Makes `fd` the descriptor `to` in the child, without close-on-exec.
fn place(fd: i32, to: i32) -> std::io::Result<()> {
    // SAFETY: dup2 and fcntl on descriptors this process owns; called between fork and exec.
    let r = unsafe {
        if fd == to {
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, to)
        }
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Browser {
    /// Starts headless Chromium (inside network namespace `netns` when given: `ip netns exec`),
    /// with its profile in `profile`, and opens one blank page to drive.
    pub fn launch(netns: Option<&str>, profile: &Path) -> Browser {
        let (cmd_r, cmd_w) = pipe();
        let (ev_r, ev_w) = pipe();
        let mut c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &chromium()]);
                c
            }
            None => Command::new(chromium()),
        };
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1300,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let (a, b) = (cmd_r.as_raw_fd(), ev_w.as_raw_fd());
        // SAFETY: the closure only calls dup2/fcntl (async-signal-safe) on descriptors that stay
        // open in the parent until spawn returns.
        unsafe {
            c.pre_exec(move || {
                // fd 4 first: if `a` is 4 it must be moved before it is overwritten.
                let a = if a == 4 { libc::dup(a) } else { a };
                place(b, 4)?;
                place(a, 3)
            });
        }
        let child = c.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e} (apt-get install chromium)", chromium()));
        drop((cmd_r, ev_w));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::fs::File::from(ev_r);
        std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser { child, to: std::fs::File::from(cmd_w), from: rx, next_id: 0, session: None, events: Vec::new() };
        let targets = b.call("Target.getTargets", json!({}));
        let page = targets["targetInfos"].as_array().and_then(|t| t.iter().find(|t| t["type"] == "page")).map(|t| t["targetId"].as_str().unwrap_or_default().to_string());
        let target = match page {
            Some(t) => t,
            None => b.call("Target.createTarget", json!({"url": "about:blank"}))["targetId"].as_str().unwrap().to_string(),
        };
        let s = b.call("Target.attachToTarget", json!({"targetId": target, "flatten": true}));
        b.session = Some(s["sessionId"].as_str().expect("a session id").to_string());
        b.call("Page.enable", json!({}));
        b.call("Network.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b
    }

    /// Sends a command (to the page once attached) and waits for its result; events that
    /// arrive meanwhile are kept in [`Browser::events`]. A protocol error fails the test.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap_or_else(|e| panic!("chromium went away ({method}): {e}"));
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from.recv_timeout(left) {
                Ok(v) if v["id"] == id => {
                    if let Some(e) = v.get("error") {
                        panic!("{method}: {e}");
                    }
                    return v["result"].clone();
                }
                Ok(v) => {
                    if v.get("method").is_some() {
                        self.events.push(v);
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no answer from chromium in {CALL_TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium exited"),
            }
        }
    }

    /// Opens `url` in the page (the load goes on in the background).
    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        if let Some(e) = r.get("errorText") {
            panic!("navigating to {url}: {e}");
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its value as JSON; an
    /// exception in the page fails the test.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true, "awaitPromise": true}));
        if let Some(e) = r.get("exceptionDetails") {
            panic!("evaluating {expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Evaluates `expr` every 200 ms until it yields `true`; the last value on failure.
    pub fn wait_for(&mut self, expr: &str, limit: Duration) -> Result<Duration, Value> {
        let t = Instant::now();
        loop {
            let v = self.eval(expr);
            if v == Value::Bool(true) {
                return Ok(t.elapsed());
            }
            if t.elapsed() > limit {
                return Err(v);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A PNG of the page as it is rendered now.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true}));
        vectorlb_client::base64_decode(r["data"].as_str().expect("screenshot data")).expect("base64 from chromium")
    }

    /// The URLs of every request the page has made so far.
    pub fn requested_urls(&mut self) -> Vec<String> {
        // A cheap command flushes events already sent.
        self.call("Runtime.evaluate", json!({"expression": "1"}));
        self.events.iter().filter(|e| e["method"] == "Network.requestWillBeSent").filter_map(|e| e["params"]["request"]["url"].as_str().map(String::from)).collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
