/* vectorlb's decapsulation for TUN-mode backends (docs/scale-out.md), attached by
 * `vectorlb decap attach IFACE` on a backend host whose kernel has no ipip / ip6_tunnel module.
 *
 * A packet the load balancer tunnelled to this host (IPv4 in IPv4: protocol 4; IPv6 in IPv4:
 * protocol 41; IPv6 in IPv6: next header 41; IPv4 in IPv6: next header 4) loses its outer
 * header here and goes on to the kernel as the client sent it: to the VIP, which the host holds
 * on its loopback, so the reply goes straight to the client. Everything else passes untouched.
 * With `--from`, only tunnels from those prefixes (the load balancers' addresses) are opened;
 * others are dropped and counted: an open decapsulator lets anyone who reaches the host inject
 * packets with any inner source. Outer fragments, outer IPv6 extension headers and inner
 * headers that do not match their outer protocol are never opened (passed or dropped, counted). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct net_key {
	__u32 prefixlen; /* 8 (the family byte) + the prefix length */
	__u8 family;     /* 4 or 6 */
	__u8 addr[16];
} __attribute__((packed));

/* Tunnel sources allowed (when DECAP_RESTRICT is set). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__type(key, struct net_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} vl_decap_from SEC(".maps");

#define DECAP_RESTRICT 1

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} vl_decap_conf SEC(".maps");

/* Counters, one per outcome (the order of DecapStats in xdp.rs). */
enum {
	ST_V4IN4,
	ST_V6IN4,
	ST_V6IN6,
	ST_V4IN6,
	ST_NOT_ALLOWED, /* a tunnel from a source not in vl_decap_from: dropped */
	ST_MALFORMED,   /* an inner header that is not what the outer one says: dropped */
	ST_FRAGMENT,    /* an outer fragment or extension header: passed (the kernel drops it) */
	ST_COUNT,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[ST_COUNT]);
} vl_decap_stats SEC(".maps");

static __always_inline void count(int what)
{
	__u32 k = 0;
	__u64 *s = bpf_map_lookup_elem(&vl_decap_stats, &k);
	if (s && what >= 0 && what < ST_COUNT)
		s[what]++;
}

static __always_inline int allowed(struct net_key *k)
{
	__u32 z = 0;
	__u32 *conf = bpf_map_lookup_elem(&vl_decap_conf, &z);
	if (!conf || !(*conf & DECAP_RESTRICT))
		return 1;
	return bpf_map_lookup_elem(&vl_decap_from, k) != 0;
}

SEC("xdp")
int vectorlb_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	struct net_key k = {};
	int off, stat;
	__u8 inner_version;
	__u16 inner_proto;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		if (ip->protocol != IPPROTO_IPIP && ip->protocol != IPPROTO_IPV6)
			return XDP_PASS;
		if (ip->ihl < 5) {
			count(ST_MALFORMED);
			return XDP_DROP;
		}
		if (ip->frag_off & bpf_htons(0x3fff)) {
			count(ST_FRAGMENT);
			return XDP_PASS;
		}
		off = ip->ihl * 4;
		k.prefixlen = 8 + 32;
		k.family = 4;
		__builtin_memcpy(k.addr, &ip->saddr, 4);
		if (ip->protocol == IPPROTO_IPIP) {
			inner_version = 4, inner_proto = ETH_P_IP, stat = ST_V4IN4;
		} else {
			inner_version = 6, inner_proto = ETH_P_IPV6, stat = ST_V6IN4;
		}
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		if (ip6->nexthdr != IPPROTO_IPV6 && ip6->nexthdr != IPPROTO_IPIP) {
			/* A tunnel behind extension headers is not opened (the LB sends none). */
			if (ip6->nexthdr == 0 || ip6->nexthdr == 43 || ip6->nexthdr == 44 || ip6->nexthdr == 60)
				count(ST_FRAGMENT);
			return XDP_PASS;
		}
		off = sizeof(*ip6);
		k.prefixlen = 8 + 128;
		k.family = 6;
		__builtin_memcpy(k.addr, &ip6->saddr, 16);
		if (ip6->nexthdr == IPPROTO_IPV6) {
			inner_version = 6, inner_proto = ETH_P_IPV6, stat = ST_V6IN6;
		} else {
			inner_version = 4, inner_proto = ETH_P_IP, stat = ST_V4IN6;
		}
	} else {
		return XDP_PASS;
	}
	if (!allowed(&k)) {
		count(ST_NOT_ALLOWED);
		return XDP_DROP;
	}
	/* The inner header must be there, whole, and of the version the outer one announces. */
	__u8 *inner = (__u8 *)(eth + 1) + (off & 0x3f);
	__u32 need = inner_version == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if ((void *)(inner + need) > end || (inner[0] >> 4) != inner_version) {
		count(ST_MALFORMED);
		return XDP_DROP;
	}
	/* Move the Ethernet header forward over the outer IP header, then drop what precedes it. */
	struct ethhdr e;
	__builtin_memcpy(&e, eth, sizeof(e));
	e.h_proto = bpf_htons(inner_proto);
	if (bpf_xdp_adjust_head(ctx, off & 0x3f))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth, &e, sizeof(e));
	count(stat);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
