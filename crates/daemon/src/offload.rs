//! Super-packets and partial checksums leaving for a port without offloads: what a pod's kernel
//! left to its receiver (its interface's virtio-net header: [`vectorlb_io::Offload`] on the
//! frame) is done here before the frame goes where nothing else would do it (the uplink, a
//! memif, another worker's port): the checksum completed, a super-packet cut into packets of
//! its segment size, each in a buffer of its own behind the frame's own link-layer header.

use vectorlb_io::{Offload, Packet, PacketPool};
use vectorlb_packet::vnet;

/// What became of a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    /// Nothing was left, or its checksum was completed in place: send it.
    Whole,
    /// Cut into this many frames (appended to the output); the super-packet itself goes.
    Cut(usize),
    /// It could not be finished (not TCP or UDP where it says it is, or a tunnel's packet now,
    /// or no buffers): drop it.
    Failed,
}

/// Finishes `m` (see the module): in place, or into new frames from `pool` appended to `out`.
/// `scratch` is where segments are built (reused).
pub fn finish<P: Packet>(m: &mut P, pool: &dyn PacketPool<P>, scratch: &mut Vec<u8>, out: &mut Vec<P>) -> Finished {
    let o = m.offload();
    if !o.partial {
        return Finished::Whole;
    }
    m.set_offload(Offload::NONE);
    let Ok(info) = vectorlb_packet::parse_frame(m.data()) else { return Finished::Failed };
    let l3 = info.l3;
    let Ok(h) = vnet::offload_hdr(&mut m.data_mut()[l3..], o.gso_size) else { return Finished::Failed };
    if h.gso_type == vnet::gso::NONE {
        return if vnet::complete_checksum(&mut m.data_mut()[l3..], &h).is_ok() { Finished::Whole } else { Finished::Failed };
    }
    let meta = m.meta();
    let d = m.data();
    let (l2, ip) = d.split_at(l3);
    let before = out.len();
    let mut frame = Vec::with_capacity(l3 + o.gso_size as usize + 120);
    let mut lost = false;
    let cut = vnet::segment(ip, &h, scratch, |s| {
        frame.clear();
        frame.extend_from_slice(l2);
        frame.extend_from_slice(s);
        match pool.alloc_frame(meta.port, &frame) {
            Some(mut f) => {
                f.set_meta(meta);
                out.push(f);
            }
            None => lost = true,
        }
    });
    match cut {
        Ok(_) if !lost => Finished::Cut(out.len() - before),
        _ => {
            // All or nothing: a super-packet missing a segment is a hole its sender must fill
            // anyway; none of it goes.
            out.truncate(before);
            Finished::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectorlb_io::mem::Pool;
    use vectorlb_io::PacketBuf;

    /// An Ethernet frame with a TCP super-packet of `n` payload bytes whose checksum field
    /// holds the pseudo-header sum (as a pod's kernel hands it over).
    fn super_frame(n: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let total = 20 + 20 + n;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(total as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 10, 244, 1, 2, 10, 96, 0, 11]);
        let c = vectorlb_packet::checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&5202u16.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = 0x18;
        f.extend_from_slice(&ip);
        f.extend_from_slice(&tcp);
        f.extend((0..n).map(|i| i as u8));
        // The seed, as offload_hdr would write it.
        let _ = vnet::offload_hdr(&mut f[14..], 0);
        f
    }

    fn verifies(frame: &[u8]) -> bool {
        let ip = &frame[14..];
        // A frame verifies when completing its checksum again changes nothing.
        let mut again = ip.to_vec();
        let seeded = vnet::offload_hdr(&mut again, 0).unwrap();
        vnet::complete_checksum(&mut again, &seeded).unwrap();
        again == ip && vectorlb_packet::checksum::checksum(&ip[..20]) == 0
    }

    #[test]
    fn a_super_packet_is_cut_behind_its_own_link_header_and_a_partial_checksum_completed() {
        let pool = Pool::new(128, 65_536);
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let mut p = pool.packet(0, &super_frame(3000)).unwrap();
        p.set_offload(Offload { gso_size: 1448, partial: true });
        assert_eq!(finish(&mut p, &pool, &mut scratch, &mut out), Finished::Cut(3));
        for f in &out {
            assert_eq!(&f.data()[..14], &super_frame(0)[..14]);
            assert!(f.data().len() <= 14 + 40 + 1448);
            assert!(verifies(f.data()), "a segment's checksums");
        }
        let mut p = pool.packet(0, &super_frame(1000)).unwrap();
        p.set_offload(Offload { gso_size: 0, partial: true });
        assert_eq!(finish(&mut p, &pool, &mut scratch, &mut Vec::new()), Finished::Whole);
        assert!(verifies(p.data()));
        assert_eq!(p.offload(), Offload::NONE);
        // Nothing left to do: untouched.
        let before = p.data().to_vec();
        assert_eq!(finish(&mut p, &pool, &mut scratch, &mut Vec::new()), Finished::Whole);
        assert_eq!(p.data(), &before[..]);
        // No longer TCP (a tunnel's packet, an ICMP error made of it): refused, never cut.
        let mut f = super_frame(3000);
        f[14 + 9] = 4;
        let mut p = pool.packet(0, &f).unwrap();
        p.set_offload(Offload { gso_size: 1448, partial: true });
        assert_eq!(finish(&mut p, &pool, &mut scratch, &mut out), Finished::Failed);
    }
}
