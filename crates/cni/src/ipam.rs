//! Delegation to the IPAM plugin the configuration names (`ipam.type`), as the specification
//! describes it: the same environment with the command, the configuration on stdin, in the
//! newest version both plugins speak (Debian's host-local speaks up to 1.0.0); and the check
//! of the pod's interface from inside its namespace.

use serde_json::{Map, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use vectorlb_cni::spec::{self, code, CniError, Env, NetConf};

fn find(env: &Env, kind: &str) -> Result<PathBuf, CniError> {
    for dir in env.path.split(':').filter(|d| !d.is_empty()) {
        let p = PathBuf::from(dir).join(kind);
        if p.metadata().is_ok_and(|m| m.is_file()) {
            return Ok(p);
        }
    }
    Err(CniError::new(code::INVALID_CONFIG, format!("ipam.type: no plugin '{kind}' in CNI_PATH"), format!("searched {}", env.path)))
}

fn run(env: &Env, plugin: &PathBuf, command: &str, stdin: &[u8]) -> Result<(bool, Vec<u8>), CniError> {
    let mut c = Command::new(plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_ARGS", &env.args)
        .env("CNI_PATH", &env.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CniError::new(code::IO_FAILURE, format!("cannot run the IPAM plugin {}", plugin.display()), e.to_string()))?;
    if let Some(mut i) = c.stdin.take() {
        let _ = i.write_all(stdin);
    }
    let out = c.wait_with_output().map_err(|e| CniError::new(code::IO_FAILURE, format!("the IPAM plugin {}", plugin.display()), e.to_string()))?;
    Ok((out.status.success(), out.stdout))
}

/// The versions the IPAM plugin says it speaks (empty when it does not answer VERSION).
fn versions(env: &Env, plugin: &PathBuf) -> Vec<String> {
    let Ok((true, out)) = run(env, plugin, "VERSION", br#"{"cniVersion":"0.4.0"}"#) else { return Vec::new() };
    serde_json::from_slice::<Value>(&out)
        .ok()
        .and_then(|v| v.get("supportedVersions")?.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()))
        .unwrap_or_default()
}

/// Whether the IPAM plugin speaks `version` (or later).
pub fn speaks(env: &Env, ipam: &Map<String, Value>, version: &str) -> bool {
    let Some(kind) = ipam.get("type").and_then(Value::as_str) else { return false };
    find(env, kind).map(|p| versions(env, &p).iter().any(|v| spec::at_least(v, version))).unwrap_or(false)
}

/// Runs the IPAM plugin for `command`; its result (ADD) or nothing. Its errors come back with
/// their code, the message saying they are the IPAM plugin's.
pub fn exec(env: &Env, conf: &NetConf, ipam: &Map<String, Value>, command: &str) -> Result<Option<Value>, CniError> {
    let kind = ipam.get("type").and_then(Value::as_str).unwrap_or_default();
    let plugin = find(env, kind)?;
    // The newest version both speak, no newer than the configuration's.
    let mut input = conf.raw.clone();
    let theirs = versions(env, &plugin);
    let version = theirs.iter().filter(|v| spec::supported(v) && spec::at_least(&conf.cni_version, v)).max_by(|a, b| {
        if spec::at_least(a, b) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Less
        }
    });
    if let Some(v) = version {
        input["cniVersion"] = Value::String(v.clone());
    }
    if let Some(o) = input.as_object_mut() {
        // The previous result is ours, in our version; the IPAM plugin has no use for it.
        o.remove("prevResult");
    }
    let (ok, out) = run(env, &plugin, command, input.to_string().as_bytes())?;
    if !ok {
        let e: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
        let c = e.get("code").and_then(Value::as_u64).unwrap_or(code::IO_FAILURE as u64) as u32;
        let msg = e.get("msg").and_then(Value::as_str).unwrap_or("failed");
        let details = e.get("details").and_then(Value::as_str).unwrap_or_default();
        return Err(CniError::new(c, format!("IPAM plugin {kind} ({command}): {msg}"), details));
    }
    if command != "ADD" {
        return Ok(None);
    }
    serde_json::from_slice(&out).map(Some).map_err(|e| CniError::new(code::DECODE, format!("IPAM plugin {kind}: its result is not JSON"), e.to_string()))
}

/// Checks from inside the pod's namespace that `ifname` exists, is up and has `ips`.
pub fn in_pod_netns_has(netns: &str, ifname: &str, ips: &[String]) -> Result<(), CniError> {
    let ns = std::fs::File::open(netns).map_err(|e| CniError::new(code::UNKNOWN_CONTAINER, format!("CNI_NETNS {netns}"), e.to_string()))?;
    let (name, want) = (ifname.to_string(), ips.to_vec());
    let found = std::thread::spawn(move || -> Result<Vec<(String, String, bool)>, String> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on an open descriptor; only this thread changes namespace and it ends
        // below.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("not a network namespace: {}", std::io::Error::last_os_error()));
        }
        let mut out = Vec::new();
        let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills a list we free below with freeifaddrs; each entry's name is
        // a NUL-terminated string and its address, when not null, a sockaddr of its family.
        unsafe {
            if libc::getifaddrs(&mut ifa) != 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            let mut p = ifa;
            while !p.is_null() {
                let e = &*p;
                let n = std::ffi::CStr::from_ptr(e.ifa_name).to_string_lossy().into_owned();
                let up = e.ifa_flags & libc::IFF_UP as u32 != 0;
                if !e.ifa_addr.is_null() {
                    match (*e.ifa_addr).sa_family as i32 {
                        libc::AF_INET => {
                            let s = &*(e.ifa_addr as *const libc::sockaddr_in);
                            out.push((n, std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)).to_string(), up));
                        }
                        libc::AF_INET6 => {
                            let s = &*(e.ifa_addr as *const libc::sockaddr_in6);
                            out.push((n, std::net::Ipv6Addr::from(s.sin6_addr.s6_addr).to_string(), up));
                        }
                        _ => out.push((n, String::new(), up)),
                    }
                }
                p = e.ifa_next;
            }
            libc::freeifaddrs(ifa);
        }
        Ok(out)
    })
    .join()
    .map_err(|_| CniError::new(code::IO_FAILURE, "the namespace check failed", ""))?
    .map_err(|e| CniError::new(code::IO_FAILURE, format!("CNI_NETNS {netns}"), e))?;
    let mine: Vec<&(String, String, bool)> = found.iter().filter(|(n, _, _)| *n == name).collect();
    if mine.is_empty() {
        return Err(CniError::new(code::INVALID_CONFIG, format!("{name}: no such interface in {netns}"), ""));
    }
    if !mine.iter().all(|(_, _, up)| *up) {
        return Err(CniError::new(code::INVALID_CONFIG, format!("{name} in {netns} is down"), ""));
    }
    for a in &want {
        if !mine.iter().any(|(_, x, _)| x == a) {
            return Err(CniError::new(code::INVALID_CONFIG, format!("{name} in {netns} does not have {a}"), ""));
        }
    }
    Ok(())
}
