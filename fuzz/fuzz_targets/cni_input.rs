//! The CNI plugin's input (vectorlb-cni's `spec`): the network configuration on stdin, the
//! memif annotation, `CNI_ARGS`, and an IPAM result. Arbitrary bytes parse or give an error that
//! prints as the specification's JSON; nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_cni::spec::{add_result, memif_ports, result_ips, Env, NetConf, LATEST};

fuzz_target!(|data: &[u8]| {
    match NetConf::parse(data) {
        Ok(c) => {
            assert!(!c.name.is_empty() && c.name.len() <= 253);
            if let Some(prev) = &c.prev_result {
                let ips = result_ips(prev);
                let r = add_result(&c.cni_version, "eth0", "/var/run/netns/x", &ips, prev.get("dns"));
                assert!(r.get("ips").is_some());
            }
        }
        Err(e) => {
            let j = e.to_json(LATEST);
            assert!(j.get("code").is_some() && j.get("msg").is_some(), "{j}");
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(v) = memif_ports(s) {
            assert!(v.iter().all(|(_, a, b)| *a >= 1 && a <= b));
        }
        let env = Env { args: s.to_string(), ..Default::default() };
        let _ = env.arg("K8S_POD_NAME");
    }
});
