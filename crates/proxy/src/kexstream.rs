//! The client's side of a TLS handshake read one record ahead of BoringSSL, so that the X25519
//! shared secret can be computed in a batch of eight before BoringSSL asks for it
//! ([`crate::keyshare`]).
//!
//! Until the key exchange is over, [`KexStream`] reads the client's bytes into its own buffer
//! and hands BoringSSL only whole records it has looked at. A record that carries the client's
//! X25519 key in plaintext, TLS 1.2's ClientKeyExchange or (where the listener allows TLS 1.3)
//! the ClientHello's key share, is held back while its secret waits in the worker's queue; then
//! it goes to BoringSSL, whose `X25519` call finds the secret. At the first record that is not a
//! handshake record (ChangeCipherSpec, application data, an alert) or one it cannot size, the
//! stream stops looking and passes everything through; so it does when the batches are off.
//!
//! Nothing here trusts the client: a record is looked at only once it is whole (at most one
//! record of 18 KB and a read ahead are held), lengths are checked before every slice, and a
//! message it does not understand is simply passed on for BoringSSL to judge. Holding a record
//! back delays it by at most `poll_delay`; the handshake's own timeout still bounds the rest.

use crate::keyshare::{self, Slot};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// A client key the server can use ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// TLS 1.2's ClientKeyExchange with a 32-byte ECDHE key (X25519 by its size).
    ClientKeyExchange([u8; 32]),
    /// The X25519 key share of a ClientHello that offers TLS 1.3.
    KeyShare([u8; 32]),
}

const CONTENT_HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const CLIENT_KEY_EXCHANGE: u8 = 16;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const EXT_KEY_SHARE: u16 = 51;
const GROUP_X25519: u16 = 0x001d;
const TLS13: u16 = 0x0304;
/// The largest record a peer may send (TLSCiphertext: 2^14 + 2048).
const MAX_RECORD: usize = 16384 + 2048;
/// Bytes read from the socket at a time while looking.
const CHUNK: usize = 8192;

/// A cursor over untrusted bytes: every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize)
    }
    /// A vector with a `len`-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
}

/// What the body of one whole handshake record offers, if it is exactly one message of a kind
/// that carries the client's X25519 key.
pub fn inspect(body: &[u8]) -> Option<Ahead> {
    let mut r = Reader(body);
    let kind = r.u8()?;
    let len = r.u24()?;
    let msg = r.take(len)?;
    if !r.0.is_empty() {
        return None;
    }
    match kind {
        CLIENT_KEY_EXCHANGE => {
            let mut m = Reader(msg);
            let point = m.vec8()?;
            if !m.0.is_empty() || point.len() != 32 {
                return None;
            }
            point.try_into().ok().map(Ahead::ClientKeyExchange)
        }
        CLIENT_HELLO => client_hello_key_share(msg).map(Ahead::KeyShare),
        _ => None,
    }
}

/// The X25519 key share of a ClientHello that offers TLS 1.3.
fn client_hello_key_share(msg: &[u8]) -> Option<[u8; 32]> {
    let mut r = Reader(msg);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    let mut ext = Reader(r.vec16()?);
    let (mut tls13, mut share) = (false, None);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let mut data = Reader(ext.vec16()?);
        match kind {
            EXT_SUPPORTED_VERSIONS => {
                let mut versions = Reader(data.vec8()?);
                while let Some(v) = versions.u16() {
                    tls13 |= v == TLS13;
                }
            }
            EXT_KEY_SHARE => {
                let mut shares = Reader(data.vec16()?);
                while !shares.0.is_empty() {
                    let group = shares.u16()?;
                    let key = shares.vec16()?;
                    if group == GROUP_X25519 && key.len() == 32 && share.is_none() {
                        share = key.try_into().ok();
                    }
                }
            }
            _ => {}
        }
    }
    share.filter(|_| tls13)
}

enum State {
    /// Looking at each whole record.
    Looking,
    /// A record held back until its secret is computed.
    Waiting(oneshot::Receiver<()>),
    /// Passing everything through.
    Through,
}

/// The client's byte stream, read a record ahead during the key exchange (see the module).
pub struct KexStream<S> {
    inner: S,
    /// `None` once the key exchange is over (so nothing of it outlives the handshake here).
    slot: Option<Arc<Slot>>,
    delay: Duration,
    /// Whether the listener allows TLS 1.3 (a ClientHello's key share is then used).
    tls13: bool,
    /// Read from the socket, not yet given to BoringSSL.
    buf: Vec<u8>,
    /// Bytes at the front of `buf` that may be given.
    ready: usize,
    /// Bytes at the front of `buf` whose records were looked at.
    looked: usize,
    state: State,
}

impl<S> KexStream<S> {
    /// Computes ahead with `slot` (shared with [`keyshare::in_handshake`]), holding a record
    /// back at most `delay`.
    pub fn new(inner: S, slot: Arc<Slot>, delay: Duration, tls13: bool) -> KexStream<S> {
        KexStream { inner, slot: Some(slot), delay, tls13, buf: Vec::new(), ready: 0, looked: 0, state: State::Looking }
    }

    /// Only passes through.
    pub fn through(inner: S) -> KexStream<S> {
        KexStream { inner, slot: None, delay: Duration::ZERO, tls13: false, buf: Vec::new(), ready: 0, looked: 0, state: State::Through }
    }

    fn pass_through(&mut self) {
        self.state = State::Through;
        self.slot = None;
        self.looked = self.buf.len();
        self.ready = self.buf.len();
    }

    /// Looks at every whole record not yet looked at, until one is held back.
    fn look(&mut self) {
        while let State::Looking = self.state {
            let rest = &self.buf[self.looked..];
            if rest.len() < 5 {
                break;
            }
            let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
            // Anything but a handshake record ends the key exchange's plaintext part; a length
            // no record may have is BoringSSL's to refuse. Either way: through from here on.
            if rest[0] != CONTENT_HANDSHAKE || len > MAX_RECORD {
                self.pass_through();
                return;
            }
            if rest.len() < 5 + len {
                break;
            }
            let ahead = inspect(&rest[5..5 + len]);
            let start = self.looked;
            self.looked += 5 + len;
            let (peer, reserve) = match ahead {
                Some(Ahead::ClientKeyExchange(k)) => (k, false),
                Some(Ahead::KeyShare(k)) if self.tls13 => (k, true),
                _ => continue,
            };
            let Some(slot) = self.slot.as_ref() else { continue };
            if let Some(rx) = keyshare::compute_ahead(slot, peer, reserve, self.delay) {
                self.ready = start;
                self.state = State::Waiting(rx);
                return;
            }
        }
        self.ready = self.looked;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for KexStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let State::Waiting(rx) = &mut this.state {
                if Pin::new(rx).poll(cx).is_ready() {
                    this.state = State::Looking;
                    this.look();
                }
            }
            if this.ready > 0 {
                let n = this.ready.min(out.remaining());
                out.put_slice(&this.buf[..n]);
                this.buf.drain(..n);
                this.ready -= n;
                this.looked -= n;
                return Poll::Ready(Ok(()));
            }
            match this.state {
                State::Waiting(_) => return Poll::Pending,
                State::Through if this.buf.is_empty() => {
                    if this.buf.capacity() > 0 {
                        this.buf = Vec::new();
                    }
                    return Pin::new(&mut this.inner).poll_read(cx, out);
                }
                _ => {}
            }
            let mut chunk = [0u8; CHUNK];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // The client closed: what is held goes to BoringSSL as it is, then the end.
                this.pass_through();
                if this.ready == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            this.buf.extend_from_slice(rb.filled());
            this.look();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for KexStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The TLS stream of an accepted connection, which skips its `close_notify` once reading has
/// ended (the client's `close_notify`, its end of stream, or an error), as nginx does: the
/// client has gone, and the alert would reach a closed socket and be answered with a reset, a
/// send and a reset more per connection for nothing. A connection the proxy closes first (a
/// drain, `Connection: close` before the client's end) still sends it.
pub struct QuietClose<S> {
    tls: tokio_boring::SslStream<S>,
    read_ended: bool,
}

impl<S> QuietClose<S> {
    pub fn new(tls: tokio_boring::SslStream<S>) -> QuietClose<S> {
        QuietClose { tls, read_ended: false }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for QuietClose<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = out.filled().len();
        let r = ready!(Pin::new(&mut this.tls).poll_read(cx, out));
        if r.is_err() || (out.filled().len() == before && out.remaining() > 0) {
            this.read_ended = true;
        }
        Poll::Ready(r)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for QuietClose<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write(cx, buf)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_ended {
            use foreign_types::ForeignTypeRef;
            // SAFETY: the pointer is this stream's own live SSL object; the call only sets a
            // flag that makes SSL_shutdown finish without writing an alert.
            unsafe { boring_sys::SSL_set_quiet_shutdown(this.tls.ssl_mut().as_ptr(), 1) };
        }
        Pin::new(&mut this.tls).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, msg: &[u8]) -> Vec<u8> {
        let mut body = vec![kind, 0, (msg.len() >> 8) as u8, msg.len() as u8];
        body.extend_from_slice(msg);
        body
    }

    fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend_from_slice(&(data.len() as u16).to_be_bytes());
        e.extend_from_slice(data);
        e
    }

    fn client_hello(versions: &[u16], shares: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut m = vec![3, 3];
        m.extend_from_slice(&[7; 32]);
        m.extend_from_slice(&[32]);
        m.extend_from_slice(&[1; 32]);
        m.extend_from_slice(&[0, 4, 0x13, 0x01, 0xc0, 0x2f]);
        m.extend_from_slice(&[1, 0]);
        let mut exts = Vec::new();
        let mut v = vec![(versions.len() * 2) as u8];
        for x in versions {
            v.extend_from_slice(&x.to_be_bytes());
        }
        exts.extend(ext(0, b"\x00\x00"));
        exts.extend(ext(EXT_SUPPORTED_VERSIONS, &v));
        let mut ks = Vec::new();
        for (g, k) in shares {
            ks.extend_from_slice(&g.to_be_bytes());
            ks.extend_from_slice(&(k.len() as u16).to_be_bytes());
            ks.extend_from_slice(k);
        }
        let mut kd = (ks.len() as u16).to_be_bytes().to_vec();
        kd.extend(ks);
        exts.extend(ext(EXT_KEY_SHARE, &kd));
        m.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        m.extend(exts);
        message(CLIENT_HELLO, &m)
    }

    #[test]
    fn finds_the_client_key_exchange_and_the_tls13_key_share() {
        let mut cke = vec![32];
        cke.extend_from_slice(&[9; 32]);
        assert_eq!(inspect(&message(CLIENT_KEY_EXCHANGE, &cke)), Some(Ahead::ClientKeyExchange([9; 32])));
        // A P-256 point or an RSA key exchange is not X25519.
        let mut p256 = vec![65];
        p256.extend_from_slice(&[4; 65]);
        assert_eq!(inspect(&message(CLIENT_KEY_EXCHANGE, &p256)), None);
        // The key share of a TLS 1.3 hello, the X25519 one among others.
        let hello = client_hello(&[TLS13, 0x0303], &[(0x0017, vec![4; 65]), (GROUP_X25519, vec![5; 32])]);
        assert_eq!(inspect(&hello), Some(Ahead::KeyShare([5; 32])));
        // Not without TLS 1.3, not without an X25519 share, not of the wrong size.
        assert_eq!(inspect(&client_hello(&[0x0303], &[(GROUP_X25519, vec![5; 32])])), None);
        assert_eq!(inspect(&client_hello(&[TLS13], &[(0x0017, vec![4; 65])])), None);
        assert_eq!(inspect(&client_hello(&[TLS13], &[(GROUP_X25519, vec![5; 31])])), None);
        // Two messages in one record, or a message cut short: nothing.
        let mut two = message(CLIENT_KEY_EXCHANGE, &cke);
        two.extend(message(CLIENT_KEY_EXCHANGE, &cke));
        assert_eq!(inspect(&two), None);
        let full = message(CLIENT_KEY_EXCHANGE, &cke);
        for n in 0..full.len() {
            assert_eq!(inspect(&full[..n]), None, "cut at {n}");
        }
        for n in 0..hello.len() {
            assert_eq!(inspect(&hello[..n]), None, "cut at {n}");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic scan (the fuzz target goes further).
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 300) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (x.rotate_left(i as u32 % 64) >> 3) as u8).collect();
            let _ = inspect(&bytes);
            let mut hello = client_hello(&[TLS13], &[(GROUP_X25519, vec![5; 32])]);
            let at = (x as usize >> 8) % hello.len();
            hello[at] ^= (x >> 40) as u8 | 1;
            let _ = inspect(&hello);
        }
    }

    /// A stream that hands out its bytes in reads of `step`.
    struct Trickle {
        data: Vec<u8>,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            let n = self.step.min(self.data.len()).min(out.remaining());
            let head: Vec<u8> = self.data.drain(..n).collect();
            out.put_slice(&head);
            Poll::Ready(Ok(()))
        }
    }

    async fn read_all<S: AsyncRead + Unpin>(mut s: S, step: usize) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let mut b = vec![0u8; step];
        loop {
            let n = s.read(&mut b).await.unwrap();
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&b[..n]);
        }
    }

    #[tokio::test]
    async fn every_byte_arrives_in_order_whatever_the_reads() {
        // Records as a client sends them (the batches are off in this test binary, so nothing
        // is held; the order and completeness of the bytes is what is checked), then garbage.
        let mut cke = vec![32];
        cke.extend_from_slice(&[9; 32]);
        let mut data = Vec::new();
        for r in [client_hello(&[TLS13], &[(GROUP_X25519, vec![5; 32])]), message(CLIENT_KEY_EXCHANGE, &cke)] {
            data.extend_from_slice(&[CONTENT_HANDSHAKE, 3, 3, (r.len() >> 8) as u8, r.len() as u8]);
            data.extend(r);
        }
        data.extend_from_slice(&[20, 3, 3, 0, 1, 1]);
        data.extend((0..5000u32).map(|i| (i * 7) as u8));
        for step in [1, 3, 5, 64, 9000] {
            for read in [1, 5, 100, 20000] {
                let s = KexStream::new(Trickle { data: data.clone(), step }, Arc::new(Slot::default()), Duration::from_millis(1), true);
                assert_eq!(read_all(s, read).await, data, "socket reads of {step}, reads of {read}");
            }
        }
        // A record claiming more than a record may hold is passed on, not waited for.
        let mut big = vec![CONTENT_HANDSHAKE, 3, 3, 0xff, 0xff];
        big.extend_from_slice(&[1; 100]);
        let s = KexStream::new(Trickle { data: big.clone(), step: 7 }, Arc::new(Slot::default()), Duration::from_millis(1), true);
        assert_eq!(read_all(s, 10).await, big);
        let s = KexStream::through(Trickle { data: data.clone(), step: 100 });
        assert_eq!(read_all(s, 50).await, data);
    }
}
