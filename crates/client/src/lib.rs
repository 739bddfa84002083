//! The one HTTP client of vectorlb, on hyper: `vectorlb ctl` talks to the control API with it,
//! the daemon's health checks ask backends with it (plain or TLS), and the test tools' probes
//! load services with it. One connection per request, a connect timeout and an overall
//! deadline, a bounded response body; a server is never trusted to end its answer.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};

pub use hyper::{Method, StatusCode, Version};

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp(SocketAddr),
    /// A unix stream socket (the control API's `unix:PATH`).
    Unix(PathBuf),
}

impl std::str::FromStr for Target {
    type Err = Error;
    /// `ADDRESS:PORT` or `unix:PATH`.
    fn from_str(s: &str) -> Result<Target, Error> {
        match s.strip_prefix("unix:") {
            Some(p) if !p.is_empty() => Ok(Target::Unix(PathBuf::from(p))),
            _ => s.parse().map(Target::Tcp).map_err(|_| Error::BadTarget(s.to_string())),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("'{0}' is not ADDRESS:PORT or unix:PATH")]
    BadTarget(String),
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("connect: timed out after {0:?}")]
    ConnectTimeout(Duration),
    #[error("tls: {0}")]
    Tls(String),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the answer's body is larger than {0} bytes")]
    BodyTooLarge(usize),
    #[error("invalid request: {0}")]
    Request(String),
    #[error("cannot start an async runtime: {0}")]
    Runtime(std::io::Error),
}

/// How to make a request.
#[derive(Debug, Clone)]
pub struct Options {
    pub connect_timeout: Duration,
    /// Deadline for the whole exchange, connect included.
    pub timeout: Duration,
    /// TLS without verifying the server's certificate (a health check asks whether a backend
    /// serves, not who it is, as keepalived's SSL_GET does); `None`: plain text.
    pub tls_server_name: Option<String>,
    pub version: Version,
    /// Larger response bodies are an error.
    pub max_body: usize,
    /// Read the body; `false` returns once the status and headers are in (health checks
    /// decide on the status, whatever the page's size).
    pub read_body: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(3),
            timeout: Duration::from_secs(10),
            tls_server_name: None,
            version: Version::HTTP_11,
            max_body: 16 * 1024 * 1024,
            read_body: true,
        }
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
    /// From the start of the request to the end of the body.
    pub elapsed: Duration,
}

/// A request: method, path (with query), Host header, optional JSON body.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub host: String,
    pub body: Option<Vec<u8>>,
    pub content_type: &'static str,
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer: Option<String>,
}

impl Request {
    pub fn get(path: impl Into<String>, host: impl Into<String>) -> Request {
        Request { method: Method::GET, path: path.into(), host: host.into(), body: None, content_type: "application/json", bearer: None }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

async fn connect(target: &Target, o: &Options) -> Result<Box<dyn Io>, Error> {
    let t = o.connect_timeout;
    let io: Box<dyn Io> = match target {
        Target::Tcp(a) => {
            let s = tokio::time::timeout(t, tokio::net::TcpStream::connect(a)).await.map_err(|_| Error::ConnectTimeout(t))?.map_err(Error::Connect)?;
            let _ = s.set_nodelay(true);
            Box::new(s)
        }
        Target::Unix(p) => Box::new(tokio::time::timeout(t, tokio::net::UnixStream::connect(p)).await.map_err(|_| Error::ConnectTimeout(t))?.map_err(Error::Connect)?),
    };
    match &o.tls_server_name {
        None => Ok(io),
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|_| Error::Tls(format!("'{name}' is not a server name")))?;
            let tls = tokio_rustls::TlsConnector::from(tls::no_verify()).connect(name, io).await.map_err(|e| Error::Tls(e.to_string()))?;
            Ok(Box::new(tls))
        }
    }
}

/// Makes one request on a new connection.
pub async fn request(target: &Target, r: &Request, o: &Options) -> Result<Response, Error> {
    let start = Instant::now();
    tokio::time::timeout(o.timeout, exchange(target, r, o, start)).await.map_err(|_| Error::Timeout(o.timeout))?
}

async fn exchange(target: &Target, r: &Request, o: &Options, start: Instant) -> Result<Response, Error> {
    let io = connect(target, o).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let body = r.body.clone().unwrap_or_default();
    let mut req =
        hyper::Request::builder().method(r.method.clone()).uri(&r.path).version(o.version).body(Full::new(Bytes::from(body.clone()))).map_err(|e| Error::Request(e.to_string()))?;
    let h = req.headers_mut();
    h.insert(HOST, HeaderValue::from_str(&r.host).map_err(|_| Error::Request(format!("host '{}'", r.host)))?);
    h.insert(USER_AGENT, HeaderValue::from_static(concat!("vectorlb/", env!("CARGO_PKG_VERSION"))));
    if let Some(t) = &r.bearer {
        h.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| Error::Request("the token is not a header value".into()))?);
    }
    if r.body.is_some() {
        h.insert(CONTENT_TYPE, HeaderValue::from_static(r.content_type));
        h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let res = send.send_request(req).await?;
    let (parts, body) = res.into_parts();
    let body = if o.read_body {
        Limited::new(body, o.max_body)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => Error::Http(*e),
                Err(_) => Error::BodyTooLarge(o.max_body),
            })?
            .to_bytes()
    } else {
        Bytes::new()
    };
    driver.abort();
    Ok(Response { status: parts.status, headers: parts.headers, body, elapsed: start.elapsed() })
}

/// [`request`] from synchronous code (the CLI), on a runtime of its own.
pub fn request_blocking(target: &Target, r: &Request, o: &Options) -> Result<Response, Error> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
    rt.block_on(request(target, r, o))
}

mod tls {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use std::sync::{Arc, OnceLock};

    /// Accepts any certificate; still checks the handshake's signatures.
    #[derive(Debug)]
    struct AnyCert(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCert {
        fn verify_server_cert(&self, _: &CertificateDer<'_>, _: &[CertificateDer<'_>], _: &ServerName<'_>, _: &[u8], _: UnixTime) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn verify_tls13_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    pub fn no_verify() -> Arc<rustls::ClientConfig> {
        static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        CONFIG
            .get_or_init(|| {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .expect("the ring provider supports TLS 1.2 and 1.3")
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
                    .with_no_client_auth();
                Arc::new(cfg)
            })
            .clone()
    }
}

/// Standard base64 (RFC 4648, padding optional); None for anything else.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // A single leftover character (6 bits) cannot be the end of a valid encoding.
    (bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn server(answer: &'static [u8]) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    let _ = s.read(&mut b).await;
                    let _ = s.write_all(answer).await;
                    // Hold the connection open: the client must not wait for the close.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        a
    }

    #[tokio::test]
    async fn answers_errors_and_deadlines() {
        let ok = server(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nhi").await;
        let r = request(&Target::Tcp(ok), &Request::get("/x", "h"), &Options::default()).await.unwrap();
        assert_eq!((r.status.as_u16(), &r.body[..]), (201, &b"hi"[..]));
        // A server that never ends its body hits the deadline instead of hanging the caller.
        let slow = server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc").await;
        let o = Options { timeout: Duration::from_millis(200), ..Default::default() };
        assert!(matches!(request(&Target::Tcp(slow), &Request::get("/", "h"), &o).await, Err(Error::Timeout(_))));
        let big = server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789").await;
        let o = Options { max_body: 4, ..Default::default() };
        assert!(matches!(request(&Target::Tcp(big), &Request::get("/", "h"), &o).await, Err(Error::BodyTooLarge(4))));
        // Without the body, the status is all there is to wait for.
        let o = Options { read_body: false, timeout: Duration::from_millis(200), ..Default::default() };
        let r = request(&Target::Tcp(slow), &Request::get("/", "h"), &o).await.unwrap();
        assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        assert!(matches!(request(&Target::Tcp(closed), &Request::get("/", "h"), &Options::default()).await, Err(Error::Connect(_))));
        assert!("nowhere".parse::<Target>().is_err());
        assert_eq!("unix:/run/x".parse::<Target>().unwrap(), Target::Unix("/run/x".into()));
    }

    #[test]
    fn base64_decodes_rfc4648_vectors_and_refuses_garbage() {
        for (enc, dec) in [("", ""), ("Zg==", "f"), ("Zm8=", "fo"), ("Zm9v", "foo"), ("Zm9vYg==", "foob"), ("Zm9vYmE=", "fooba"), ("Zm9vYmFy", "foobar"), ("Zm9vYg", "foob")] {
            assert_eq!(base64_decode(enc).as_deref(), Some(dec.as_bytes()), "{enc}");
        }
        for bad in ["Z", "Zm9vY", "Zm 9v", "Zm9v!", "é"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
}
