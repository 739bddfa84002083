/* vectorlb's XDP flow director, attached by the af_xdp PMD (xdp_prog=...).
 *
 * It sends to the data plane (the AF_XDP socket of the receiving queue) only what the load
 * balancer owns, and passes everything else to the kernel, so the host keeps its SSH, BGP and
 * VRRP traffic on the same interface:
 *   - IPv4 / IPv6 packets to one of our addresses (interface addresses, VIPs, local addresses),
 *   - packets from a NAT backend (their replies come back through us) or from an SNAT source,
 *     unless they are addressed to the host kernel's own addresses (its health checks, pings),
 *   - ARP whose target is ours, IPv6 neighbour solicitations whose target is ours.
 * Of what is ours, it counts each queue set's packets (docs/queue-sets.md) and polices the
 * default set (everything outside the sets): above its ingress rate it drops them here, before
 * the shared receive ring, so a set's packets find room on the ring and a worker soon.
 * The daemon fills the maps after the PMD has loaded the program. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define FLAG_DST 1 /* traffic to this address is ours */
#define FLAG_SRC 2 /* traffic from this address is ours (a NAT backend) */
#define FLAG_HOST 4 /* the host kernel's own address: traffic to it is the kernel's */

struct addr_key {
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16];
};

struct net_key {
	__u32 prefixlen; /* 8 (the family byte) + the prefix length */
	__u8 family;
	__u8 addr[16];
} __attribute__((packed));

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct addr_key);
	__type(value, __u32);
} vl_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct net_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} vl_srcnets SEC(".maps");

/* Queue sets: a TCP or UDP packet's set, by its service (dir 0: destination VIP, port,
 * protocol) or by the backend it comes from (dir 1: source address, port, protocol; replies
 * of NAT services); a packet without ports by its destination alone (dir 2: a set's VIP,
 * protocol and port 0). Value: the set's index (below QS_DEFAULT). */
struct qs_key {
	__u8 family;
	__u8 proto;
	__u8 dir;
	__u8 pad;
	__u16 port; /* network order */
	__u8 pad2[2];
	__u8 addr[16];
};

#define QS_DEFAULT 64 /* the default set's index in vl_qs_stats */
#define QS_CLASSIFY 1 /* vl_qs_conf.flags: there are queue sets */
#define QS_POLICE 2   /* vl_qs_conf.flags: the default set has an ingress limit */
#define QS_ANYPORT 4  /* vl_qs_conf.flags: some keys have port 0 (every port) */

/* The daemon's settings, and the policer's state: a virtual-scheduling policer (GCRA) per
 * limit, whose theoretical arrival time runs ahead of the clock by at most the burst. */
struct qs_conf {
	__u64 flags;
	__u64 ns_per_pkt;  /* 0: no packet rate */
	__u64 ps_per_byte; /* 0: no byte rate (picoseconds per byte) */
	__u64 burst_ns;
	__u64 tat_pkt;  /* bpf_ktime_get_ns() time */
	__u64 tat_byte;
};

struct qs_stats {
	__u64 packets;
	__u64 bytes;
	__u64 policed;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct qs_key);
	__type(value, __u32);
} vl_qs_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qs_conf);
} vl_qs_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, QS_DEFAULT + 1);
	__type(key, __u32);
	__type(value, struct qs_stats);
} vl_qs_stats SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

static __always_inline int has(__u8 family, const void *a, int len, __u32 flag)
{
	struct addr_key k = {};
	k.family = family;
	__builtin_memcpy(k.addr, a, 16);
	if (len == 4)
		__builtin_memset(k.addr + 4, 0, 12);
	__u32 *v = bpf_map_lookup_elem(&vl_addrs, &k);
	return v && (*v & flag);
}

static __always_inline int src_net(__u8 family, const void *a, int len)
{
	struct net_key k = {};
	k.prefixlen = 8 + len * 8;
	k.family = family;
	__builtin_memcpy(k.addr, a, 16);
	if (len == 4)
		__builtin_memset(k.addr + 4, 0, 12);
	return bpf_map_lookup_elem(&vl_srcnets, &k) != 0;
}

/* Whether a packet conforms to the limit whose theoretical arrival time is *tat (then
 * `charge` adds its cost). Updates from two CPUs at once may lose a packet's worth. */
static __always_inline int conforms(__u64 *tat, __u64 now, __u64 burst)
{
	__u64 t = *(volatile __u64 *)tat;
	return t <= now || t - now <= burst;
}

static __always_inline void charge(__u64 *tat, __u64 now, __u64 cost)
{
	__u64 t = *(volatile __u64 *)tat;
	if (t < now)
		*(volatile __u64 *)tat = now;
	__sync_fetch_and_add(tat, cost);
}

static __always_inline void qs_lookup(__u32 *set, __u64 flags, __u8 family, __u8 proto, __u8 dir, __u16 port, const void *a, int len)
{
	if (*set != QS_DEFAULT)
		return;
	struct qs_key k = {};
	k.family = family;
	k.proto = proto;
	k.dir = dir;
	k.port = port;
	__builtin_memcpy(k.addr, a, 16);
	if (len == 4)
		__builtin_memset(k.addr + 4, 0, 12);
	__u32 *v = bpf_map_lookup_elem(&vl_qs_flows, &k);
	if (!v && (flags & QS_ANYPORT)) {
		k.port = 0;
		v = bpf_map_lookup_elem(&vl_qs_flows, &k);
	}
	if (v && *v < QS_DEFAULT)
		*set = *v;
}

/* ICMP errors (they carry a set's flows back too) and IPv6 neighbour discovery: never policed. */
static __always_inline int exempt_icmp(__u8 type, int v6)
{
	if (v6)
		return type <= 4 || (type >= 133 && type <= 137);
	return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
}

/* The queue set of an IP packet that is ours: counts it; XDP_DROP when the default set's
 * policer refuses it, else -1. Packets without ports (later IPv4 fragments, IPv6 with
 * extension headers) go by their destination address alone (dir 2 keys: a VIP of a set's
 * service). ICMP errors and neighbour discovery are counted but never policed. */
static __always_inline int queue_set(struct xdp_md *ctx, void *l3, void *end, __u16 proto)
{
	__u32 zero = 0;
	struct qs_conf *c = bpf_map_lookup_elem(&vl_qs_conf, &zero);
	if (!c || !c->flags)
		return -1;
	__u32 set = QS_DEFAULT;
	int exempt = 0;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end)
			return -1;
		__u32 ihl = ip->ihl * 4;
		__u8 d[16] = {}, s[16] = {};
		__builtin_memcpy(d, &ip->daddr, 4);
		__builtin_memcpy(s, &ip->saddr, 4);
		int later = (ip->frag_off & bpf_htons(0x1fff)) != 0;
		if (ihl >= 20 && !later) {
			__u8 *l4 = (void *)ip + ihl;
			if (ip->protocol == IPPROTO_ICMP && (void *)(l4 + 1) <= end)
				exempt = exempt_icmp(l4[0], 0);
			if ((c->flags & QS_CLASSIFY) && (ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) &&
			    (void *)(l4 + 4) <= end) {
				__u16 *ports = (__u16 *)l4;
				qs_lookup(&set, c->flags, 4, ip->protocol, 0, ports[1], d, 4);
				qs_lookup(&set, c->flags, 4, ip->protocol, 1, ports[0], s, 4);
			}
		} else if (later && (c->flags & QS_CLASSIFY)) {
			qs_lookup(&set, 0, 4, 0, 2, 0, d, 4);
		}
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > end)
			return -1;
		__u8 *l4 = (void *)(ip6 + 1);
		if (ip6->nexthdr == IPPROTO_ICMPV6) {
			if ((void *)(l4 + 1) <= end)
				exempt = exempt_icmp(l4[0], 1);
		} else if (c->flags & QS_CLASSIFY) {
			if ((ip6->nexthdr == IPPROTO_TCP || ip6->nexthdr == IPPROTO_UDP) && (void *)(l4 + 4) <= end) {
				__u16 *ports = (__u16 *)l4;
				qs_lookup(&set, c->flags, 6, ip6->nexthdr, 0, ports[1], &ip6->daddr, 16);
				qs_lookup(&set, c->flags, 6, ip6->nexthdr, 1, ports[0], &ip6->saddr, 16);
			} else if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP) {
				qs_lookup(&set, 0, 6, 0, 2, 0, &ip6->daddr, 16);
			}
		}
	}
	struct qs_stats *st = bpf_map_lookup_elem(&vl_qs_stats, &set);
	if (!st)
		return -1;
	__u64 len = (__u64)(end - (void *)(long)ctx->data);
	if (set == QS_DEFAULT && !exempt && (c->flags & QS_POLICE)) {
		__u64 now = bpf_ktime_get_ns();
		int ok = (!c->ns_per_pkt || conforms(&c->tat_pkt, now, c->burst_ns)) &&
			 (!c->ps_per_byte || conforms(&c->tat_byte, now, c->burst_ns));
		if (!ok) {
			st->policed++;
			return XDP_DROP;
		}
		if (c->ns_per_pkt)
			charge(&c->tat_pkt, now, c->ns_per_pkt);
		if (c->ps_per_byte)
			charge(&c->tat_byte, now, (len * c->ps_per_byte + 999) / 1000);
	}
	st->packets++;
	st->bytes += len;
	return -1;
}

SEC("xdp")
int vl_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	__u16 proto = eth->h_proto;
	void *l3 = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q)) {
		struct vlan_hdr *v = l3;
		if ((void *)(v + 1) > end)
			return XDP_PASS;
		proto = v->proto;
		l3 = v + 1;
	}
	int ours = 0;
	if (proto == bpf_htons(ETH_P_ARP)) {
		/* Ethernet/IPv4 ARP: the target protocol address is at byte 24. */
		__u8 *arp = l3;
		if ((void *)(arp + 28) > end)
			return XDP_PASS;
		__u8 a[16] = {};
		__builtin_memcpy(a, arp + 24, 4);
		ours = has(4, a, 4, FLAG_DST);
	} else if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		__u8 d[16] = {}, s[16] = {};
		__builtin_memcpy(d, &ip->daddr, 4);
		__builtin_memcpy(s, &ip->saddr, 4);
		ours = has(4, d, 4, FLAG_DST) ||
		       (!has(4, d, 4, FLAG_HOST) && (has(4, s, 4, FLAG_SRC) || src_net(4, s, 4)));
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		ours = has(6, &ip6->daddr, 16, FLAG_DST) ||
		       (!has(6, &ip6->daddr, 16, FLAG_HOST) &&
			(has(6, &ip6->saddr, 16, FLAG_SRC) || src_net(6, &ip6->saddr, 16)));
		if (!ours && ip6->nexthdr == IPPROTO_ICMPV6) {
			/* Neighbour solicitation (135) for one of our addresses: target at byte 8. */
			__u8 *icmp = (__u8 *)(ip6 + 1);
			if ((void *)(icmp + 24) <= end && icmp[0] == 135)
				ours = has(6, icmp + 8, 16, FLAG_DST);
		}
	}
	if (!ours)
		return XDP_PASS;
	if (proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_IPV6)) {
		int v = queue_set(ctx, l3, end, proto);
		if (v >= 0)
			return v;
	}
	return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "GPL";
