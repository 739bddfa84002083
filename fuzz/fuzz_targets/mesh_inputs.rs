//! What a mesh node reads from others: SPIFFE IDs (certificates' URI SANs), `Forwarded`
//! headers of tunnel requests, AuthorizationPolicy specs (JSON from the API server) and
//! certificate signing requests (PEM from nodes). The first byte picks which.
//!
//! Never panics. A SPIFFE ID that parses prints back to the same text; a policy that compiles
//! decides a connection without panicking; a signing request is signed or refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};
use vectorlb_proxy::mesh::{authz, ca, hbone, identity::SpiffeId};

static CA: OnceLock<ca::Authority> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    match which % 4 {
        0 => {
            if let Ok(id) = text.parse::<SpiffeId>() {
                assert_eq!(id.to_string(), text);
                assert_eq!(id.to_string().parse::<SpiffeId>().unwrap(), id);
            }
        }
        1 => {
            let _ = hbone::forwarded_for(&text);
        }
        2 => {
            let Ok(spec) = serde_json::from_slice::<serde_json::Value>(rest) else { return };
            let Ok(Ok(p)) = authz::Policy::compile("ns", "p", &spec) else { return };
            let src: SpiffeId = "spiffe://cluster.local/ns/ns/sa/web".parse().unwrap();
            let labels = std::collections::BTreeMap::from([("app".to_string(), "db".to_string())]);
            let a = authz::Authz::new("root", vec![p]);
            for source in [Some(&src), None] {
                let _ = a.check(&authz::Request { source, source_ip: "10.0.0.1".parse().unwrap(), dest_ip: "10.0.0.2".parse().unwrap(), dest_port: 80, dest_namespace: "ns", dest_labels: &labels });
            }
        }
        _ => {
            let ca = CA.get_or_init(|| ca::Authority::generate("cluster.local", Duration::from_secs(86_400)).unwrap());
            let id: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
            if let Ok(cert) = ca.sign_request(&id, rest, Duration::from_secs(3600), SystemTime::now()) {
                assert_eq!(ca::svid_id(&cert).unwrap(), id);
            }
        }
    }
});
