/* vectorlb's XDP flow director, attached by the af_xdp PMD (xdp_prog=...).
 *
 * It sends to the data plane (the AF_XDP socket of the receiving queue) only what the load
 * balancer owns, and passes everything else to the kernel, so the host keeps its SSH, BGP and
 * VRRP traffic on the same interface:
 *   - IPv4 / IPv6 packets to one of our addresses (interface addresses, VIPs, local addresses),
 *   - packets from a NAT backend (their replies come back through us) or from an SNAT source,
 *     unless they are addressed to the host kernel's own addresses (its health checks, pings),
 *   - ARP whose target is ours, IPv6 neighbour solicitations whose target is ours.
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
	return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "GPL";
