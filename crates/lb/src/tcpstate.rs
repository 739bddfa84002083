//! TCP connection tracking as a load balancer sees it: both directions for NAT and full NAT,
//! the client's direction only for DR and TUN (`one_way`).

use crate::service::Timeouts;
use crate::session::{flag, state};
use vectorlb_packet::tcp::flags as tf;

/// The state after a segment with `tcp` flags travelling `inbound` (client to backend) or not.
#[inline]
pub fn transition(st: u8, sflags: &mut u8, tcp: u8, inbound: bool, one_way: bool) -> u8 {
    if tcp & tf::RST != 0 {
        return state::CLOSE;
    }
    if tcp & tf::SYN != 0 {
        if tcp & tf::ACK == 0 {
            // A new SYN on a closed session reuses it (client port reuse).
            if inbound && matches!(st, state::TIME_WAIT | state::CLOSE | state::SYN_SENT | state::FREE | state::CONTINUED) {
                *sflags &= !(flag::FIN_IN | flag::FIN_OUT | flag::UNSEEN);
                return state::SYN_SENT;
            }
            return st;
        }
        if !inbound && matches!(st, state::SYN_SENT | state::SYN_RECV) {
            return state::SYN_RECV;
        }
        return st;
    }
    let mut next = st;
    if tcp & tf::ACK != 0 {
        next = match st {
            state::SYN_RECV if inbound => state::ESTABLISHED,
            state::SYN_SENT if inbound && one_way => state::ESTABLISHED,
            // A continued session: confirmed by the backend's reply. Where replies bypass the
            // LB (one way) nothing the LB sees can confirm it (a flood can repeat its segments):
            // it stays continued, inside the continuation budget, for its life; the client's
            // second segment only gives it the established timeout (`UNSEEN` cleared).
            state::CONTINUED if !inbound => state::ESTABLISHED,
            state::CONTINUED if one_way => {
                *sflags &= !flag::UNSEEN;
                state::CONTINUED
            }
            state::LAST_ACK if tcp & tf::FIN == 0 => state::TIME_WAIT,
            state::FIN_WAIT if one_way && inbound && tcp & tf::FIN == 0 && *sflags & flag::FIN_IN != 0 => state::TIME_WAIT,
            s => s,
        };
    }
    if tcp & tf::FIN != 0 && next == state::CONTINUED {
        // Remembered, but the session stays within the continuation budget until confirmed
        // (a flood of FINs must not open sessions outside it).
        *sflags |= if inbound { flag::FIN_IN } else { flag::FIN_OUT };
        return next;
    }
    if tcp & tf::FIN != 0 && matches!(next, state::SYN_SENT | state::SYN_RECV | state::ESTABLISHED | state::FIN_WAIT) {
        *sflags |= if inbound { flag::FIN_IN } else { flag::FIN_OUT };
        next = if *sflags & (flag::FIN_IN | flag::FIN_OUT) == (flag::FIN_IN | flag::FIN_OUT) { state::LAST_ACK } else { state::FIN_WAIT };
    }
    next
}

/// Timeout of a state (with its flags), in milliseconds. A continued session lives the SYN
/// timeout until its second segment, then the established one, or the FIN one after a FIN.
#[inline(always)]
pub fn timeout(st: u8, sflags: u8, t: &Timeouts) -> u32 {
    match st {
        state::CONTINUED if sflags & flag::UNSEEN != 0 => t.syn,
        state::CONTINUED if sflags & (flag::FIN_IN | flag::FIN_OUT) != 0 => t.fin,
        state::CONTINUED => t.established,
        state::SYN_SENT | state::SYN_RECV => t.syn,
        state::ESTABLISHED => t.established,
        state::FIN_WAIT | state::LAST_ACK => t.fin,
        state::TIME_WAIT => t.time_wait,
        state::CLOSE => t.close,
        _ => t.udp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steps: &[(u8, bool)], one_way: bool) -> Vec<u8> {
        let mut st = state::FREE;
        let mut f = 0;
        steps
            .iter()
            .map(|&(t, inb)| {
                st = transition(st, &mut f, t, inb, one_way);
                st
            })
            .collect()
    }

    #[test]
    fn full_lifecycle_client_closes() {
        let s = run(
            &[
                (tf::SYN, true),
                (tf::SYN | tf::ACK, false),
                (tf::ACK, true),
                (tf::ACK | tf::PSH, true),
                (tf::ACK | tf::PSH, false),
                (tf::FIN | tf::ACK, true),
                (tf::FIN | tf::ACK, false),
                (tf::ACK, true),
            ],
            false,
        );
        use state::*;
        assert_eq!(s, vec![SYN_SENT, SYN_RECV, ESTABLISHED, ESTABLISHED, ESTABLISHED, FIN_WAIT, LAST_ACK, TIME_WAIT]);
    }

    #[test]
    fn one_way_lifecycle() {
        use state::*;
        let s = run(&[(tf::SYN, true), (tf::ACK, true), (tf::FIN | tf::ACK, true), (tf::ACK, true)], true);
        assert_eq!(s, vec![SYN_SENT, ESTABLISHED, FIN_WAIT, TIME_WAIT]);
    }

    #[test]
    fn one_way_continued_sessions_stay_continued() {
        use state::*;
        let t = Timeouts { syn: 1, established: 2, fin: 3, ..Timeouts::default() };
        let (mut st, mut f) = (CONTINUED, flag::UNSEEN);
        assert_eq!(timeout(st, f, &t), 1);
        for _ in 0..3 {
            st = transition(st, &mut f, tf::ACK | tf::PSH, true, true);
            assert_eq!((st, timeout(st, f, &t)), (CONTINUED, 2));
        }
        st = transition(st, &mut f, tf::FIN | tf::ACK, true, true);
        assert_eq!((st, timeout(st, f, &t)), (CONTINUED, 3));
        // Where replies pass through the LB, the backend's reply confirms it.
        let (mut st, mut f) = (CONTINUED, flag::UNSEEN);
        st = transition(st, &mut f, tf::ACK, true, false);
        assert_eq!(st, CONTINUED);
        st = transition(st, &mut f, tf::ACK, false, false);
        assert_eq!(st, ESTABLISHED);
    }

    #[test]
    fn rst_closes_and_syn_reopens() {
        use state::*;
        let s = run(&[(tf::SYN, true), (tf::RST, false), (tf::SYN, true)], false);
        assert_eq!(s, vec![SYN_SENT, CLOSE, SYN_SENT]);
    }
}
