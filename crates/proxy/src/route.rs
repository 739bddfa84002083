//! Route matching: the first route (in file order) whose listener, host, path prefix and header
//! all match the request.

use crate::config::{Match, Route};
use hyper::http::request::Parts;

/// The request's host, lower case, without port: the `:authority` of HTTP/2 and absolute
/// URIs, else the `Host` header.
pub fn host_of(p: &Parts) -> Option<String> {
    let raw = match p.uri.authority() {
        Some(a) => a.host().to_string(),
        None => {
            let h = p.headers.get(hyper::header::HOST)?.to_str().ok()?;
            // "[::1]:8080" -> "[::1]", "example.com:80" -> "example.com"
            match h.rfind(':') {
                Some(i) if !h[i..].contains(']') => h[..i].to_string(),
                _ => h.to_string(),
            }
        }
    };
    Some(raw.to_ascii_lowercase())
}

fn host_matches(want: &str, host: Option<&str>) -> bool {
    let Some(h) = host else { return false };
    match want.strip_prefix("*.") {
        Some(suffix) => h.len() > suffix.len() + 1 && h.ends_with(suffix) && h.as_bytes()[h.len() - suffix.len() - 1] == b'.',
        None => h == want,
    }
}

/// A string prefix of the path (`/api` matches `/api`, `/api/x` and `/apix`; a route that
/// means a whole segment ends its prefix with `/`).
fn path_matches(prefix: &str, path: &str) -> bool {
    path.starts_with(prefix)
}

pub fn matches(m: &Match, p: &Parts, host: Option<&str>) -> bool {
    if let Some(h) = &m.host {
        if !host_matches(h, host) {
            return false;
        }
    }
    if !path_matches(&m.path_prefix, p.uri.path()) {
        return false;
    }
    if let Some((name, value)) = &m.header {
        if !p.headers.get_all(name.as_str()).iter().any(|v| v.as_bytes() == value.as_bytes()) {
            return false;
        }
    }
    true
}

/// The index of the route a request on `listener` takes.
pub fn find(routes: &[Route], listener: &str, p: &Parts) -> Option<usize> {
    let host = host_of(p);
    routes.iter().position(|r| (r.listeners.is_empty() || r.listeners.iter().any(|l| l == listener)) && matches(&r.matches, p, host.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

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
        assert_eq!(host_of(&parts("/", &[("host", "[::1]:80")])).as_deref(), Some("[::1]"));
    }
}
