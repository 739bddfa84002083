//! The status page at `/`: one HTML document, a script and a style sheet, built into the
//! binary and served by the API's own listener (so behind its authentication). The script polls
//! the JSON API of the origin that served it; the Content-Security-Policy lets the page reach
//! nothing else, so it works without internet and cannot be made to leak elsewhere.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/status.js");
const STYLE: &str = include_str!("../ui/status.css");

/// Every resource from this origin, inline nothing, frames none.
pub const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// The page's routes, to merge into an API router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(index)).route("/ui/status.js", get(script)).route("/ui/status.css", get(style))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every URL the page's files name, by the attributes and calls that load something.
    fn references(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for pat in ["href=\"", "src=\"", "url(", "fetch(", "import ", "@import"] {
            let mut rest = text;
            while let Some(i) = rest.find(pat) {
                let tail = &rest[i + pat.len()..];
                out.push(tail.chars().take_while(|c| !matches!(c, '"' | ')' | ' ' | '\n')).collect());
                rest = tail;
            }
        }
        out
    }

    #[test]
    fn the_files_name_no_other_origin() {
        for (name, text) in [("index.html", INDEX), ("status.js", SCRIPT), ("status.css", STYLE)] {
            // (An empty reference is `fetch()` named in a comment.)
            for r in references(text).into_iter().filter(|r| !r.is_empty()) {
                let local = r.starts_with('/') && !r.starts_with("//") || r.starts_with("data:") || r.starts_with("location.origin");
                assert!(local, "{name} loads {r:?}, which is not this origin");
            }
            // No absolute URL anywhere but the SVG namespace name (an identifier, never fetched).
            for (i, _) in text.match_indices("://") {
                let around = &text[i.saturating_sub(10)..(i + 30).min(text.len())];
                assert!(around.contains("http://www.w3.org/2000/svg"), "{name} has an absolute URL near {around:?}");
            }
        }
        assert!(references(INDEX).iter().any(|r| r == "/ui/status.js"), "the parser finds the script");
    }
}
