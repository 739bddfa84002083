//! `vectorlb_proxy::route::one_authority` on request heads built from arbitrary bytes: a
//! version, a request target and up to three Host values (split at NUL bytes).
//!
//! It must never panic. On `Ok`, the request carries one authority as the proxy promises:
//! at most one Host (exactly one for HTTP/1.1), equal to the target's authority when the target
//! has one, and the host routing uses is the one the result carries.
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
    if let Some(a) = parts.uri.authority() {
        assert_eq!(hosts.first().map(|h| h.as_bytes()), Some(a.as_str().as_bytes()));
    }
    // The host routing uses is the one the result carries.
    assert_eq!(host, vectorlb_proxy::route::host_of(&parts));
});
