//! Classic pcap files (the libpcap format): read either byte order, micro- or nanosecond
//! timestamps; write little-endian microsecond files with link type Ethernet.
//!
//! The reader is fuzzed: a hostile file gives an [`Error`], never a panic or an unbounded
//! allocation (record lengths above [`MAX_SNAPLEN`] are refused).

use std::io::{self, Read, Write};

pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest record accepted (the largest snap length libpcap uses).
pub const MAX_SNAPLEN: u32 = 262_144;

const MAGIC_MICRO: u32 = 0xa1b2_c3d4;
const MAGIC_NANO: u32 = 0xa1b2_3c4d;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Not a pcap file (bad magic), or pcapng, which is not supported.
    #[error("{}", bad_magic(*.0))]
    BadMagic(u32),
    /// A link type other than Ethernet.
    #[error("link type {0} is not supported (only Ethernet, 1)")]
    LinkType(u32),
    /// A record whose captured length is larger than the limit or its original length.
    #[error("record {index}: captured length {caplen} is invalid (limit {MAX_SNAPLEN})")]
    BadRecord { index: u64, caplen: u32 },
    /// The file ends inside a header or record.
    #[error("file ends inside record {index}")]
    Truncated { index: u64 },
}

fn bad_magic(m: u32) -> String {
    if m == 0x0a0d0d0a {
        "this is a pcapng file; convert it with `editcap -F pcap IN OUT`".into()
    } else {
        format!("not a pcap file (magic {m:#010x})")
    }
}

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Timestamp in nanoseconds since the epoch.
    pub ts_ns: u64,
    /// Length on the wire (may exceed `data.len()` for a truncated capture).
    pub orig_len: u32,
    pub data: Vec<u8>,
}

pub struct Reader<R: Read> {
    inner: R,
    swapped: bool,
    nanos: bool,
    index: u64,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of file before the first byte.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return if got == 0 { Ok(false) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl<R: Read> Reader<R> {
    pub fn new(mut inner: R) -> Result<Self, Error> {
        let mut h = [0u8; 24];
        match read_full(&mut inner, &mut h) {
            Ok(true) => {}
            Ok(false) => return Err(Error::Truncated { index: 0 }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(Error::Truncated { index: 0 }),
            Err(e) => return Err(e.into()),
        }
        let magic = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let (swapped, nanos) = match magic {
            MAGIC_MICRO => (false, false),
            MAGIC_NANO => (false, true),
            m if m.swap_bytes() == MAGIC_MICRO => (true, false),
            m if m.swap_bytes() == MAGIC_NANO => (true, true),
            m => return Err(Error::BadMagic(m)),
        };
        let r = Reader { inner, swapped, nanos, index: 0 };
        let link = r.u32(&h[20..24]) & 0x0fff_ffff;
        if link != LINKTYPE_ETHERNET {
            return Err(Error::LinkType(link));
        }
        Ok(r)
    }

    fn u32(&self, b: &[u8]) -> u32 {
        let v = u32::from_le_bytes(b.try_into().unwrap());
        if self.swapped {
            v.swap_bytes()
        } else {
            v
        }
    }

    /// The next record, or `None` at the end of the file.
    pub fn next_record(&mut self) -> Result<Option<Record>, Error> {
        let index = self.index;
        let mut h = [0u8; 16];
        match read_full(&mut self.inner, &mut h) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(Error::Truncated { index }),
            Err(e) => return Err(e.into()),
        }
        let sec = self.u32(&h[0..4]) as u64;
        let frac = self.u32(&h[4..8]) as u64;
        let caplen = self.u32(&h[8..12]);
        let orig_len = self.u32(&h[12..16]);
        if caplen > MAX_SNAPLEN {
            return Err(Error::BadRecord { index, caplen });
        }
        let mut data = vec![0u8; caplen as usize];
        match read_full(&mut self.inner, &mut data) {
            Ok(true) => {}
            Ok(false) if caplen == 0 => {}
            Ok(false) => return Err(Error::Truncated { index }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(Error::Truncated { index }),
            Err(e) => return Err(e.into()),
        }
        self.index += 1;
        let ts_ns = sec * 1_000_000_000 + if self.nanos { frac } else { frac * 1000 };
        Ok(Some(Record { ts_ns, orig_len: orig_len.max(caplen), data }))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

pub struct Writer<W: Write> {
    inner: W,
}

impl<W: Write> Writer<W> {
    pub fn new(mut inner: W) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_MICRO.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&MAX_SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        inner.write_all(&h)?;
        Ok(Writer { inner })
    }

    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> io::Result<()> {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&(((ts_ns % 1_000_000_000) / 1000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.inner.write_all(&h)?;
        self.inner.write_all(data)
    }

    pub fn into_inner(self) -> W {
        self.inner
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(1_500_000_123_000, &[1, 2, 3]).unwrap();
        w.write(2_000_000_000, &[]).unwrap();
        let bytes = w.into_inner();
        let recs: Vec<_> = Reader::new(&bytes[..]).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].data, vec![1, 2, 3]);
        assert_eq!(recs[0].ts_ns, 1_500_000_123_000);
        assert_eq!(recs[1].data, Vec::<u8>::new());
    }

    #[test]
    fn big_endian_nanosecond_files() {
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC_NANO.to_be_bytes());
        f.extend_from_slice(&[0, 2, 0, 4]);
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(&5u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&[9, 9]);
        let r: Vec<_> = Reader::new(&f[..]).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(r[0].ts_ns, 1_000_000_005);
        assert_eq!(r[0].data, vec![9, 9]);
    }

    #[test]
    fn hostile_files_are_errors() {
        assert!(matches!(Reader::new(&[0u8; 10][..]), Err(Error::Truncated { .. })));
        assert!(matches!(Reader::new(&[0u8; 24][..]), Err(Error::BadMagic(0))));
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(0, &[1, 2, 3, 4]).unwrap();
        let mut bytes = w.into_inner();
        bytes.truncate(bytes.len() - 1);
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert!(matches!(r.next_record(), Err(Error::Truncated { index: 0 })));
        let mut huge = Writer::new(Vec::new()).unwrap().into_inner();
        huge.extend_from_slice(&[0; 8]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(matches!(Reader::new(&huge[..]).unwrap().next_record(), Err(Error::BadRecord { .. })));
    }
}
