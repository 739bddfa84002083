//! What the CNI specification fixes: the versions this plugin speaks, the environment, the
//! network configuration it reads, its errors (codes and JSON) and the result it prints in the
//! version the configuration asked for.

use serde_json::{json, Map, Value};

/// Versions of the specification this plugin speaks (ADD, DEL, CHECK in all; GC and STATUS
/// from 1.1.0).
pub const SUPPORTED: [&str; 6] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.1"];
pub const LATEST: &str = "1.1.0";

/// The specification's error codes.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
}

/// An error as the specification prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError { code, msg: msg.into(), details: details.into() }
    }

    pub fn to_json(&self, version: &str) -> Value {
        let mut v = json!({ "cniVersion": version, "code": self.code, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

/// Whether `v` is a version this plugin speaks.
pub fn supported(v: &str) -> bool {
    SUPPORTED.contains(&v)
}

/// `a` is at least `b` (versions `MAJOR.MINOR[.PATCH]`; anything else is older).
pub fn at_least(a: &str, b: &str) -> bool {
    let parse = |s: &str| -> Option<(u32, u32, u32)> {
        let mut it = s.split('.');
        let maj = it.next()?.parse().ok()?;
        let min = it.next()?.parse().ok()?;
        let pat = it.next().map_or(Some(0), |p| p.parse().ok())?;
        it.next().is_none().then_some((maj, min, pat))
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x >= y,
        _ => false,
    }
}

/// The plugin's part of a network configuration.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: String,
    /// The network's name: recorded with each attachment, so that GC touches its own only.
    pub name: String,
    /// The daemon's API (`unix:PATH` or `ADDRESS:PORT`).
    pub api: String,
    /// A file holding the API's bearer token (TCP APIs).
    pub api_token_file: Option<String>,
    /// The pods' MTU (default: the pods port's).
    pub mtu: Option<u16>,
    /// The IPAM plugin's section (its `type` names the plugin).
    pub ipam: Option<Map<String, Value>>,
    pub prev_result: Option<Value>,
    /// GC: the attachments the runtime still has (`cni.dev/valid-attachments`).
    pub valid_attachments: Option<Vec<(String, String)>>,
    /// The pod's memif ports (its annotation [`MEMIF_ANNOTATION`], which the runtime passes
    /// in `runtimeConfig` when the configuration asks for the capability [`ANNOTATIONS_CAP`]):
    /// For the daemon's `NewPod`.
    pub memif_ports: Vec<MemifPorts>,
    /// The pod's host ports (`runtimeConfig.portMappings`, passed when the configuration asks
    /// for the capability [`PORT_MAPPINGS_CAP`]).
    pub host_ports: Vec<HostPort>,
    /// Why `runtimeConfig.portMappings` could not be read: refused by ADD (CHECK), ignored by
    /// DEL and GC, which must clean up whatever the runtime passes.
    pub host_ports_error: Option<String>,
    /// The whole configuration, as given (passed on to the IPAM plugin).
    pub raw: Value,
}

/// The capability under which runtimes pass a pod's host ports.
pub const PORT_MAPPINGS_CAP: &str = "portMappings";

/// `runtimeConfig.portMappings`: `[{"hostPort", "containerPort", "protocol", "hostIP"}]`
/// (protocol `tcp` by default, in any case; hostIP optional, empty for none). Keys in any case,
/// as Go's JSON decoding takes them: containerd passes `HostPort`, `ContainerPort`, ...
pub fn port_mappings(v: &Value) -> Result<Vec<HostPort>, String> {
    let Some(a) = v.as_array() else { return Err("not an array".into()) };
    if a.len() > MAX_HOST_PORTS {
        return Err(format!("{} of them; at most {MAX_HOST_PORTS}", a.len()));
    }
    let mut out = Vec::with_capacity(a.len());
    for (i, m) in a.iter().enumerate() {
        let Some(o) = m.as_object() else { return Err(format!("[{i}]: not an object")) };
        let get = |k: &str| o.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v);
        let port = |k: &str| get(k).and_then(Value::as_u64).filter(|p| (1..=65535).contains(p)).map(|p| p as u16).ok_or_else(|| format!("[{i}].{k}: not a port (1..=65535)"));
        let proto = match get("protocol") {
            None | Some(Value::Null) => "tcp".to_string(),
            Some(Value::String(p)) => p.to_ascii_lowercase(),
            Some(_) => return Err(format!("[{i}].protocol: not a string")),
        };
        if proto != "tcp" && proto != "udp" {
            return Err(format!("[{i}].protocol: '{}': only tcp and udp host ports", proto.escape_debug()));
        }
        let host_ip = match get("hostIP") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.parse().map_err(|_| format!("[{i}].hostIP: '{}' is not an IP address", s.escape_debug()))?),
            Some(_) => return Err(format!("[{i}].hostIP: not a string")),
        };
        out.push(HostPort { proto, host_port: port("hostPort")?, container_port: port("containerPort")?, host_ip });
    }
    Ok(out)
}

/// The capability under which containerd and CRI-O pass a pod's annotations.
pub const ANNOTATIONS_CAP: &str = "io.kubernetes.cri.pod-annotations";
/// The pod annotation that asks for a memif: `tcp:4444-20000,udp:5353` (ranges or single
/// ports, at most [`MAX_MEMIF_RANGES`]).
pub const MEMIF_ANNOTATION: &str = "vectorlb.io/memif-ports";
pub use vectorlb_wire::model::MAX_MEMIF_RANGES;
use vectorlb_wire::model::{HostPort, MemifPorts, MAX_HOST_PORTS};

/// Parses the memif annotation's value into (protocol, first, last) ranges.
pub fn memif_ports(v: &str) -> Result<Vec<(&'static str, u16, u16)>, String> {
    let mut out = Vec::new();
    for (i, item) in v.split(',').map(str::trim).enumerate() {
        let bad = |why: &str| format!("{MEMIF_ANNOTATION}: item {} '{}': {why}", i + 1, item.escape_debug());
        let Some((proto, ports)) = item.split_once(':') else { return Err(bad("not PROTO:PORT or PROTO:FIRST-LAST")) };
        let proto = match proto.trim() {
            "tcp" => "tcp",
            "udp" => "udp",
            _ => return Err(bad("the protocol is tcp or udp")),
        };
        let port = |s: &str| s.trim().parse::<u16>().ok().filter(|p| *p != 0);
        let (first, last) = match ports.split_once('-') {
            Some((a, b)) => (port(a), port(b)),
            None => (port(ports), port(ports)),
        };
        let (Some(first), Some(last)) = (first, last) else { return Err(bad("ports are 1..=65535")) };
        if first > last {
            return Err(bad("the first port is above the last"));
        }
        out.push((proto, first, last));
        if out.len() > MAX_MEMIF_RANGES {
            return Err(format!("{MEMIF_ANNOTATION}: more than {MAX_MEMIF_RANGES} ranges"));
        }
    }
    Ok(out)
}

pub const DEFAULT_API: &str = "unix:/run/vectorlb/api.sock";

impl NetConf {
    /// Parses and checks the configuration from stdin.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, CniError> {
        if bytes.len() > 1 << 20 {
            return Err(CniError::new(code::DECODE, "the network configuration is larger than 1 MiB", ""));
        }
        let raw: Value = serde_json::from_slice(bytes).map_err(|e| CniError::new(code::DECODE, "the network configuration is not JSON", e.to_string()))?;
        let Some(o) = raw.as_object() else {
            return Err(CniError::new(code::DECODE, "the network configuration is not a JSON object", ""));
        };
        let s = |k: &str| -> Result<Option<String>, CniError> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(CniError::new(code::INVALID_CONFIG, format!("{k}: not a string"), "")),
            }
        };
        let cni_version = s("cniVersion")?.ok_or_else(|| CniError::new(code::INVALID_CONFIG, "cniVersion: missing", ""))?;
        if !supported(&cni_version) {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("incompatible CNI versions: the configuration is {cni_version}"),
                format!("this plugin supports {}", SUPPORTED.join(", ")),
            ));
        }
        let name = s("name")?.filter(|n| !n.is_empty()).ok_or_else(|| CniError::new(code::INVALID_CONFIG, "name: missing (the network's name)", ""))?;
        if name.len() > 253 || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(CniError::new(code::INVALID_CONFIG, format!("name: '{}' is not a network name (1 to 253 printable characters)", name.escape_debug()), ""));
        }
        let api = s("api")?.unwrap_or_else(|| DEFAULT_API.into());
        if api.parse::<vectorlb_wire::call::Target>().is_err() {
            return Err(CniError::new(code::INVALID_CONFIG, format!("api: '{api}' is not unix:PATH or ADDRESS:PORT"), ""));
        }
        let mtu = match o.get("mtu") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(m) if (576..=9216).contains(&m) => Some(m as u16),
                _ => return Err(CniError::new(code::INVALID_CONFIG, format!("mtu: {v} is out of range 576..=9216"), "")),
            },
        };
        let ipam = match o.get("ipam") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => {
                match m.get("type") {
                    Some(Value::String(t)) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => {}
                    _ => return Err(CniError::new(code::INVALID_CONFIG, "ipam.type: missing, or not a plugin name", "")),
                }
                Some(m.clone())
            }
            Some(_) => return Err(CniError::new(code::INVALID_CONFIG, "ipam: not an object", "")),
        };
        // GC: the attachments to keep. libcni sends `null` when its caller gave none (cnitool's
        // gc: everything is a leftover).
        let valid_attachments = match o.get("cni.dev/valid-attachments") {
            None => None,
            Some(Value::Null) => Some(Vec::new()),
            Some(Value::Array(a)) => {
                let mut v = Vec::new();
                for x in a {
                    let (Some(id), Some(ifname)) = (x.get("containerID").and_then(Value::as_str), x.get("ifname").and_then(Value::as_str)) else {
                        return Err(CniError::new(code::INVALID_CONFIG, "cni.dev/valid-attachments: each needs containerID and ifname", ""));
                    };
                    v.push((id.to_string(), ifname.to_string()));
                }
                Some(v)
            }
            Some(_) => return Err(CniError::new(code::INVALID_CONFIG, "cni.dev/valid-attachments: not an array", "")),
        };
        let memif = o.get("runtimeConfig").and_then(|r| r.get(ANNOTATIONS_CAP)).and_then(|a| a.get(MEMIF_ANNOTATION));
        let memif_ports = match memif {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(v)) => memif_ports(v)
                .map_err(|e| CniError::new(code::INVALID_CONFIG, "the pod's memif annotation is invalid", e))?
                .into_iter()
                .map(|(proto, first, last)| MemifPorts { proto: proto.into(), first, last })
                .collect(),
            Some(_) => return Err(CniError::new(code::INVALID_CONFIG, format!("{MEMIF_ANNOTATION}: not a string"), "")),
        };
        let (host_ports, host_ports_error) = match o.get("runtimeConfig").and_then(|r| r.get(PORT_MAPPINGS_CAP)) {
            None | Some(Value::Null) => (Vec::new(), None),
            Some(v) => match port_mappings(v) {
                Ok(h) => (h, None),
                Err(e) => (Vec::new(), Some(e)),
            },
        };
        Ok(NetConf {
            cni_version,
            name,
            memif_ports,
            host_ports,
            host_ports_error,
            api,
            api_token_file: s("api_token_file")?,
            mtu,
            ipam,
            prev_result: o.get("prevResult").filter(|v| !v.is_null()).cloned(),
            valid_attachments,
            raw,
        })
    }
}

/// The runtime's environment for one call.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

impl Env {
    pub fn from_env() -> Env {
        let v = |k: &str| std::env::var(k).unwrap_or_default();
        Env { command: v("CNI_COMMAND"), container_id: v("CNI_CONTAINERID"), netns: v("CNI_NETNS"), ifname: v("CNI_IFNAME"), args: v("CNI_ARGS"), path: v("CNI_PATH") }
    }

    /// Checks what `command` needs (the specification's list per command).
    pub fn require(&self, netns: bool) -> Result<(), CniError> {
        let missing = |k: &str| CniError::new(code::INVALID_ENV, format!("{k}: missing"), "");
        if self.container_id.is_empty() {
            return Err(missing("CNI_CONTAINERID"));
        }
        if self.ifname.is_empty() {
            return Err(missing("CNI_IFNAME"));
        }
        if netns && self.netns.is_empty() {
            return Err(missing("CNI_NETNS"));
        }
        if self.path.is_empty() {
            return Err(missing("CNI_PATH"));
        }
        Ok(())
    }

    /// A `K=V;K=V` argument (`K8S_POD_NAME`, ...).
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args.split(';').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
    }
}

/// The addresses of an IPAM result (any version): `ADDR/LEN` strings.
pub fn result_ips(result: &Value) -> Vec<String> {
    result.get("ips").and_then(Value::as_array).map(|a| a.iter().filter_map(|i| i.get("address")?.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// The result of ADD in `version`: the pod's interface, its addresses (host addresses, as
/// configured), default routes through the interface, and the IPAM plugin's DNS.
pub fn add_result(version: &str, ifname: &str, netns: &str, ips: &[String], dns: Option<&Value>) -> Value {
    let old = !at_least(version, "1.0.0");
    let ips: Vec<Value> = ips
        .iter()
        .map(|a| {
            let addr = a.split_once('/').map_or(a.as_str(), |(a, _)| a);
            let v6 = addr.contains(':');
            let mut o = json!({ "address": format!("{addr}/{}", if v6 { 128 } else { 32 }), "interface": 0 });
            if old {
                o["version"] = Value::String(if v6 { "6" } else { "4" }.into());
            }
            o
        })
        .collect();
    let mut routes = Vec::new();
    if ips.iter().any(|i| !i["address"].as_str().unwrap_or("").contains(':')) {
        routes.push(json!({ "dst": "0.0.0.0/0" }));
    }
    if ips.iter().any(|i| i["address"].as_str().unwrap_or("").contains(':')) {
        routes.push(json!({ "dst": "::/0" }));
    }
    let mut r = json!({
        "cniVersion": version,
        "interfaces": [{ "name": ifname, "sandbox": netns }],
        "ips": ips,
        "routes": routes,
    });
    if let Some(d) = dns {
        r["dns"] = d.clone();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_number() {
        assert!(at_least("1.1.0", "1.0.0"));
        assert!(at_least("1.1", "1.1.0"));
        assert!(!at_least("0.4.0", "1.0.0"));
        assert!(!at_least("banana", "0.1.0"));
        assert!(!at_least("1.0.0.0", "0.1.0"));
    }

    #[test]
    fn configurations_are_checked_with_the_specifications_codes() {
        let bad = |s: &str| NetConf::parse(s.as_bytes()).unwrap_err().code;
        assert_eq!(bad("{"), code::DECODE);
        assert_eq!(bad("[1]"), code::DECODE);
        assert_eq!(bad(r#"{"name":"x"}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"9.9.9","name":"x"}"#), code::INCOMPATIBLE_VERSION);
        assert_eq!(bad(r#"{"cniVersion":1,"name":"x"}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"1.1.0"}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"1.1.0","name":"p","api":"nowhere"}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"1.1.0","name":"p","mtu":70000}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"1.1.0","name":"p","ipam":{"type":"../x"}}"#), code::INVALID_CONFIG);
        assert_eq!(bad(r#"{"cniVersion":"1.1.0","name":"p","cni.dev/valid-attachments":[{"ifname":"eth0"}]}"#), code::INVALID_CONFIG);
        let c = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"p","ipam":{"type":"host-local"},"mtu":1400}"#).unwrap();
        assert_eq!((c.api.as_str(), c.mtu, c.ipam.is_some()), (DEFAULT_API, Some(1400), true));
    }

    #[test]
    fn the_memif_annotation_is_checked() {
        assert_eq!(memif_ports("tcp:4444-20000, udp:5353").unwrap(), vec![("tcp", 4444, 20000), ("udp", 5353, 5353)]);
        for bad in ["", "tcp", "sctp:1-2", "tcp:0-10", "tcp:20-10", "udp:1-70000", "tcp:-5", "tcp:a-b", "tcp:1-2,", "tcp:1--2"] {
            assert!(memif_ports(bad).is_err(), "{bad:?}");
        }
        let many = vec!["tcp:1"; MAX_MEMIF_RANGES + 1].join(",");
        assert!(memif_ports(&many).unwrap_err().contains("more than"));
        let conf = |v: &str| format!(r#"{{"cniVersion":"1.1.0","name":"p","runtimeConfig":{{"{ANNOTATIONS_CAP}":{{"{MEMIF_ANNOTATION}":{v}}}}}}}"#);
        let c = NetConf::parse(conf("\"udp:5000-5001\"").as_bytes()).unwrap();
        assert_eq!(c.memif_ports, vec![MemifPorts { proto: "udp".into(), first: 5000, last: 5001 }]);
        for bad in ["\"tcp:9-1\"", "5", "\"tcp:1-99999\""] {
            assert_eq!(NetConf::parse(conf(bad).as_bytes()).unwrap_err().code, code::INVALID_CONFIG, "{bad}");
        }
        let none = NetConf::parse(br#"{"cniVersion":"1.1.0","name":"p","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"other":"x"}}}"#).unwrap();
        assert!(none.memif_ports.is_empty());
    }

    #[test]
    fn results_follow_the_asked_version() {
        let r = add_result("0.3.1", "eth0", "/ns", &["10.1.0.5/24".into(), "fd00::5/64".into()], None);
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["ips"][0]["address"], "10.1.0.5/32");
        assert_eq!(r["ips"][1]["address"], "fd00::5/128");
        assert_eq!(r["routes"].as_array().unwrap().len(), 2);
        let r = add_result("1.1.0", "eth0", "/ns", &["10.1.0.5/24".into()], None);
        assert!(r["ips"][0].get("version").is_none());
        assert_eq!(r["routes"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn port_mappings_are_read_and_checked() {
        let conf = |v: &str| NetConf::parse(format!(r#"{{"cniVersion":"1.1.0","name":"p","runtimeConfig":{{"portMappings":{v}}}}}"#).as_bytes());
        // containerd's keys are Go's field names (HostPort, ...): any case is taken.
        let c = conf(r#"[{"hostPort":54323,"containerPort":8080,"protocol":"tcp","hostIP":"127.0.0.1"},{"HostPort":53,"ContainerPort":5353,"Protocol":"UDP","HostIP":""},{"hostPort":80,"containerPort":80}]"#).unwrap();
        let got: Vec<(String, u16, u16, Option<std::net::IpAddr>)> = c.host_ports.iter().map(|h| (h.proto.clone(), h.host_port, h.container_port, h.host_ip)).collect();
        assert_eq!(got, [("tcp".into(), 54323, 8080, Some("127.0.0.1".parse().unwrap())), ("udp".into(), 53, 5353, None), ("tcp".into(), 80, 80, None)]);
        assert!(NetConf::parse(br#"{"cniVersion":"1.1.0","name":"p"}"#).unwrap().host_ports.is_empty());
        for bad in [
            r#"{}"#,
            r#"[{"hostPort":0,"containerPort":80}]"#,
            r#"[{"hostPort":70000,"containerPort":80}]"#,
            r#"[{"hostPort":80,"containerPort":80,"protocol":"sctp"}]"#,
            r#"[{"hostPort":80,"containerPort":80,"hostIP":"nope"}]"#,
            r#"[{"hostPort":80}]"#,
        ] {
            // Read (DEL must clean up whatever it is given), refused by ADD.
            let c = conf(bad).unwrap();
            assert!(c.host_ports.is_empty() && c.host_ports_error.is_some(), "{bad}");
        }
        let many = format!("[{}]", vec![r#"{"hostPort":80,"containerPort":80}"#; MAX_HOST_PORTS + 1].join(","));
        assert!(conf(&many).unwrap().host_ports_error.unwrap().contains("at most"));
    }

    #[test]
    fn cni_args_are_read_by_key() {
        let e = Env { args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0".into(), ..Default::default() };
        assert_eq!(e.arg("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(e.arg("K8S_POD_UID"), None);
    }
}
