//! `vectorlb-cni`: the CNI plugin of vectorlb's pod network (docs/pod-network.md). The
//! container runtime runs it with the specification's environment and the network
//! configuration on stdin; it gets the pod's addresses from the configured IPAM plugin (any:
//! host-local, ...) and asks the node's daemon (`POST /v1/pods`) for a tun interface in the
//! pod's namespace, read and written by the data plane. Errors are printed as the
//! specification's JSON with its codes; an ADD that fails gives its addresses back.

mod ipam;
use vectorlb_cni::spec;

use serde_json::{json, Value};
use spec::{code, CniError, Env, NetConf};
use std::io::{Read, Write};
use vectorlb_wire::call::{Ignored, Method};
use vectorlb_wire::model::{pod_path, NewPod, PodStatus};
use vectorlb_wire::{Api, CallError, ErrorKind};

fn main() {
    let env = Env::from_env();
    let mut input = Vec::new();
    let read = std::io::stdin().take((1 << 20) + 1).read_to_end(&mut input);
    let (version, out) = match read {
        Err(e) => (spec::LATEST.to_string(), Err(CniError::new(code::IO_FAILURE, "cannot read the network configuration", e.to_string()))),
        Ok(_) => run(&env, &input),
    };
    let mut stdout = std::io::stdout().lock();
    match out {
        Ok(Some(v)) => {
            let _ = writeln!(stdout, "{v}");
        }
        Ok(None) => {}
        Err(e) => {
            let _ = writeln!(stdout, "{}", e.to_json(&version));
            let _ = stdout.flush();
            std::process::exit(1);
        }
    }
}

/// One call: the version to answer in, and the result (`None`: nothing to print).
fn run(env: &Env, input: &[u8]) -> (String, Result<Option<Value>, CniError>) {
    if env.command == "VERSION" {
        // The configuration's version when it has one this plugin speaks.
        let asked = serde_json::from_slice::<Value>(input).ok().and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string));
        let v = asked.filter(|v| spec::supported(v)).unwrap_or_else(|| spec::LATEST.into());
        return (v.clone(), Ok(Some(json!({ "cniVersion": v, "supportedVersions": spec::SUPPORTED }))));
    }
    let conf = match NetConf::parse(input) {
        Ok(c) => c,
        Err(e) => {
            let v = serde_json::from_slice::<Value>(input).ok().and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string)).filter(|v| spec::supported(v));
            return (v.unwrap_or_else(|| spec::LATEST.into()), Err(e));
        }
    };
    let v = conf.cni_version.clone();
    let r = match env.command.as_str() {
        "ADD" => add(env, &conf).map(Some),
        "DEL" => del(env, &conf).map(|_| None),
        "CHECK" => check(env, &conf).map(|_| None),
        "GC" => gc(env, &conf).map(|_| None),
        "STATUS" => status(env, &conf).map(|_| None),
        "" => Err(CniError::new(code::INVALID_ENV, "CNI_COMMAND: missing", "")),
        other => Err(CniError::new(code::INVALID_ENV, format!("CNI_COMMAND: '{}' is not ADD, DEL, CHECK, GC, STATUS or VERSION", other.escape_debug()), "")),
    };
    (v, r)
}

/// The daemon's API as this configuration names it.
fn daemon(conf: &NetConf) -> Result<Api, CniError> {
    let token = match &conf.api_token_file {
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| CniError::new(code::IO_FAILURE, format!("api_token_file {f}"), e.to_string()))?.trim().to_string()),
        None => None,
    };
    let mut api = Api::new(&conf.api, token).map_err(|e| CniError::new(code::INVALID_CONFIG, format!("api: {e}"), ""))?;
    api.options.max_body = 64 << 20;
    Ok(api)
}

/// A failed call as the specification's error: no answer is "try again later" (the daemon is
/// starting or restarting); a refusal keeps the daemon's message as the details.
fn failed(e: CallError) -> CniError {
    match &e {
        CallError::Unreachable { target, .. } => CniError::new(code::TRY_AGAIN_LATER, format!("the vectorlb daemon at {target} does not answer"), e.to_string()),
        CallError::Refused { status, body, .. } => CniError::new(code::IO_FAILURE, format!("the vectorlb daemon answered {status}"), body.error.clone()),
        CallError::BadTarget(_) | CallError::Answer { .. } => CniError::new(code::IO_FAILURE, "the vectorlb daemon's answer", e.to_string()),
    }
}

/// The attached interfaces (`GET /v1/pods`).
fn pods(api: &Api) -> Result<Vec<PodStatus>, CallError> {
    api.get_blocking("/v1/pods")
}

fn add(env: &Env, conf: &NetConf) -> Result<Value, CniError> {
    env.require(true)?;
    if let Some(e) = &conf.host_ports_error {
        return Err(CniError::new(code::INVALID_CONFIG, "runtimeConfig.portMappings is invalid", e.clone()));
    }
    let api = daemon(conf)?;
    if !std::path::Path::new(&env.netns).exists() {
        return Err(CniError::new(code::UNKNOWN_CONTAINER, format!("CNI_NETNS {}: no such network namespace (the sandbox is gone)", env.netns), ""));
    }
    let Some(ipam_conf) = &conf.ipam else {
        return Err(CniError::new(code::INVALID_CONFIG, "ipam: missing (the pods' addresses come from an IPAM plugin, e.g. host-local)", ""));
    };
    let result = ipam::exec(env, conf, ipam_conf, "ADD")?.unwrap_or(Value::Null);
    let ips = spec::result_ips(&result);
    let give_back = |e: CniError| {
        let _ = ipam::exec(env, conf, ipam_conf, "DEL");
        e
    };
    if ips.is_empty() {
        return Err(give_back(CniError::new(code::IO_FAILURE, "the IPAM plugin gave no address", result.to_string())));
    }
    let pod = match (env.arg("K8S_POD_NAMESPACE"), env.arg("K8S_POD_NAME")) {
        (Some(ns), Some(n)) => Some(format!("{ns}/{n}")),
        _ => None,
    };
    let body = NewPod {
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        netns: env.netns.clone(),
        ips: ips.clone(),
        mtu: conf.mtu,
        pod,
        network: Some(conf.name.clone()),
        memif_ports: conf.memif_ports.clone(),
        host_ports: conf.host_ports.clone(),
    };
    match api.call_blocking::<_, PodStatus>(Method::POST, "/v1/pods", Some(&body)) {
        Ok(_) => Ok(spec::add_result(&conf.cni_version, &env.ifname, &env.netns, &ips, result.get("dns"))),
        Err(e) => Err(give_back(match e.kind() {
            Some(ErrorKind::NoNamespace) => CniError::new(code::UNKNOWN_CONTAINER, e.refusal().map(|b| b.error.clone()).unwrap_or_default(), ""),
            Some(ErrorKind::BadRequest | ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::Unprocessable) => {
                CniError::new(code::INVALID_CONFIG, "the vectorlb daemon refused the pod", e.refusal().map(|b| b.error.clone()).unwrap_or_default())
            }
            Some(ErrorKind::Unavailable) => CniError::new(code::TRY_AGAIN_LATER, "the vectorlb daemon is busy", e.refusal().map(|b| b.error.clone()).unwrap_or_default()),
            _ => failed(e),
        })),
    }
}

fn del(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    // DEL may come without a namespace (the sandbox is gone) and more than once.
    if env.container_id.is_empty() {
        return Err(CniError::new(code::INVALID_ENV, "CNI_CONTAINERID: missing", ""));
    }
    if env.ifname.is_empty() {
        return Err(CniError::new(code::INVALID_ENV, "CNI_IFNAME: missing", ""));
    }
    let api = daemon(conf)?;
    match api.call_blocking::<(), Ignored>(Method::DELETE, &pod_path(&env.container_id, &env.ifname), None) {
        Ok(_) => {}
        // Not attached (DEL twice, or after an ADD that failed) is not an error; but a
        // daemon without a pods port cannot have this pod either.
        Err(e) if e.kind() == Some(ErrorKind::NotFound) => {}
        Err(e) => return Err(failed(e)),
    }
    if let Some(ipam_conf) = &conf.ipam {
        ipam::exec(env, conf, ipam_conf, "DEL")?;
    }
    Ok(())
}

fn check(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    env.require(true)?;
    if !spec::at_least(&conf.cni_version, "0.4.0") {
        return Err(CniError::new(code::INCOMPATIBLE_VERSION, format!("CHECK needs cniVersion 0.4.0 or later, not {}", conf.cni_version), ""));
    }
    let Some(prev) = &conf.prev_result else {
        return Err(CniError::new(code::INVALID_CONFIG, "prevResult: missing (CHECK compares the pod against ADD's result)", ""));
    };
    let api = daemon(conf)?;
    let pods = pods(&api).map_err(failed)?;
    let Some(p) = pods.iter().find(|p| p.container_id == env.container_id && p.ifname == env.ifname) else {
        return Err(CniError::new(code::UNKNOWN_CONTAINER, format!("{} of {} is not attached", env.ifname, env.container_id), ""));
    };
    if p.netns != env.netns {
        return Err(CniError::new(code::INVALID_CONFIG, format!("{} of {} is attached in {}, not {}", env.ifname, env.container_id, p.netns, env.netns), ""));
    }
    let host = |a: &str| a.split_once('/').map_or(a, |(a, _)| a).to_string();
    let mut want: Vec<String> = spec::result_ips(prev).iter().map(|a| host(a)).collect();
    let mut have: Vec<String> = p.ips.iter().map(|a| host(a)).collect();
    want.sort();
    have.sort();
    if want != have {
        return Err(CniError::new(code::INVALID_CONFIG, format!("the pod's addresses are {have:?}, the previous result's {want:?}"), ""));
    }
    ipam::in_pod_netns_has(&env.netns, &env.ifname, &have)?;
    if let Some(ipam_conf) = &conf.ipam {
        ipam::exec(env, conf, ipam_conf, "CHECK")?;
    }
    Ok(())
}

fn gc(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    if !spec::at_least(&conf.cni_version, "1.1.0") {
        return Err(CniError::new(code::INCOMPATIBLE_VERSION, format!("GC needs cniVersion 1.1.0, not {}", conf.cni_version), ""));
    }
    // Without the list (libcni leaves it out when its caller gave none, as cnitool's gc does)
    // nothing is valid: every attachment of this network is a leftover. Only this network's:
    // another network's pods (or attachments made without a network) are never touched.
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    let api = daemon(conf)?;
    let mut left = Vec::new();
    for p in pods(&api).map_err(failed)? {
        let (id, ifname) = (p.container_id.as_str(), p.ifname.as_str());
        if p.network.as_deref() != Some(conf.name.as_str()) || valid.iter().any(|(i, n)| i == id && n == ifname) {
            continue;
        }
        match api.call_blocking::<(), Ignored>(Method::DELETE, &pod_path(id, ifname), None) {
            Ok(_) => {}
            Err(e) if e.kind() == Some(ErrorKind::NotFound) => {}
            Err(e) => left.push(format!("{ifname} of {id}: {e}")),
        }
    }
    if let Some(ipam_conf) = &conf.ipam {
        // Only an IPAM plugin that speaks 1.1.0 knows GC.
        if ipam::speaks(env, ipam_conf, "1.1.0") {
            ipam::exec(env, conf, ipam_conf, "GC")?;
        }
    }
    if !left.is_empty() {
        return Err(CniError::new(code::IO_FAILURE, "some leftover pod interfaces could not be removed", left.join("; ")));
    }
    Ok(())
}

fn status(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    if !spec::at_least(&conf.cni_version, "1.1.0") {
        return Err(CniError::new(code::INCOMPATIBLE_VERSION, format!("STATUS needs cniVersion 1.1.0, not {}", conf.cni_version), ""));
    }
    let api = daemon(conf)?;
    match pods(&api) {
        Ok(_) => {}
        Err(e @ CallError::Refused { .. }) => return Err(CniError::new(code::NOT_AVAILABLE, "the vectorlb daemon has no pods port", e.to_string())),
        Err(e) => {
            let e = failed(e);
            return Err(CniError::new(code::NOT_AVAILABLE, e.msg, e.details));
        }
    }
    if let Some(ipam_conf) = &conf.ipam {
        if ipam::speaks(env, ipam_conf, "1.1.0") {
            ipam::exec(env, conf, ipam_conf, "STATUS")?;
        }
    }
    Ok(())
}
