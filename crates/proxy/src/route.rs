//! Route matching: the first route (in file order) whose listener, host, path and headers all
//! match the request.

use crate::config::{Match, Route};
use hyper::http::request::Parts;

/// A host and port as a Host header or an authority carries them (RFC 9110 7.2 and RFC 3986
/// 3.2: a reg-name, an IPv4 address or a bracketed IPv6 literal; no userinfo).
#[derive(Debug, PartialEq, Eq)]
struct HostPort {
    host: String,
    port: Option<u16>,
}

fn host_port(v: &[u8]) -> Option<HostPort> {
    let v = std::str::from_utf8(v).ok()?;
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let end = rest.find(']')?;
        let (lit, after) = (&rest[..end], &rest[end + 1..]);
        if lit.is_empty() || !lit.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return None;
        }
        (&v[..end + 2], after)
    } else {
        match v.find(':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, ""),
        }
    };
    let port = match port {
        "" => None,
        p => {
            let digits = p.strip_prefix(':')?;
            if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(digits.parse::<u16>().ok()?)
        }
    };
    let host = if host.starts_with('[') { host.to_ascii_lowercase() } else { canonical_name(host)? };
    Some(HostPort { host, port })
}

/// A host name in the one form routing, certificates and upstreams compare (as DNS compares
/// names): lower case, one trailing dot removed (`Internal.Example.` is `internal.example`).
/// None for what is not a name of letters, digits, `-` and `_` in non-empty labels: a
/// percent-encoded or otherwise disguised name could match no route here and still mean a
/// protected host to an upstream that decodes it.
pub fn canonical_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.split('.').any(|label| label.is_empty() || !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')) {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

impl HostPort {
    /// What the upstream receives as Host: the canonical name, and the port if one was given.
    fn header(&self) -> Option<hyper::header::HeaderValue> {
        let v = match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        };
        hyper::header::HeaderValue::from_str(&v).ok()
    }
}

/// Gives the request one authority, in its Host header, which routing and the upstream then
/// see: the request target's authority when it has one (HTTP/2's `:authority`, HTTP/1.1's
/// absolute form, which wins over Host: RFC 9112 3.2.2), else Host; in canonical form
/// ([`canonical_name`]), so that `internal.example.` is routed and forwarded as
/// `internal.example`. A request that cannot have one is refused with the reason (a 400): two
/// Host headers, an HTTP/1.1 request without Host (RFC 9112 3.2), a Host that names another host
/// than `:authority` (RFC 9113 8.3.1), a Host or authority that is not host[:port], userinfo in
/// the authority.
/// On success, the host routing matches (canonical, without port), if the request has one.
pub fn one_authority(p: &mut Parts) -> Result<Option<String>, &'static str> {
    let mut all = p.headers.get_all(hyper::header::HOST).iter();
    let host = all.next();
    if all.next().is_some() {
        return Err("more than one Host header");
    }
    let host = match host {
        Some(h) => Some(host_port(h.as_bytes()).ok_or("the Host header is not host[:port]")?),
        None => None,
    };
    let target = match p.uri.authority() {
        Some(a) if a.as_str().contains('@') => return Err("userinfo in the request's authority"),
        Some(a) => Some(host_port(a.as_str().as_bytes()).ok_or("the request's authority is not host[:port]")?),
        None => None,
    };
    let default_port = if p.uri.scheme_str() == Some("https") { 443 } else { 80 };
    let one = match (p.version, target, host) {
        (hyper::Version::HTTP_11, _, None) => return Err("an HTTP/1.1 request without Host"),
        (hyper::Version::HTTP_2 | hyper::Version::HTTP_3, Some(t), Some(h)) if t.host != h.host || t.port.unwrap_or(default_port) != h.port.unwrap_or(default_port) => {
            return Err("the Host header names another host than :authority")
        }
        (_, Some(t), _) => t,
        (_, None, Some(h)) => h,
        (_, None, None) => return Ok(None),
    };
    p.headers.insert(hyper::header::HOST, one.header().ok_or("the request's authority is not host[:port]")?);
    Ok(Some(one.host))
}

fn host_matches(want: &str, host: Option<&str>) -> bool {
    let Some(h) = host else { return false };
    match want.strip_prefix("*.") {
        Some(suffix) => h.len() > suffix.len() + 1 && h.ends_with(suffix) && h.as_bytes()[h.len() - suffix.len() - 1] == b'.',
        None => h == want,
    }
}

pub fn matches(m: &Match, p: &Parts, host: Option<&str>) -> bool {
    if let Some(h) = &m.host {
        if !host_matches(h, host) {
            return false;
        }
    }
    if !m.path.matches(p.uri.path()) {
        return false;
    }
    m.headers.iter().all(|(name, value)| p.headers.get_all(name.as_str()).iter().any(|v| v.as_bytes() == value.as_bytes()))
}

/// The index of the route a request on `listener` takes (none for a request that cannot have
/// one authority).
pub fn find(routes: &[Route], listener: &str, p: &Parts) -> Option<usize> {
    let mut p = p.clone();
    let host = one_authority(&mut p).ok()?;
    find_for_host(routes, listener, &p, host.as_deref())
}

/// The index of the route a request on `listener` takes, its host already known (from
/// [`one_authority`]).
pub fn find_for_host(routes: &[Route], listener: &str, p: &Parts, host: Option<&str>) -> Option<usize> {
    routes.iter().position(|r| (r.listeners.is_empty() || r.listeners.iter().any(|l| l == listener)) && matches(&r.matches, p, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// As [`find`], an absolute target without Host taken as HTTP/2's `:authority`.
    fn find(routes: &[Route], listener: &str, p: &Parts) -> Option<usize> {
        let mut p = p.clone();
        if p.uri.authority().is_some() && !p.headers.contains_key("host") {
            p.version = hyper::Version::HTTP_2;
        }
        super::find(routes, listener, &p)
    }

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = hyper::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn first_matching_route_wins() {
        let c = Config::parse(
            r#"
[[listeners]]
name = "a"
address = "127.0.0.1:1"
[[listeners]]
name = "b"
address = "127.0.0.1:2"
[[routes]]
listeners = ["b"]
cluster = "c2"
[[routes]]
host = "*.example.com"
path_prefix = "/api/"
cluster = "c1"
[[routes]]
header = { name = "x-canary", value = "yes" }
cluster = "c1"
[[routes]]
host = "example.com"
cluster = "c0"
[[clusters]]
name = "c0"
endpoints = ["127.0.0.1:9"]
[[clusters]]
name = "c1"
endpoints = ["127.0.0.1:10"]
[[clusters]]
name = "c2"
endpoints = ["127.0.0.1:11"]
"#,
        )
        .unwrap();
        let r = &c.routes;
        let cl = |i: Option<usize>| {
            i.map(|i| match r[i].action {
                crate::config::Action::Cluster(c) => c,
                _ => usize::MAX,
            })
        };
        assert_eq!(cl(find(r, "b", &parts("/", &[("host", "x")]))), Some(2));
        assert_eq!(cl(find(r, "a", &parts("/api/v1", &[("host", "Www.Example.com:8080")]))), Some(1));
        assert_eq!(cl(find(r, "a", &parts("http://www.example.com/api/x", &[]))), Some(1), "HTTP/2 :authority");
        assert_eq!(cl(find(r, "a", &parts("/api/v1", &[("host", "example.com")]))), Some(0), "*.example.com is not example.com");
        assert_eq!(cl(find(r, "a", &parts("/api/v1", &[("host", "badexample.com")]))), None);
        assert_eq!(cl(find(r, "a", &parts("/", &[("host", "other"), ("x-canary", "no"), ("x-canary", "yes")]))), Some(1));
        assert_eq!(cl(find(r, "a", &parts("/", &[("host", "other")]))), None);
        assert_eq!(cl(find(r, "a", &parts("/", &[]))), None, "no host at all");
        // One trailing dot is the same name (as DNS has it); two are no name.
        assert_eq!(cl(find(r, "a", &parts("/api/v1", &[("host", "www.example.com.:8080")]))), Some(1));
        assert_eq!(cl(find(r, "a", &parts("/", &[("host", "EXAMPLE.COM.")]))), Some(0));
        assert_eq!(cl(find(r, "a", &parts("http://example.com./", &[]))), Some(0), "HTTP/2 :authority with a trailing dot");
        assert_eq!(cl(find(r, "a", &parts("/", &[("host", "example.com..")]))), None);
    }

    #[test]
    fn one_authority_per_request() {
        let req = |v: hyper::Version, uri: &str, hosts: &[&str]| {
            let mut b = hyper::Request::builder().uri(uri).version(v);
            for h in hosts {
                b = b.header("host", *h);
            }
            let mut p = b.body(()).unwrap().into_parts().0;
            let host = one_authority(&mut p);
            // The host for routing is the one forwarded, without its port.
            if let Ok(h) = &host {
                let sent = p.headers.get("host").map(|v| v.to_str().unwrap().to_string());
                let name = sent.as_deref().map(|s| if s.starts_with('[') { &s[..s.find(']').unwrap() + 1] } else { s.split(':').next().unwrap() });
                assert_eq!(h.as_deref(), name, "{uri} {hosts:?}");
            }
            host.map(|_| p.headers.get_all("host").iter().map(|h| h.to_str().unwrap().to_string()).collect::<Vec<_>>())
        };
        use hyper::Version as V;
        // The absolute form wins over Host, and is what follows.
        assert_eq!(req(V::HTTP_11, "http://public.example/a", &["internal.example"]), Ok(vec!["public.example".into()]));
        assert_eq!(req(V::HTTP_11, "/a", &["Public.Example:8080"]), Ok(vec!["public.example:8080".into()]));
        assert_eq!(req(V::HTTP_11, "/a", &["Internal.Example."]), Ok(vec!["internal.example".into()]));
        assert_eq!(req(V::HTTP_11, "http://internal.example.:81/a", &["x"]), Ok(vec!["internal.example:81".into()]));
        assert_eq!(req(V::HTTP_2, "http://internal.example./a", &["internal.example"]), Ok(vec!["internal.example".into()]));
        assert_eq!(req(V::HTTP_11, "/a", &["[::1]:80"]), Ok(vec!["[::1]:80".into()]));
        assert_eq!(req(V::HTTP_10, "/a", &[]), Ok(vec![]));
        assert_eq!(req(V::HTTP_2, "http://public.example/a", &[]), Ok(vec!["public.example".into()]));
        assert_eq!(req(V::HTTP_2, "https://public.example/a", &["PUBLIC.example:443"]), Ok(vec!["public.example".into()]));
        assert_eq!(req(V::HTTP_2, "/a", &["public.example"]), Ok(vec!["public.example".into()]));
        for (v, uri, hosts, why) in [
            (V::HTTP_11, "/a", &["a.example", "b.example"][..], "more than one Host"),
            (V::HTTP_11, "/a", &["a.example", "a.example"][..], "more than one Host"),
            (V::HTTP_11, "/a", &[][..], "without Host"),
            (V::HTTP_11, "http://public.example/a", &[][..], "without Host"),
            (V::HTTP_11, "/a", &["public.example/x"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["public.example:99999"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["public.example:"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["pub lic"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["[zz]"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["internal.example.."][..], "not host[:port]"),
            (V::HTTP_11, "/a", &[".internal.example"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["internal%2eexample"][..], "not host[:port]"),
            (V::HTTP_11, "/a", &["."][..], "not host[:port]"),
            (V::HTTP_11, "http://user@public.example/a", &["public.example"][..], "userinfo"),
            (V::HTTP_2, "http://public.example/a", &["internal.example"][..], "another host than :authority"),
            (V::HTTP_2, "http://public.example:8080/a", &["public.example"][..], "another host than :authority"),
        ] {
            let e = req(v, uri, hosts).expect_err(why);
            assert!(e.contains(why), "{uri} {hosts:?}: {e}");
        }
    }
}
