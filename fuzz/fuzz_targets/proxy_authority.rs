//! `vectorlb_proxy::route::one_authority` on request heads built from arbitrary bytes: a
//! version, a request target and up to three Host values (split at NUL bytes).
//!
//! It must never panic. On `Ok`, the request carries one authority as the proxy promises:
//! at most one Host (exactly one for HTTP/1.1), in canonical form (lower case, no trailing dot:
//! making one authority again changes nothing), and the host routing uses is its name.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&v, rest)) = data.split_first() else { return };
    let version = [hyper::Version::HTTP_10, hyper::Version::HTTP_11, hyper::Version::HTTP_2][v as usize % 3];
    let mut fields = rest.split(|b| *b == 0);
    let Some(target) = fields.next() else { return };
    let Ok(uri) = hyper::Uri::try_from(target) else { return };
    let mut b = hyper::Request::builder().uri(uri).version(version);
    for h in fields.take(3) {
        let Ok(h) = hyper::header::HeaderValue::from_bytes(h) else { return };
        b = b.header(hyper::header::HOST, h);
    }
    let Ok(req) = b.body(()) else { return };
    let (mut parts, _) = req.into_parts();
    let Ok(host) = vectorlb_proxy::route::one_authority(&mut parts) else { return };
    let hosts: Vec<_> = parts.headers.get_all(hyper::header::HOST).iter().collect();
    assert!(hosts.len() <= 1);
    if version == hyper::Version::HTTP_11 {
        assert_eq!(hosts.len(), 1);
    }
    if let Some(h) = hosts.first() {
        let v = h.to_str().expect("a canonical host is ASCII");
        assert_eq!(v, v.to_ascii_lowercase());
        let name = if v.starts_with('[') { &v[..v.find(']').expect("a bracketed literal") + 1] } else { v.split(':').next().unwrap_or(v) };
        assert!(!name.ends_with('.'));
        // The host routing uses is the name the result carries.
        assert_eq!(host.as_deref(), Some(name));
    }
    let mut again = parts.clone();
    assert_eq!(vectorlb_proxy::route::one_authority(&mut again), Ok(host));
    assert_eq!(again.headers.get(hyper::header::HOST), parts.headers.get(hyper::header::HOST));
});
