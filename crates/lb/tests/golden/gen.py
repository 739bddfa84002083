#!/usr/bin/env python3
"""Generates the golden packet fixtures of vectorlb-lb with scapy, an independent oracle.

    python3 crates/lb/tests/golden/gen.py

writes, next to this script:

* ``pcap/<case>.pcap``: one classic pcap (Ethernet link type) per case holding every frame of
  the case, the inputs and the expected outputs, in step order;
* ``fixtures.json``: the table. One entry per case: its name, description, the topology and
  service variant it needs (``setup``), the steps (input frame index, expected verdict,
  expected output frame index or null) and what must hold after the last step (``after``).

Every expected frame is built here from its fields, and scapy computes every length and every
checksum (no checksum field is ever set by hand, except where a case says it quotes one
unchanged, and then the value is scapy's checksum of the quoted packet). Nothing is copied
from the Rust code's output: where a field is a convention of the pipeline (TTL 63 after
forwarding, IP ident 1 in the first header the worker originates, ...), the convention is
written out below and explained.

The topology is the one of crates/lb/tests/common/mod.rs; keep the two in step.
"""

import json
import logging
import os
import sys

from scapy.all import (
    ARP,
    ICMP,
    IP,
    TCP,
    UDP,
    Dot1Q,
    Ether,
    ICMPv6DestUnreach,
    ICMPv6EchoReply,
    ICMPv6EchoRequest,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    IPOption_Router_Alert,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    PadN,
    Raw,
    fragment,
    fragment6,
    wrpcap,
    rdpcap,
)
from scapy import VERSION as SCAPY_VERSION

HERE = os.path.dirname(os.path.abspath(__file__))
PCAP_DIR = os.path.join(HERE, "pcap")

# --- The topology (crates/lb/tests/common/mod.rs) -----------------------------------------

ROUTER_MAC = "02:00:00:00:00:fe"
EXT_MAC = "02:00:00:00:00:01"  # port 0 "ext"
INT_MAC = "02:00:00:00:01:01"  # port 1 "int"


def be_mac(i):
    return "02:00:00:00:01:%02x" % (0x10 + i)


class Fam:
    def __init__(self, v6):
        self.v6 = v6
        self.n = 6 if v6 else 4
        self.client = "2001:db8:ff::7" if v6 else "198.51.100.7"
        self.vip = "2001:db8::100" if v6 else "10.0.0.100"
        self.laddr = "2001:db8:1::200" if v6 else "10.1.0.200"
        self.ext_addr = "2001:db8::1" if v6 else "10.0.0.1"
        self.int_addr = "2001:db8:1::1" if v6 else "10.1.0.1"
        # A router on the backends' side (no neighbour entry needed: it only sends).
        self.int_router = "2001:db8:1::fe" if v6 else "10.1.0.254"
        # SNAT: the backends' network, the address they leave as, and a host outside.
        self.snat_addr = "2001:db8::200" if v6 else "10.0.0.200"
        self.remote = "2001:db8:99::9" if v6 else "203.0.113.9"

    def backend(self, i):
        return ("2001:db8:1::1%d" if self.v6 else "10.1.0.1%d") % i


V4, V6 = Fam(False), Fam(True)

# --- Conventions --------------------------------------------------------------------------

# Inputs carry a recognisable IPv4 ident so that a rewrite that clobbers it shows.
CLIENT_ID = 0x0101
BACKEND_ID = 0x0202
ROUTER_ID = 0x0303
# The first full-NAT / SNAT local port a worker hands out.
FIRST_LPORT = 1024
# Forwarding (every mode): TTL / hop limit one less (64 in, 63 out); what the mode does not
# translate is kept as it came (IPv4 ident, DF, TOS, options; IPv6 traffic class, flow label,
# extension headers; TCP options, sequence numbers, window; payload). MACs: the egress port's
# own as source, the next hop's as destination; the egress port's VLAN tag, if any.
#
# Headers the pipeline originates (the outer header of a tunnel, an ICMP error) take their
# IPv4 ident from a per-worker counter that starts at 0 and is incremented before use: the
# first such header of a case has ident 1, the next 2. Their TTL / hop limit is 64. Tunnels
# copy TOS / traffic class, flow label and DF from the inner header; ICMP errors have TOS 0 and
# DF clear. An echo reply is the request with the addresses swapped, the type changed and
# TTL 64 (ident, DF and the echo body kept).


def ip_hdr(f, src, dst, ttl=64, ident=CLIENT_ID, df=True, tos=0, options=None, fl=0):
    """An IPv4 or IPv6 header; IPv6 has no ident or DF (tos is its traffic class)."""
    if f.v6:
        return IPv6(src=src, dst=dst, hlim=ttl, tc=tos, fl=fl)
    kw = dict(src=src, dst=dst, ttl=ttl, id=ident, flags="DF" if df else 0, tos=tos)
    if options:
        kw["options"] = options
    return IP(**kw)


def tcp(sport, dport, flags, seq=0, ack=0, options=None):
    return TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=65535, options=options or [])


def udp(sport, dport):
    return UDP(sport=sport, dport=dport)


def eth(src, dst, vlan=None):
    e = Ether(src=src, dst=dst)
    return e / Dot1Q(vlan=vlan) if vlan is not None else e


def to_lb(f, vlan=None):
    """Ethernet header of a frame from the outside router to the LB's ext port."""
    return eth(ROUTER_MAC, EXT_MAC, vlan)


def from_lb_ext():
    return eth(EXT_MAC, ROUTER_MAC)


def to_backend(i, vlan=None):
    return eth(INT_MAC, be_mac(i), vlan)


def from_backend(i):
    return eth(be_mac(i), INT_MAC)


def ip_bytes(pkt):
    """The IP packet of a frame (everything after the Ethernet header and tags)."""
    layer = pkt.getlayer(IP) or pkt.getlayer(IPv6)
    return bytes(layer)


def icmp_error(f, src, dst, kind, quote, ident, mtu=None):
    """An ICMP / ICMPv6 error as the pipeline originates it: TTL 64, ident from the worker's
    counter, DF clear, TOS 0; the quote is the offending IP packet as it arrived, cut to fit
    576 (IPv4) or 1280 (IPv6) bytes."""
    limit = (1280 - 48) if f.v6 else (576 - 28)
    quote = quote[:limit]
    if f.v6:
        hdr = IPv6(src=src, dst=dst, hlim=64)
        if kind == "time_exceeded":
            return hdr / ICMPv6TimeExceeded(code=0) / Raw(quote)
        return hdr / ICMPv6PacketTooBig(mtu=mtu) / Raw(quote)
    hdr = IP(src=src, dst=dst, ttl=64, id=ident, flags=0, tos=0)
    if kind == "time_exceeded":
        return hdr / ICMP(type=11, code=0) / Raw(quote)
    return hdr / ICMP(type=3, code=4, nexthopmtu=mtu) / Raw(quote)


# --- The table ------------------------------------------------------------------------------

CASES = []


class Case:
    def __init__(self, name, description, mode=None, family=4, proto="tcp", port=None, backends=None, **flags):
        assert all(c.name != name for c in CASES), name
        self.name = name
        self.description = description
        if port is None:
            port = 80 if proto == "tcp" else 53
        self.setup = {
            "mode": mode,
            "family": family,
            "proto": proto,
            "port": port,
            "backends": backends if backends is not None else ([[1, 8080, 1]] if mode in ("nat", "fnat") else [[1, 0, 1]]),
            "toa": flags.pop("toa", False),
            "int_vlan": flags.pop("int_vlan", None),
            "int_mtu": flags.pop("int_mtu", 1500),
            "snat": flags.pop("snat", False),
        }
        assert not flags, flags
        self.frames = []
        self.steps = []
        self.after = {}
        # Set when the case shows a pipeline bug: the harness then requires the case to fail,
        # and to be told when it passes (the bug fixed: remove the mark).
        self.known_bug = None
        CASES.append(self)

    def _frame(self, pkt):
        b = pkt if isinstance(pkt, (bytes, bytearray)) else bytes(pkt)
        self.frames.append(bytes(b))
        return len(self.frames) - 1

    def step(self, note, inp, verdict, out=None):
        assert (out is None) == (not verdict.startswith("tx:")), (self.name, note)
        s = {"note": note, "input": self._frame(inp), "verdict": verdict, "output": None}
        if out is not None:
            s["output"] = self._frame(out)
        self.steps.append(s)

    def expect(self, sessions=None, **counters):
        if sessions is not None:
            self.after["sessions"] = sessions
        if counters:
            self.after["counters"] = {k.replace("__", ":"): v for k, v in counters.items()}

    def json(self):
        return {
            "name": self.name,
            "description": self.description,
            "setup": self.setup,
            "pcap": "pcap/%s.pcap" % self.name,
            "steps": self.steps,
            "after": self.after,
            "known_bug": self.known_bug,
        }


def fam_name(f):
    return "v6" if f.v6 else "v4"


# 1. Every mode x family x protocol: client to backend, backend to client (NAT, full NAT).

def client_l4(proto, vport, sport=40000):
    if proto == "tcp":
        return tcp(sport, vport, "S", seq=1000)
    return udp(sport, vport) / Raw(b"query")


def forward_matrix():
    for mode in ("nat", "fnat", "dr", "tun"):
        for f in (V4, V6):
            for proto in ("tcp", "udp"):
                vport = 80 if proto == "tcp" else 53
                c = Case(
                    "%s_%s_%s" % (mode, fam_name(f), proto),
                    "%s, IPv%d, %s: client to VIP is forwarded to the backend%s"
                    % (mode, f.n, proto, "; the backend's reply returns from the VIP" if mode in ("nat", "fnat") else ""),
                    mode=mode,
                    family=f.n,
                    proto=proto,
                    port=vport,
                )
                be = f.backend(1)
                inp = to_lb(f) / ip_hdr(f, f.client, f.vip) / client_l4(proto, vport)

                def expected(tunnel_ident):
                    if mode == "nat":
                        l4 = client_l4(proto, 8080)
                        return to_backend(1) / ip_hdr(f, f.client, be, ttl=63) / l4
                    if mode == "fnat":
                        l4 = client_l4(proto, 8080, sport=FIRST_LPORT)
                        return to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / l4
                    inner = ip_hdr(f, f.client, f.vip, ttl=63) / client_l4(proto, vport)
                    if mode == "dr":
                        return to_backend(1) / inner
                    # tun: IP-in-IP (protocol 4, RFC 2003) or IPv6-in-IPv6 (next header 41,
                    # RFC 2473) from the egress port's address; DF and TOS copied from the
                    # inner header, TTL 64.
                    if f.v6:
                        outer = IPv6(src=f.int_addr, dst=be, nh=41, hlim=64)
                    else:
                        outer = IP(src=f.int_addr, dst=be, proto=4, ttl=64, id=tunnel_ident, flags="DF", tos=0)
                    return to_backend(1) / outer / inner

                c.step("client to VIP", inp, "tx:1", expected(1))
                if mode in ("nat", "fnat"):
                    to = (f.client, 40000) if mode == "nat" else (f.laddr, FIRST_LPORT)
                    if proto == "tcp":
                        l4 = tcp(8080, to[1], "SA", seq=5000, ack=1001)
                        l4o = tcp(vport, 40000, "SA", seq=5000, ack=1001)
                    else:
                        l4 = udp(8080, to[1]) / Raw(b"answer")
                        l4o = udp(vport, 40000) / Raw(b"answer")
                    rep = from_backend(1) / ip_hdr(f, be, to[0], ident=BACKEND_ID) / l4
                    out = from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63, ident=BACKEND_ID) / l4o
                    c.step("backend reply to client", rep, "tx:0", out)
                if proto == "udp":
                    # The second datagram of the flow takes the same session (a tunnel's next
                    # outer header takes the next ident).
                    c.step("second datagram, same session", inp, "tx:1", expected(2))
                c.expect(sessions=1, sessions_created=1)


# 2. ICMP to and through the LB.

def icmp_cases():
    for f in (V4, V6):
        c = Case(
            "icmp_echo_vip_%s" % fam_name(f),
            "an echo request to the VIP is answered (addresses swapped, TTL 64, rest kept); "
            "one to an address that is not the LB's goes to the kernel",
            mode="fnat",
            family=f.n,
            proto="tcp",
            port=80,
            backends=[[1, 80, 1]],
        )
        if f.v6:
            req = to_lb(f) / IPv6(src=f.client, dst=f.vip, hlim=50) / ICMPv6EchoRequest(id=7, seq=1, data=b"ping")
            rep = from_lb_ext() / IPv6(src=f.vip, dst=f.client, hlim=64) / ICMPv6EchoReply(id=7, seq=1, data=b"ping")
            other = to_lb(f) / IPv6(src=f.client, dst=f.backend(1)) / ICMPv6EchoRequest(id=7, seq=2)
        else:
            req = to_lb(f) / ip_hdr(f, f.client, f.vip, ttl=50) / ICMP(type=8, id=7, seq=1) / Raw(b"ping")
            rep = from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=64) / ICMP(type=0, id=7, seq=1) / Raw(b"ping")
            other = to_lb(f) / ip_hdr(f, f.client, f.backend(1)) / ICMP(type=8, id=7, seq=2)
        c.step("echo request to the VIP", req, "tx:0", rep)
        c.step("echo request to a backend's address", other, "kernel")
        c.expect(sessions=0, icmp_echo_replies=1)

    for f in (V4, V6):
        c = Case(
            "ttl_expiry_%s" % fam_name(f),
            "a datagram to the VIP arriving with TTL / hop limit 1 is answered with a "
            "time-exceeded error from the VIP quoting it; no session is made",
            mode="nat",
            family=f.n,
            proto="udp",
            port=53,
            backends=[[1, 53, 1]],
        )
        inp = to_lb(f) / ip_hdr(f, f.client, f.vip, ttl=1) / udp(40000, 53) / Raw(b"query")
        out = from_lb_ext() / icmp_error(f, f.vip, f.client, "time_exceeded", ip_bytes(inp), ident=1)
        c.step("TTL 1 to the VIP", inp, "tx:0", out)
        c.expect(sessions=0, icmp_errors_sent=1, drop__ttl_exceeded=1)

    f = V4
    c = Case(
        "ttl_expiry_nat_reply_v4",
        "a NAT backend's reply arriving with TTL 1 is answered with a time-exceeded error from "
        "the LB's address on the backends' port (the reply was not addressed to the LB)",
        mode="nat",
        family=4,
        proto="udp",
    )
    inp = to_lb(f) / ip_hdr(f, f.client, f.vip) / udp(40000, 53) / Raw(b"query")
    c.step("client to VIP", inp, "tx:1", to_backend(1) / ip_hdr(f, f.client, f.backend(1), ttl=63) / udp(40000, 8080) / Raw(b"query"))
    rep = from_backend(1) / ip_hdr(f, f.backend(1), f.client, ttl=1, ident=BACKEND_ID) / udp(8080, 40000) / Raw(b"answer")
    out = to_backend(1) / icmp_error(f, f.int_addr, f.backend(1), "time_exceeded", ip_bytes(rep), ident=1)
    c.step("reply with TTL 1", rep, "tx:1", out)
    c.expect(sessions=1, icmp_errors_sent=1, drop__ttl_exceeded=1)

    for f in (V4, V6):
        c = Case(
            "path_mtu_%s" % fam_name(f),
            "the backends' port has MTU 1280: a 1440-byte segment of an established full-NAT "
            "flow is refused with fragmentation-needed (IPv4, DF set) / packet-too-big (IPv6) "
            "reporting 1280, quoting as much as fits in 576 / 1280 bytes",
            mode="fnat",
            family=f.n,
            proto="tcp",
            int_mtu=1280,
        )
        be = f.backend(1)
        syn = to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1000)
        c.step(
            "SYN",
            syn,
            "tx:1",
            to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1000),
        )
        big = to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "A", seq=1001) / Raw(b"\x55" * 1400)
        out = from_lb_ext() / icmp_error(f, f.vip, f.client, "too_big", ip_bytes(big), ident=1, mtu=1280)
        c.step("1440-byte segment", big, "tx:0", out)
        c.expect(sessions=1, icmp_errors_sent=1, drop__mtu_exceeded=1)

    f = V4
    c = Case(
        "path_mtu_no_df_v4",
        "an IPv4 packet too big for the egress MTU without DF is dropped (the LB does not "
        "fragment) and no error is sent",
        mode="fnat",
        family=4,
        proto="udp",
        int_mtu=1280,
    )
    big = to_lb(f) / ip_hdr(f, f.client, f.vip, df=False) / udp(40000, 53) / Raw(b"\x55" * 1400)
    c.step("1428-byte datagram without DF", big, "drop:mtu_exceeded")
    c.expect(icmp_errors_sent=0, drop__mtu_exceeded=1)

    # ICMP errors about a session, translated like the session's packets. The quoted
    # packet's TCP/UDP checksum is left as it was quoted (as IPVS does): the expected quote
    # carries scapy's checksum of the packet as originally sent, and scapy recomputes the
    # quoted IPv4 header checksum and the ICMP checksum.
    for f in (V4, V6):
        c = Case(
            "icmp_error_translated_fnat_%s" % fam_name(f),
            "a router on the backends' side reports that the LB's full-NAT segment (local "
            "address to backend) was too big; the error reaches the client about the segment "
            "it sent (client to VIP), from the VIP, TTL decremented",
            mode="fnat",
            family=f.n,
            proto="tcp",
        )
        be = f.backend(1)
        syn = to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1000)
        c.step("SYN", syn, "tx:1", to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1000))
        sent = ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "A", seq=1001) / Raw(b"\x01" * 32)
        sent_csum = _l4_checksum(sent)
        if f.v6:
            err = from_backend(1) / IPv6(src=f.int_router, dst=f.laddr, hlim=64) / ICMPv6PacketTooBig(mtu=1400) / Raw(bytes(sent))
        else:
            err = from_backend(1) / IP(src=f.int_router, dst=f.laddr, ttl=64, id=ROUTER_ID, flags=0) / ICMP(type=3, code=4, nexthopmtu=1400) / Raw(bytes(sent))
        seen = ip_hdr(f, f.client, f.vip, ttl=63) / TCP(sport=40000, dport=80, flags="A", seq=1001, window=65535, chksum=sent_csum) / Raw(b"\x01" * 32)
        if f.v6:
            out = from_lb_ext() / IPv6(src=f.vip, dst=f.client, hlim=63) / ICMPv6PacketTooBig(mtu=1400) / Raw(bytes(seen))
        else:
            out = from_lb_ext() / IP(src=f.vip, dst=f.client, ttl=63, id=ROUTER_ID, flags=0) / ICMP(type=3, code=4, nexthopmtu=1400) / Raw(bytes(seen))
        c.step("too-big error from a router about the full-NAT segment", err, "tx:0", out)
        c.expect(sessions=1, icmp_errors_translated=1)

    for f in (V4, V6):
        c = Case(
            "icmp_error_translated_nat_%s" % fam_name(f),
            "the client's host reports the NAT service's reply (VIP to client) undeliverable "
            "(port unreachable); the error reaches the backend about the datagram it sent "
            "(backend to client), TTL decremented",
            mode="nat",
            family=f.n,
            proto="udp",
        )
        be = f.backend(1)
        q = to_lb(f) / ip_hdr(f, f.client, f.vip) / udp(40000, 53) / Raw(b"query")
        c.step("query", q, "tx:1", to_backend(1) / ip_hdr(f, f.client, be, ttl=63) / udp(40000, 8080) / Raw(b"query"))
        rep = from_backend(1) / ip_hdr(f, be, f.client, ident=BACKEND_ID) / udp(8080, 40000) / Raw(b"answer")
        rep_out = from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63, ident=BACKEND_ID) / udp(53, 40000) / Raw(b"answer")
        c.step("answer", rep, "tx:0", rep_out)
        received = ip_bytes(rep_out)
        recv_csum = _l4_checksum(rep_out.getlayer(IP) or rep_out.getlayer(IPv6))
        if f.v6:
            err = to_lb(f) / IPv6(src=f.client, dst=f.vip, hlim=64) / ICMPv6DestUnreach(code=4) / Raw(received)
        else:
            err = to_lb(f) / IP(src=f.client, dst=f.vip, ttl=64, id=CLIENT_ID, flags=0) / ICMP(type=3, code=3) / Raw(received)
        seen = ip_hdr(f, be, f.client, ttl=63, ident=BACKEND_ID) / UDP(sport=8080, dport=40000, chksum=recv_csum) / Raw(b"answer")
        if f.v6:
            out = to_backend(1) / IPv6(src=f.client, dst=be, hlim=63) / ICMPv6DestUnreach(code=4) / Raw(bytes(seen))
        else:
            out = to_backend(1) / IP(src=f.client, dst=be, ttl=63, id=CLIENT_ID, flags=0) / ICMP(type=3, code=3) / Raw(bytes(seen))
        c.step("port unreachable from the client about the answer", err, "tx:1", out)
        c.expect(sessions=1, icmp_errors_translated=1)


def _l4_checksum(ip_pkt):
    """scapy's TCP/UDP checksum of an IP packet as it would be sent."""
    built = ip_pkt.__class__(bytes(ip_pkt))
    l4 = built.getlayer(TCP) or built.getlayer(UDP)
    return l4.chksum


# 3. Features: TOA, SNAT, VLAN, IPv4 options, IPv6 extension headers, any-port services.

def toa_option(f, port):
    """The TOA option (kind 254, as the Linux TOA module and DPVS): kind, length (8 for IPv4,
    20 for IPv6), the client's port, the client's address."""
    import socket

    addr = socket.inet_pton(socket.AF_INET6 if f.v6 else socket.AF_INET, f.client)
    return (254, port.to_bytes(2, "big") + addr)


def feature_cases():
    for f in (V4, V6):
        c = Case(
            "toa_%s" % fam_name(f),
            "full NAT with TOA: the client's handshake-completing ACK reaches the backend with "
            "a TOA option carrying the client's address and port; later segments carry none",
            mode="fnat",
            family=f.n,
            proto="tcp",
            toa=True,
        )
        be = f.backend(1)
        c.step(
            "SYN",
            to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1),
            "tx:1",
            to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1),
        )
        c.step(
            "SYN-ACK",
            from_backend(1) / ip_hdr(f, be, f.laddr, ident=BACKEND_ID) / tcp(8080, FIRST_LPORT, "SA", seq=9, ack=2),
            "tx:0",
            from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63, ident=BACKEND_ID) / tcp(80, 40000, "SA", seq=9, ack=2),
        )
        c.step(
            "ACK: TOA inserted",
            to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "A", seq=2, ack=10),
            "tx:1",
            to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "A", seq=2, ack=10, options=[toa_option(f, 40000)]),
        )
        c.step(
            "data: no TOA",
            to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "PA", seq=2, ack=10) / Raw(b"GET /"),
            "tx:1",
            to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "PA", seq=2, ack=10) / Raw(b"GET /"),
        )
        c.expect(sessions=1, toa_inserted=1, toa_skipped=0)

    for f in (V4, V6):
        c = Case(
            "snat_%s" % fam_name(f),
            "SNAT: a backend's own datagram to the outside leaves from the SNAT address and the "
            "first local port; the answer comes back to the backend",
            mode=None,
            family=f.n,
            proto="udp",
            port=0,
            backends=[],
            snat=True,
        )
        be = f.backend(1)
        c.step(
            "backend to the outside",
            from_backend(1) / ip_hdr(f, be, f.remote, ident=BACKEND_ID) / udp(5000, 443) / Raw(b"hi"),
            "tx:0",
            from_lb_ext() / ip_hdr(f, f.snat_addr, f.remote, ttl=63, ident=BACKEND_ID) / udp(FIRST_LPORT, 443) / Raw(b"hi"),
        )
        c.step(
            "the outside answers",
            to_lb(f) / ip_hdr(f, f.remote, f.snat_addr, ident=0x0404) / udp(443, FIRST_LPORT) / Raw(b"yo"),
            "tx:1",
            to_backend(1) / ip_hdr(f, f.remote, be, ttl=63, ident=0x0404) / udp(443, 5000) / Raw(b"yo"),
        )
        c.expect(sessions=1)

    f = V4
    c = Case(
        "vlan_retag_dr_v4",
        "a VLAN-tagged (10) datagram is accepted; it leaves on the backends' port with that "
        "port's tag (20)",
        mode="dr",
        family=4,
        proto="udp",
        int_vlan=20,
    )
    c.step(
        "tagged 10 in, tagged 20 out",
        to_lb(f, vlan=10) / ip_hdr(f, f.client, f.vip) / udp(40000, 53) / Raw(b"query"),
        "tx:1",
        to_backend(1, vlan=20) / ip_hdr(f, f.client, f.vip, ttl=63) / udp(40000, 53) / Raw(b"query"),
    )
    c = Case(
        "vlan_untag_fnat_v6",
        "a VLAN-tagged IPv6 segment to a full-NAT service leaves untagged on the backends' port",
        mode="fnat",
        family=6,
        proto="tcp",
    )
    f = V6
    c.step(
        "tagged 10 in, untagged out",
        to_lb(f, vlan=10) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1000),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, f.backend(1), ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1000),
    )

    f = V4
    c = Case(
        "ipv4_options_fnat_v4",
        "an IPv4 router-alert option (RFC 2113; a 24-byte header) is carried through full NAT",
        mode="fnat",
        family=4,
        proto="udp",
        backends=[[1, 5353, 1]],
    )
    c.step(
        "datagram with options",
        to_lb(f) / ip_hdr(f, f.client, f.vip, options=[IPOption_Router_Alert()]) / udp(4000, 53) / Raw(b"q"),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, f.backend(1), ttl=63, options=[IPOption_Router_Alert()]) / udp(FIRST_LPORT, 5353) / Raw(b"q"),
    )

    f = V6
    c = Case(
        "ipv6_ext_header_nat_v6",
        "an IPv6 destination-options header is carried through NAT; the addresses and ports "
        "of the upper layer after it are translated",
        mode="nat",
        family=6,
        proto="udp",
    )
    dopt = IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\x00" * 4)])
    c.step(
        "datagram with a destination-options header",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / dopt / udp(40000, 53) / Raw(b"query"),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.client, f.backend(1), ttl=63) / dopt / udp(40000, 8080) / Raw(b"query"),
    )

    f = V6
    c = Case(
        "any_port_nat_v6",
        "a NAT service on every port (port 0) with a backend on every port keeps the client's "
        "destination port both ways",
        mode="nat",
        family=6,
        proto="tcp",
        port=0,
        backends=[[2, 0, 1]],
    )
    be = f.backend(2)
    for cport, port in ((40000, 22), (40001, 8443)):
        c.step(
            "SYN to port %d" % port,
            to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(cport, port, "S"),
            "tx:1",
            to_backend(2) / ip_hdr(f, f.client, be, ttl=63) / tcp(cport, port, "S"),
        )
        c.step(
            "SYN-ACK from port %d" % port,
            from_backend(2) / ip_hdr(f, be, f.client) / tcp(port, cport, "SA"),
            "tx:0",
            from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63) / tcp(port, cport, "SA"),
        )
    c.expect(sessions=2)

    f = V6
    c = Case(
        "any_port_same_client_port_nat_v6",
        "an any-port NAT service with two backends (round robin): two connections from the "
        "same client port to two different VIP ports are two connections (their 5-tuples "
        "differ), so each gets its own session and the second is scheduled afresh, to the "
        "second backend",
        mode="nat",
        family=6,
        proto="tcp",
        port=0,
        backends=[[1, 0, 1], [2, 0, 1]],
    )
    c.known_bug = (
        "The session key of a service is (service, client address, client port): the VIP port "
        "is not in it, so for an any-port service the SYN to port 8443 from client port 40000 "
        "finds the session of the connection to port 22 and follows it (to backend 1, one "
        "session for two connections, shared TCP state: a RST or FIN on one ends the other)."
    )
    c.step(
        "SYN from client port 40000 to port 22: backend 1",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 22, "S"),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.client, f.backend(1), ttl=63) / tcp(40000, 22, "S"),
    )
    c.step(
        "SYN from client port 40000 to port 8443: a new connection, backend 2",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 8443, "S"),
        "tx:1",
        to_backend(2) / ip_hdr(f, f.client, f.backend(2), ttl=63) / tcp(40000, 8443, "S"),
    )
    c.expect(sessions=2, sessions_created=2)

    f = V4
    c = Case(
        "tun_dscp_v4",
        "IP-in-IP copies the inner TOS (DSCP/ECN) and DF into the outer header (RFC 2003 3.1, "
        "RFC 6040 normal mode)",
        mode="tun",
        family=4,
        proto="udp",
    )
    c.step(
        "TOS 0x2a, DF clear",
        to_lb(f) / ip_hdr(f, f.client, f.vip, tos=0x2a, df=False) / udp(40000, 53) / Raw(b"query"),
        "tx:1",
        to_backend(1)
        / IP(src=f.int_addr, dst=f.backend(1), proto=4, ttl=64, id=1, flags=0, tos=0x2a)
        / ip_hdr(f, f.client, f.vip, ttl=63, tos=0x2a, df=False)
        / udp(40000, 53)
        / Raw(b"query"),
    )
    f = V6
    c = Case(
        "tun_dscp_v6",
        "IPv6-in-IPv6 copies the inner traffic class and flow label into the outer header",
        mode="tun",
        family=6,
        proto="udp",
    )
    c.step(
        "traffic class 0x2a, flow label 0x12345",
        to_lb(f) / ip_hdr(f, f.client, f.vip, tos=0x2a, fl=0x12345) / udp(40000, 53) / Raw(b"query"),
        "tx:1",
        to_backend(1)
        / IPv6(src=f.int_addr, dst=f.backend(1), nh=41, hlim=64, tc=0x2a, fl=0x12345)
        / ip_hdr(f, f.client, f.vip, ttl=63, tos=0x2a, fl=0x12345)
        / udp(40000, 53)
        / Raw(b"query"),
    )


def toa_option_cases():
    f = V6
    c = Case(
        "toa_after_timestamps_v6",
        "full NAT with TOA: SYN options pass unchanged; the TOA option is appended after the "
        "ACK's own options (NOP, NOP, timestamps)",
        mode="fnat",
        family=6,
        proto="tcp",
        toa=True,
    )
    be = f.backend(1)
    syn_opts = [("MSS", 1440), ("SAckOK", b""), ("Timestamp", (100, 0)), ("NOP", None), ("WScale", 7)]
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (101, 500))]
    c.step(
        "SYN with MSS, SACK-permitted, timestamps, window scale",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1, options=syn_opts),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1, options=syn_opts),
    )
    c.step(
        "SYN-ACK",
        from_backend(1) / ip_hdr(f, be, f.laddr) / tcp(8080, FIRST_LPORT, "SA", seq=9, ack=2),
        "tx:0",
        from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63) / tcp(80, 40000, "SA", seq=9, ack=2),
    )
    c.step(
        "ACK with timestamps: TOA appended",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "A", seq=2, ack=10, options=ts) / Raw(b"hello"),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "A", seq=2, ack=10, options=ts + [toa_option(f, 40000)]) / Raw(b"hello"),
    )
    c.expect(sessions=1, toa_inserted=1, toa_skipped=0)

    f = V4
    c = Case(
        "toa_skipped_no_option_space_v4",
        "full NAT with TOA: an ACK whose header already has 40 bytes of options has no room "
        "for TOA; it is forwarded without (and counted)",
        mode="fnat",
        family=4,
        proto="tcp",
        toa=True,
    )
    be = f.backend(1)
    full = [("NOP", None)] * 30 + [("Timestamp", (7, 8))]
    c.step(
        "SYN",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1),
    )
    c.step(
        "SYN-ACK",
        from_backend(1) / ip_hdr(f, be, f.laddr, ident=BACKEND_ID) / tcp(8080, FIRST_LPORT, "SA", seq=9, ack=2),
        "tx:0",
        from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63, ident=BACKEND_ID) / tcp(80, 40000, "SA", seq=9, ack=2),
    )
    c.step(
        "ACK with a full option space",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "A", seq=2, ack=10, options=full),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "A", seq=2, ack=10, options=full),
    )
    c.expect(sessions=1, toa_inserted=0, toa_skipped=1)


def _sum_for(chk):
    """The folded ones'-complement sum behind a checksum field value."""
    return (~chk) & 0xFFFF


def checksum_edge_cases():
    # NAT'd UDP whose checksum comes out as 0: sent as 0xffff (RFC 768). The last payload
    # word is chosen so that the output's sum folds to 0xffff; scapy then computes the field.
    f = V4
    c = Case(
        "udp_checksum_becomes_ffff_v4",
        "after NAT the UDP checksum computes to 0, which is sent as 0xffff (RFC 768)",
        mode="nat",
        family=4,
        proto="udp",
    )
    be = f.backend(1)

    def out(w):
        return to_backend(1) / ip_hdr(f, f.client, be, ttl=63) / udp(40000, 8080) / Raw(b"quer" + w.to_bytes(2, "big"))

    base = Ether(bytes(out(0)))[UDP].chksum
    w = (0xFFFF - _sum_for(base)) % 0x10000
    expected = out(w)
    assert Ether(bytes(expected))[UDP].chksum == 0xFFFF, "scapy did not land on 0xffff"
    c.step(
        "datagram",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / udp(40000, 53) / Raw(b"quer" + w.to_bytes(2, "big")),
        "tx:1",
        expected,
    )

    c = Case(
        "tcp_checksum_becomes_zero_fnat_v4",
        "after full NAT the TCP checksum is 0x0000 (a valid value for TCP, not replaced)",
        mode="fnat",
        family=4,
        proto="tcp",
    )

    def out_t(w):
        return to_backend(1) / ip_hdr(f, f.laddr, be, ttl=63) / tcp(FIRST_LPORT, 8080, "S", seq=1000) / Raw(w.to_bytes(2, "big"))

    base = Ether(bytes(out_t(0)))[TCP].chksum
    w = (0xFFFF - _sum_for(base)) % 0x10000
    expected = out_t(w)
    assert Ether(bytes(expected))[TCP].chksum == 0, "scapy did not land on 0"
    c.step(
        "SYN with two bytes of data",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1000) / Raw(w.to_bytes(2, "big")),
        "tx:1",
        expected,
    )

    c = Case(
        "udp_zero_checksum_nat_v4",
        "an IPv4 UDP datagram without checksum (0, RFC 768) keeps 0 through NAT both ways",
        mode="nat",
        family=4,
        proto="udp",
    )
    c.step(
        "query without checksum",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / UDP(sport=40000, dport=53, chksum=0) / Raw(b"query"),
        "tx:1",
        to_backend(1) / ip_hdr(f, f.client, be, ttl=63) / UDP(sport=40000, dport=8080, chksum=0) / Raw(b"query"),
    )
    c.step(
        "answer without checksum",
        from_backend(1) / ip_hdr(f, be, f.client, ident=BACKEND_ID) / UDP(sport=8080, dport=40000, chksum=0) / Raw(b"answer"),
        "tx:0",
        from_lb_ext() / ip_hdr(f, f.vip, f.client, ttl=63, ident=BACKEND_ID) / UDP(sport=53, dport=40000, chksum=0) / Raw(b"answer"),
    )


# 4. Inputs the pipeline refuses, by name, and frames it leaves to the kernel.

def fragment_cases():
    """A 3,000-byte UDP datagram in fragments, each way, through NAT and full NAT: the first
    fragment is translated like a whole datagram (ports, the L4 checksum of the whole), the later
    ones as their first one went (addresses, TTL); a later fragment before its first is dropped.
    Expected frames: scapy fragments the translated datagram at the same size."""
    payload = bytes(range(256)) * 11 + bytes(184)  # 3,000 bytes
    for f, mode in ((V4, "nat"), (V4, "fnat"), (V6, "nat"), (V6, "fnat")):
        c = Case(
            "fragments_%s_%s" % (mode, fam_name(f)),
            "a 3,000-byte UDP datagram in three fragments, to the VIP and back, through %s; then "
            "a later fragment of another datagram, whose first one never came" % mode,
            mode=mode,
            family=f.n,
            proto="udp",
        )
        be = f.backend(1)
        src_out, sport_out = (f.laddr, FIRST_LPORT) if mode == "fnat" else (f.client, 40000)

        def frags(pkt, ident):
            if f.v6:
                whole = pkt[IPv6]
                whole = IPv6(src=whole.src, dst=whole.dst, hlim=whole.hlim) / IPv6ExtHdrFragment(id=ident) / whole.payload
                return fragment6(whole, 1280)
            return fragment(pkt, fragsize=1480)

        def datagram(src, dst, sport, dport, ttl, ident):
            if f.v6:
                return IPv6(src=src, dst=dst, hlim=ttl) / UDP(sport=sport, dport=dport) / Raw(payload)
            return IP(src=src, dst=dst, ttl=ttl, id=ident, flags=0) / UDP(sport=sport, dport=dport) / Raw(payload)

        ins = frags(datagram(f.client, f.vip, 40000, 53, 64, CLIENT_ID), 0x1111)
        outs = frags(datagram(src_out, be, sport_out, 8080, 63, CLIENT_ID), 0x1111)
        assert len(ins) == len(outs) == 3
        for k, (i, o) in enumerate(zip(ins, outs)):
            c.step("to the VIP, fragment %d" % (k + 1), to_lb(f) / i, "tx:1", to_backend(1) / o)
        back_in = frags(datagram(be, src_out, 8080, sport_out, 64, BACKEND_ID), 0x2222)
        back_out = frags(datagram(f.vip, f.client, 53, 40000, 63, BACKEND_ID), 0x2222)
        for k, (i, o) in enumerate(zip(back_in, back_out)):
            c.step("the answer, fragment %d" % (k + 1), from_backend(1) / i, "tx:0", from_lb_ext() / o)
        other = frags(datagram(f.client, f.vip, 40001, 53, 64, CLIENT_ID + 1), 0x3333)
        c.step("a later fragment without its first", to_lb(f) / other[1], "drop:fragment_no_first")
        c.expect(sessions=1, fragments_forwarded=4, drop__fragment_no_first=1)
    c = Case(
        "drop_fragment_icmp_echo_v4",
        "a fragmented ICMP echo to the VIP: the LB does not reassemble, and no flow of its has it",
        mode="nat",
        proto="udp",
    )
    echo = IP(src=V4.client, dst=V4.vip, id=CLIENT_ID, flags=0) / ICMP(type=8, id=7, seq=1) / Raw(bytes(2000))
    c.step("the first fragment", to_lb(V4) / fragment(echo, fragsize=1480)[0], "drop:fragment")
    c.expect(sessions=0, drop__fragment=1)


def drop_cases():
    f = V4
    good = to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(40000, 80, "S", seq=1000)

    def case(name, description, frame, verdict, proto="tcp", family=4, mode="nat"):
        c = Case(name, description, mode=mode, family=family, proto=proto)
        c.step(name.replace("_", " "), frame, verdict)
        if verdict.startswith("drop:"):
            c.expect(sessions=0, **{"drop__" + verdict[5:]: 1})
        else:
            c.expect(sessions=0)

    case("drop_runt", "a 5-byte frame", b"\x00" * 5, "drop:truncated")
    case("drop_ipv4_header_truncated", "the frame ends 12 bytes into the IPv4 header", bytes(good)[: 14 + 12], "drop:truncated")
    case(
        "drop_ipv4_total_length_long",
        "the IPv4 total length (200) runs past the frame (header checksum valid)",
        to_lb(f) / IP(src=f.client, dst=f.vip, id=CLIENT_ID, flags="DF", len=200) / tcp(40000, 80, "S", seq=1000),
        "drop:truncated",
    )
    case(
        "drop_ipv4_ihl_below_5",
        "IPv4 IHL 4",
        to_lb(f) / IP(src=f.client, dst=f.vip, id=CLIENT_ID, flags="DF", ihl=4) / tcp(40000, 80, "S", seq=1000),
        "drop:malformed",
    )
    good_ck = IP(bytes(good[IP])).chksum
    case(
        "drop_ipv4_bad_checksum",
        "IPv4 header checksum wrong",
        to_lb(f) / IP(src=f.client, dst=f.vip, id=CLIENT_ID, flags="DF", chksum=good_ck ^ 0xff) / tcp(40000, 80, "S", seq=1000),
        "drop:bad_checksum",
    )
    case(
        "drop_tcp_data_offset_below_5",
        "TCP data offset 4",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / TCP(sport=40000, dport=80, flags="S", seq=1000, window=65535, dataofs=4),
        "drop:malformed",
    )
    case(
        "drop_tcp_header_cut_short",
        "a 10-byte TCP header (IPv4 total length 30, header checksum valid)",
        to_lb(f) / IP(src=f.client, dst=f.vip, id=CLIENT_ID, flags="DF", proto=6) / Raw(bytes(tcp(40000, 80, "S", seq=1000))[:10]),
        "drop:truncated",
    )
    case(
        "drop_ipv6_payload_length_long",
        "the IPv6 payload length (200) runs past the frame",
        to_lb(V6) / IPv6(src=V6.client, dst=V6.vip, plen=200) / udp(40000, 53) / Raw(b"query"),
        "drop:truncated",
        proto="udp",
        family=6,
    )
    case(
        "drop_udp_length_long",
        "the UDP length (99) runs past the IP packet",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / UDP(sport=40000, dport=53, len=99) / Raw(b"query"),
        "drop:truncated",
        proto="udp",
    )
    case(
        "drop_udp_length_short",
        "the UDP length (10) is shorter than the IP payload (13): refused as malformed (the "
        "LB's policy, as its parser's unit tests state; Linux would trim the surplus instead)",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / UDP(sport=40000, dport=53, len=10) / Raw(b"query"),
        "drop:malformed",
        proto="udp",
    )
    case(
        "drop_gre_to_vip",
        "GRE (protocol 47) to the VIP: not served",
        to_lb(f) / IP(src=f.client, dst=f.vip, id=CLIENT_ID, flags="DF", proto=47) / Raw(b"\x00" * 8),
        "drop:unsupported_protocol",
    )
    case(
        "drop_ack_without_session",
        "a TCP ACK to the VIP with no session is dropped, not scheduled",
        to_lb(f) / ip_hdr(f, f.client, f.vip) / tcp(1, 80, "A"),
        "drop:no_session",
    )
    case(
        "kernel_arp",
        "an ARP request for the VIP goes to the kernel",
        Ether(src=ROUTER_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=ROUTER_MAC, psrc="10.0.0.254", hwdst="00:00:00:00:00:00", pdst=f.vip),
        "kernel",
    )
    case(
        "kernel_ssh_to_port_address",
        "TCP to the ext port's own address (SSH) goes to the kernel",
        to_lb(f) / ip_hdr(f, f.client, f.ext_addr) / tcp(5000, 22, "S"),
        "kernel",
    )


# --- Output -----------------------------------------------------------------------------------


def pretty(v, indent=0, width=110):
    """JSON with every object or array that fits on one line written on one line."""
    flat = json.dumps(v, separators=(", ", ": "))
    if not isinstance(v, (dict, list)) or len(flat) + indent <= width:
        return flat
    pad = " " * (indent + 2)
    if isinstance(v, dict):
        items = ["%s%s: %s" % (pad, json.dumps(k), pretty(x, indent + 2, width)) for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + pretty(x, indent + 2, width) for x in v]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def main():
    forward_matrix()
    icmp_cases()
    feature_cases()
    toa_option_cases()
    checksum_edge_cases()
    fragment_cases()
    drop_cases()
    os.makedirs(PCAP_DIR, exist_ok=True)
    wanted = set()
    for c in CASES:
        path = os.path.join(HERE, c.json()["pcap"])
        wanted.add(os.path.basename(path))
        pkts = []
        for i, b in enumerate(c.frames):
            p = Raw(b)
            p.time = i  # deterministic timestamps: regenerating changes nothing
            pkts.append(p)
        # Raw records with link type Ethernet (1): scapy warns that Raw is not Ethernet.
        logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
        wrpcap(path, pkts, linktype=1)
        back = [bytes(p) for p in rdpcap(path)]
        assert back == c.frames, c.name
    for old in os.listdir(PCAP_DIR):
        if old.endswith(".pcap") and old not in wanted:
            os.remove(os.path.join(PCAP_DIR, old))
    table = {
        "generator": "crates/lb/tests/golden/gen.py",
        "scapy_version": SCAPY_VERSION,
        "cases": [c.json() for c in CASES],
    }
    with open(os.path.join(HERE, "fixtures.json"), "w") as fh:
        fh.write(pretty(table) + "\n")
    steps = sum(len(c.steps) for c in CASES)
    print("%d cases, %d steps, %d frames (scapy %s)" % (len(CASES), steps, sum(len(c.frames) for c in CASES), SCAPY_VERSION), file=sys.stderr)


if __name__ == "__main__":
    main()
