/* vectorlb's mesh: inside the node proxy's network namespace (docs/mesh.md), a socket lookup
 * program hands every new TCP connection to the proxy's listeners, whatever address and port it
 * is for: those for the tunnel port to the inbound listener (key 1), all others to the outbound
 * listener (key 0). The data plane steers meshed pods' connections there unchanged and the
 * namespace delivers every address locally, so the accepted socket's own address is where the
 * pod meant to go: no iptables, no nftables, no address rewriting. Established connections are
 * found before this runs; UDP and everything while a listener is missing pass as they would. */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} vl_mesh_socks SEC(".maps");

/* Key 0: the tunnel port (host byte order); key 1: the pod interface's index (0: any). Only
 * connections arriving on that interface are steered: the namespace's own (its loopback, the
 * proxy's metrics) go where they are addressed, and the proxy's connections never come back to
 * it (one that did went round until the descriptors ran out). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} vl_mesh_conf SEC(".maps");

SEC("sk_lookup")
int vectorlb_mesh(struct bpf_sk_lookup *ctx)
{
	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	__u32 zero = 0, one = 1;
	__u32 *tunnel = bpf_map_lookup_elem(&vl_mesh_conf, &zero);
	__u32 *ifindex = bpf_map_lookup_elem(&vl_mesh_conf, &one);
	if (!tunnel || !ifindex)
		return SK_PASS;
	if (*ifindex && ctx->ingress_ifindex != *ifindex)
		return SK_PASS;
	__u32 key = ctx->local_port == *tunnel ? 1 : 0;
	struct bpf_sock *sk = bpf_map_lookup_elem(&vl_mesh_socks, &key);
	if (!sk)
		return SK_PASS;
	bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
