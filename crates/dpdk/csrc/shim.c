/* vectorlb's C shim over DPDK 22.11 and libbpf.
 *
 * DPDK's burst functions and most mbuf helpers are static inline, so Rust cannot call them
 * directly: this file gives each a small exported wrapper. Everything returns 0 or a negative
 * errno; strings for errors come from vl_strerror. Only this file includes DPDK headers. */
/* dmadev is still marked experimental in 22.11 (its ABI may change between releases; we build
 * against the installed headers, so a change fails the build, not the run). */
#define ALLOW_EXPERIMENTAL_API
#include <errno.h>
#include <net/if.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_bus_vdev.h>
#include <rte_dmadev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_eventdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_flow.h>
#include <rte_ring.h>
#include <rte_service.h>
#include <rte_service_component.h>

#include <linux/if_link.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

/* The Rust side reads and writes these mbuf fields directly on the hot path (see mbuf.rs).
 * If a DPDK release moves them, the build fails here instead of corrupting packets. */
_Static_assert(offsetof(struct rte_mbuf, buf_addr) == 0, "buf_addr");
_Static_assert(offsetof(struct rte_mbuf, data_off) == 16, "data_off");
_Static_assert(offsetof(struct rte_mbuf, nb_segs) == 20, "nb_segs");
_Static_assert(offsetof(struct rte_mbuf, port) == 22, "port");
_Static_assert(offsetof(struct rte_mbuf, ol_flags) == 24, "ol_flags");
_Static_assert(offsetof(struct rte_mbuf, pkt_len) == 36, "pkt_len");
_Static_assert(offsetof(struct rte_mbuf, data_len) == 40, "data_len");
_Static_assert(offsetof(struct rte_mbuf, buf_len) == 54, "buf_len");
/* tx_offload holds a pod frame's offload (mbuf.rs); rte_pktmbuf_reset clears it. */
_Static_assert(offsetof(struct rte_mbuf, tx_offload) == 72, "tx_offload");
_Static_assert(sizeof(((struct rte_mbuf *)0)->tx_offload) == 8, "tx_offload size");
/* The receive hash (RSS) at 44; the 4 bytes after it (hash.fdir.hi, hash.sched's class and
 * colour) hold vectorlb's receive queue (u16 at 48) and class (u8 at 50). */
_Static_assert(offsetof(struct rte_mbuf, hash) == 44, "hash");
_Static_assert(sizeof(((struct rte_mbuf *)0)->hash) == 8, "hash size");

int vl_eal_init(int argc, char **argv)
{
	int r = rte_eal_init(argc, argv);
	return r < 0 ? -rte_errno : r;
}

int vl_eal_cleanup(void) { return rte_eal_cleanup(); }
const char *vl_runtime_dir(void) { return rte_eal_get_runtime_dir(); }
const char *vl_strerror(int e) { return rte_strerror(e < 0 ? -e : e); }
int vl_thread_register(void) { return rte_thread_register() < 0 ? -rte_errno : 0; }
void vl_thread_unregister(void) { rte_thread_unregister(); }
unsigned vl_lcore_id(void) { return rte_lcore_id(); }
int vl_socket_id(void) { return (int)rte_socket_id(); }

struct rte_mempool *vl_pool_create(const char *name, unsigned n, unsigned cache, uint16_t data_room,
				   int socket, int *err)
{
	struct rte_mempool *mp = rte_pktmbuf_pool_create(name, n, cache, 0, data_room, socket);
	if (!mp)
		*err = -rte_errno;
	return mp;
}

void vl_pool_free(struct rte_mempool *mp) { rte_mempool_free(mp); }
unsigned vl_pool_avail(struct rte_mempool *mp) { return rte_mempool_avail_count(mp); }
struct rte_mbuf *vl_mbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }
int vl_mbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **m, unsigned n) { return rte_pktmbuf_alloc_bulk(mp, m, n); }
void vl_mbuf_free_bulk(struct rte_mbuf **m, unsigned n) { rte_pktmbuf_free_bulk(m, n); }
void vl_mbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

int vl_port_by_name(const char *name, uint16_t *port)
{
	return rte_eth_dev_get_port_by_name(name, port);
}

uint16_t vl_port_count(void) { return rte_eth_dev_count_avail(); }

int vl_port_name(uint16_t port, char *out, size_t len)
{
	char name[RTE_ETH_NAME_MAX_LEN];
	int r = rte_eth_dev_get_name_by_port(port, name);
	if (r)
		return r;
	snprintf(out, len, "%s", name);
	return 0;
}

struct vl_port_info {
	uint16_t max_rx_queues;
	uint16_t max_tx_queues;
	uint32_t max_rx_pktlen;
	uint64_t rss_offloads;
	char driver[64];
};

int vl_port_info(uint16_t port, struct vl_port_info *out)
{
	struct rte_eth_dev_info info;
	int r = rte_eth_dev_info_get(port, &info);
	if (r)
		return r;
	out->max_rx_queues = info.max_rx_queues;
	out->max_tx_queues = info.max_tx_queues;
	out->max_rx_pktlen = info.max_rx_pktlen;
	out->rss_offloads = info.flow_type_rss_offloads;
	snprintf(out->driver, sizeof(out->driver), "%s", info.driver_name ? info.driver_name : "?");
	return 0;
}

/* RSS over the IP addresses and L4 ports, limited to what the device supports. */
int vl_port_configure(uint16_t port, uint16_t nrxq, uint16_t ntxq, uint16_t mtu)
{
	struct rte_eth_conf conf;
	struct rte_eth_dev_info info;
	int r = rte_eth_dev_info_get(port, &info);
	if (r)
		return r;
	memset(&conf, 0, sizeof(conf));
	if (nrxq > 1) {
		uint64_t hf = (RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
		if (hf) {
			conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
			conf.rx_adv_conf.rss_conf.rss_hf = hf;
		}
	}
	r = rte_eth_dev_configure(port, nrxq, ntxq, &conf);
	if (r)
		return r;
	if (mtu) {
		r = rte_eth_dev_set_mtu(port, mtu);
		if (r && r != -ENOTSUP)
			return r;
	}
	return 0;
}

int vl_rx_queue_setup(uint16_t port, uint16_t q, uint16_t desc, int socket, struct rte_mempool *mp)
{
	uint16_t nb_rx = desc, nb_tx = 0;
	int r = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rx, &nb_tx);
	if (r)
		return r;
	return rte_eth_rx_queue_setup(port, q, nb_rx, socket < 0 ? SOCKET_ID_ANY : socket, NULL, mp);
}

int vl_tx_queue_setup(uint16_t port, uint16_t q, uint16_t desc, int socket)
{
	uint16_t nb_rx = 0, nb_tx = desc;
	int r = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rx, &nb_tx);
	if (r)
		return r;
	return rte_eth_tx_queue_setup(port, q, nb_tx, socket < 0 ? SOCKET_ID_ANY : socket, NULL);
}

int vl_port_start(uint16_t port) { return rte_eth_dev_start(port); }
int vl_port_stop(uint16_t port) { return rte_eth_dev_stop(port); }
int vl_port_close(uint16_t port) { return rte_eth_dev_close(port); }
int vl_promiscuous(uint16_t port, int on)
{
	return on ? rte_eth_promiscuous_enable(port) : rte_eth_promiscuous_disable(port);
}

int vl_port_mac(uint16_t port, uint8_t out[6])
{
	struct rte_ether_addr a;
	int r = rte_eth_macaddr_get(port, &a);
	if (r)
		return r;
	memcpy(out, a.addr_bytes, 6);
	return 0;
}

int vl_set_mac(uint16_t port, const uint8_t mac[6])
{
	struct rte_ether_addr a;
	memcpy(a.addr_bytes, mac, 6);
	return rte_eth_dev_default_mac_addr_set(port, &a);
}

int vl_link(uint16_t port, uint32_t *speed, int *up)
{
	struct rte_eth_link l;
	int r = rte_eth_link_get_nowait(port, &l);
	if (r)
		return r;
	*speed = l.link_speed;
	*up = l.link_status;
	return 0;
}

struct vl_stats {
	uint64_t ipackets, opackets, ibytes, obytes, imissed, ierrors, oerrors, rx_nombuf;
};

int vl_stats(uint16_t port, struct vl_stats *s)
{
	struct rte_eth_stats st;
	int r = rte_eth_stats_get(port, &st);
	if (r)
		return r;
	s->ipackets = st.ipackets;
	s->opackets = st.opackets;
	s->ibytes = st.ibytes;
	s->obytes = st.obytes;
	s->imissed = st.imissed;
	s->ierrors = st.ierrors;
	s->oerrors = st.oerrors;
	s->rx_nombuf = st.rx_nombuf;
	return 0;
}

/* Extended statistics: names are 64-byte NUL-terminated slots. Returns the count, which may be
 * above `n` (then call again with more room). */
int vl_xstats(uint16_t port, char *names, uint64_t *values, int n)
{
	int count = rte_eth_xstats_get_names(port, NULL, 0);
	if (count < 0 || count > n || !names)
		return count;
	struct rte_eth_xstat_name xn[count];
	struct rte_eth_xstat xs[count];
	if (rte_eth_xstats_get_names(port, xn, count) != count)
		return -EAGAIN;
	if (rte_eth_xstats_get(port, xs, count) != count)
		return -EAGAIN;
	for (int i = 0; i < count; i++) {
		snprintf(names + 64 * i, 64, "%s", xn[i].name);
		values[i] = xs[i].value;
	}
	return count;
}

uint16_t vl_rx_burst(uint16_t port, uint16_t q, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, q, pkts, n);
}

uint16_t vl_tx_burst(uint16_t port, uint16_t q, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, q, pkts, n);
}

struct rte_ring *vl_ring_create(const char *name, unsigned count, int socket, int *err)
{
	/* Many producers (any worker), one consumer (the owner). */
	struct rte_ring *r = rte_ring_create(name, count, socket < 0 ? SOCKET_ID_ANY : socket, RING_F_SC_DEQ);
	if (!r)
		*err = -rte_errno;
	return r;
}

void vl_ring_free(struct rte_ring *r) { rte_ring_free(r); }

unsigned vl_ring_enqueue_burst(struct rte_ring *r, void **objs, unsigned n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned vl_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n, unsigned *left)
{
	return rte_ring_dequeue_burst(r, objs, n, left);
}

/* Packets waiting on a receive queue, or a negative errno (-ENOTSUP: the driver cannot say). */
int vl_rx_queue_count(uint16_t port, uint16_t q)
{
	return rte_eth_rx_queue_count(port, q);
}

/* ---- flow rules (queue sets on NICs with rte_flow) ------------------------------------------
 * A rule sends the packets of one service (destination address, protocol, destination port;
 * family 0 with nothing else: every IP packet) to `queues` of the port: one queue, or RSS over
 * several. Lower `priority` values win. On failure `err` holds the driver's reason. */
struct rte_flow *vl_flow_queues(uint16_t port, uint32_t priority, uint8_t family, uint8_t proto,
				const uint8_t *addr, uint16_t dport, const uint16_t *queues, uint16_t nq,
				char *err, int errlen)
{
	struct rte_flow_attr attr = { .ingress = 1, .priority = priority };
	struct rte_flow_item pattern[4];
	struct rte_flow_item_ipv4 ip4 = {}, ip4m = {};
	struct rte_flow_item_ipv6 ip6 = {}, ip6m = {};
	struct rte_flow_item_tcp tcp = {}, tcpm = {};
	struct rte_flow_item_udp udp = {}, udpm = {};
	memset(pattern, 0, sizeof(pattern));
	int n = 0;
	pattern[n++].type = RTE_FLOW_ITEM_TYPE_ETH;
	if (family == 4) {
		memcpy(&ip4.hdr.dst_addr, addr, 4);
		ip4m.hdr.dst_addr = 0xffffffff;
		pattern[n].type = RTE_FLOW_ITEM_TYPE_IPV4;
		pattern[n].spec = &ip4;
		pattern[n++].mask = &ip4m;
	} else if (family == 6) {
		memcpy(ip6.hdr.dst_addr, addr, 16);
		memset(ip6m.hdr.dst_addr, 0xff, 16);
		pattern[n].type = RTE_FLOW_ITEM_TYPE_IPV6;
		pattern[n].spec = &ip6;
		pattern[n++].mask = &ip6m;
	}
	if (family && proto == IPPROTO_TCP) {
		tcp.hdr.dst_port = rte_cpu_to_be_16(dport);
		tcpm.hdr.dst_port = dport ? 0xffff : 0;
		pattern[n].type = RTE_FLOW_ITEM_TYPE_TCP;
		pattern[n].spec = &tcp;
		pattern[n++].mask = &tcpm;
	} else if (family && proto == IPPROTO_UDP) {
		udp.hdr.dst_port = rte_cpu_to_be_16(dport);
		udpm.hdr.dst_port = dport ? 0xffff : 0;
		pattern[n].type = RTE_FLOW_ITEM_TYPE_UDP;
		pattern[n].spec = &udp;
		pattern[n++].mask = &udpm;
	}
	pattern[n].type = RTE_FLOW_ITEM_TYPE_END;
	struct rte_flow_action_queue q = { .index = nq ? queues[0] : 0 };
	/* The hash types the device supports (as the port's own RSS setup does). */
	struct rte_eth_dev_info info;
	uint64_t types = RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP;
	if (rte_eth_dev_info_get(port, &info) == 0)
		types &= info.flow_type_rss_offloads;
	struct rte_flow_action_rss rss = {
		.func = RTE_ETH_HASH_FUNCTION_DEFAULT,
		.types = types,
		.queue_num = nq,
		.queue = queues,
	};
	struct rte_flow_action actions[2] = {
		{ .type = nq == 1 ? RTE_FLOW_ACTION_TYPE_QUEUE : RTE_FLOW_ACTION_TYPE_RSS,
		  .conf = nq == 1 ? (const void *)&q : (const void *)&rss },
		{ .type = RTE_FLOW_ACTION_TYPE_END },
	};
	struct rte_flow_error e = {};
	int r = rte_flow_validate(port, &attr, pattern, actions, &e);
	struct rte_flow *f = NULL;
	if (!r)
		f = rte_flow_create(port, &attr, pattern, actions, &e);
	if (!f && errlen > 0)
		snprintf(err, (size_t)errlen, "%s (%s)", e.message ? e.message : "refused", strerror(r ? -r : rte_errno));
	return f;
}

int vl_flow_destroy(uint16_t port, struct rte_flow *f)
{
	struct rte_flow_error e = {};
	return rte_flow_destroy(port, f, &e);
}

/* ---- the XDP flow director ------------------------------------------------------------------
 * The af_xdp PMD loads our object (xdp_prog=...) and attaches it to the interface. We find the
 * program attached to `ifname`, then its maps by name, and write the addresses it must send to
 * the data plane. Keys follow xdp/vectorlb_xdp.c. */

static int find_map(const char *ifname, const char *map_name)
{
	unsigned ifindex = if_nametoindex(ifname);
	if (!ifindex)
		return -ENODEV;
	__u32 prog_id = 0;
	int r = bpf_xdp_query_id((int)ifindex, 0, &prog_id);
	if (r)
		return r;
	if (!prog_id)
		return -ENOENT;
	int pfd = bpf_prog_get_fd_by_id(prog_id);
	if (pfd < 0)
		return -errno;
	__u32 ids[16];
	struct bpf_prog_info info;
	memset(&info, 0, sizeof(info));
	info.nr_map_ids = 16;
	info.map_ids = (__u64)(unsigned long)ids;
	__u32 len = sizeof(info);
	r = bpf_obj_get_info_by_fd(pfd, &info, &len);
	close(pfd);
	if (r)
		return -errno;
	for (__u32 i = 0; i < info.nr_map_ids && i < 16; i++) {
		int mfd = bpf_map_get_fd_by_id(ids[i]);
		if (mfd < 0)
			continue;
		struct bpf_map_info mi;
		memset(&mi, 0, sizeof(mi));
		__u32 ml = sizeof(mi);
		if (!bpf_obj_get_info_by_fd(mfd, &mi, &ml) && !strcmp(mi.name, map_name))
			return mfd;
		close(mfd);
	}
	return -ENOENT;
}

static int key_in(const uint8_t *keys, int n, int key_size, const uint8_t *k)
{
	for (int i = 0; i < n; i++)
		if (!memcmp(keys + (size_t)i * key_size, k, key_size))
			return 1;
	return 0;
}

/* A new descriptor of map `map_name` of the XDP program attached to `ifname` (the caller
 * closes it), or a negative errno. */
int vl_xdp_map_fd(const char *ifname, const char *map_name)
{
	return find_map(ifname, map_name);
}

/* Makes map `fd` hold exactly `n` keys of `key_size` bytes, each with value `values[i]`: new
 * keys are written first, stale ones deleted after, so an address that stays never disappears
 * from the map, even for a moment. */
int vl_map_replace(int fd, const uint8_t *keys, const uint32_t *values, int n, int key_size)
{
	if (key_size > 64)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (bpf_map_update_elem(fd, keys + (size_t)i * key_size, &values[i], BPF_ANY))
			return -errno;
	uint8_t cur[64], next[64];
	int have = bpf_map_get_next_key(fd, NULL, cur) == 0;
	while (have) {
		have = bpf_map_get_next_key(fd, cur, next) == 0;
		if (!key_in(keys, n, key_size, cur))
			bpf_map_delete_elem(fd, cur);
		memcpy(cur, next, key_size);
	}
	return 0;
}

/* Writes one element of map `fd`. */
int vl_map_put(int fd, const void *key, const void *value)
{
	return bpf_map_update_elem(fd, key, value, BPF_ANY) ? -errno : 0;
}

/* Sums a per-CPU array's element `key` (of `words` 64-bit counters) over the CPUs into `out`. */
int vl_map_percpu_sum(int fd, uint32_t key, uint64_t *out, int words)
{
	int ncpu = libbpf_num_possible_cpus();
	if (ncpu <= 0 || words <= 0 || words > 16)
		return -EINVAL;
	uint64_t *all = calloc((size_t)ncpu * (size_t)words, sizeof(uint64_t));
	if (!all)
		return -ENOMEM;
	int r = bpf_map_lookup_elem(fd, &key, all) ? -errno : 0;
	for (int w = 0; !r && w < words; w++) {
		out[w] = 0;
		for (int c = 0; c < ncpu; c++)
			out[w] += all[(size_t)c * (size_t)words + (size_t)w];
	}
	free(all);
	return r;
}

/* For tests of the program itself: loads an object from memory (attached nowhere), gives
 * descriptors of its programs and maps by name, and runs a frame through a program
 * (BPF_PROG_TEST_RUN). */
void *vl_bpf_load(const void *obj, size_t len, int *err)
{
	struct bpf_object *o = bpf_object__open_mem(obj, len, NULL);
	if (!o) {
		*err = -errno;
		return NULL;
	}
	int r = bpf_object__load(o);
	if (r) {
		*err = r;
		bpf_object__close(o);
		return NULL;
	}
	return o;
}

int vl_bpf_fd(void *o, const char *name, int is_map)
{
	if (is_map) {
		struct bpf_map *m = bpf_object__find_map_by_name(o, name);
		return m ? dup(bpf_map__fd(m)) : -ENOENT;
	}
	struct bpf_program *p = bpf_object__find_program_by_name(o, name);
	return p ? dup(bpf_program__fd(p)) : -ENOENT;
}

int vl_bpf_test_run(int prog_fd, const void *data, uint32_t len, uint32_t *retval)
{
	LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = data, .data_size_in = len, .repeat = 1);
	int r = bpf_prog_test_run_opts(prog_fd, &opts);
	if (r)
		return r < 0 ? r : -r;
	*retval = opts.retval;
	return 0;
}

/* As vl_bpf_test_run, and the frame as the program left it in `out` (`*out_len` bytes). */
int vl_bpf_test_run_out(int prog_fd, const void *data, uint32_t len, void *out, uint32_t cap, uint32_t *out_len, uint32_t *retval)
{
	LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = data, .data_size_in = len, .data_out = out, .data_size_out = cap, .repeat = 1);
	int r = bpf_prog_test_run_opts(prog_fd, &opts);
	if (r)
		return r < 0 ? r : -r;
	*retval = opts.retval;
	*out_len = opts.data_size_out;
	return 0;
}

/* Attaches program `prog_fd` to `ifname` as its XDP program: in the driver (`generic` 0; the
 * kernel refuses when the driver cannot), or generic (SKB) mode (1). It stays attached after
 * the caller exits. */
int vl_xdp_attach(const char *ifname, int prog_fd, int generic)
{
	unsigned ifindex = if_nametoindex(ifname);
	if (!ifindex)
		return -ENODEV;
	int r = bpf_xdp_attach((int)ifindex, prog_fd, generic ? XDP_FLAGS_SKB_MODE : XDP_FLAGS_DRV_MODE, NULL);
	return r < 0 ? r : 0;
}

void vl_bpf_close(void *o)
{
	bpf_object__close(o);
}

/* The XDP program attached to `ifname`: its id (0: none) and, in `name` (`len` bytes, NUL
 * terminated), its name. A negative errno on failure. */
int vl_xdp_prog(const char *ifname, char *name, int len)
{
	unsigned ifindex = if_nametoindex(ifname);
	if (!ifindex)
		return -ENODEV;
	__u32 prog_id = 0;
	int r = bpf_xdp_query_id((int)ifindex, 0, &prog_id);
	if (r)
		return r < 0 ? r : -r;
	if (len > 0)
		name[0] = 0;
	if (!prog_id)
		return 0;
	int pfd = bpf_prog_get_fd_by_id(prog_id);
	if (pfd < 0)
		return -errno;
	struct bpf_prog_info info;
	memset(&info, 0, sizeof(info));
	__u32 il = sizeof(info);
	r = bpf_obj_get_info_by_fd(pfd, &info, &il);
	close(pfd);
	if (r)
		return -errno;
	if (len > 0) {
		strncpy(name, info.name, (size_t)len - 1);
		name[len - 1] = 0;
	}
	return (int)prog_id;
}

/* Detaches whatever XDP program `ifname` has. */
int vl_xdp_detach(const char *ifname)
{
	unsigned ifindex = if_nametoindex(ifname);
	if (!ifindex)
		return -ENODEV;
	int r = bpf_xdp_detach((int)ifindex, 0, NULL);
	return r < 0 ? r : 0;
}

/* ---- dmadev: one memory-to-memory channel per device, addresses as IOVAs. ---- */

int vl_iova_is_va(void) { return rte_eal_iova_mode() == RTE_IOVA_VA; }
int vl_dma_count(void) { return rte_dma_count_avail(); }

/* The id of the dmadev called `name`, or a negative errno. */
int vl_dma_by_name(const char *name) { return rte_dma_get_dev_id_by_name(name); }

int vl_dma_name(int16_t dev, char *out, size_t len)
{
    struct rte_dma_info info;
    int r = rte_dma_info_get(dev, &info);
    if (r < 0) return r;
    snprintf(out, len, "%s", info.dev_name ? info.dev_name : "?");
    return 0;
}

/* Configures one vchan of `nb_desc` descriptors (clamped to what the device allows) and
 * starts the device; returns the descriptors granted or a negative errno. */
int vl_dma_setup(int16_t dev, uint16_t nb_desc)
{
    struct rte_dma_info info;
    int r = rte_dma_info_get(dev, &info);
    if (r < 0) return r;
    if (!(info.dev_capa & RTE_DMA_CAPA_MEM_TO_MEM)) return -ENOTSUP;
    struct rte_dma_conf conf = { .nb_vchans = 1, .enable_silent = false };
    if ((r = rte_dma_configure(dev, &conf)) < 0) return r;
    if (nb_desc < info.min_desc) nb_desc = info.min_desc;
    if (nb_desc > info.max_desc) nb_desc = info.max_desc;
    struct rte_dma_vchan_conf vc = { .direction = RTE_DMA_DIR_MEM_TO_MEM, .nb_desc = nb_desc };
    if ((r = rte_dma_vchan_setup(dev, 0, &vc)) < 0) return r;
    if ((r = rte_dma_start(dev)) < 0) return r;
    return nb_desc;
}

int vl_dma_stop(int16_t dev)
{
    rte_dma_stop(dev);
    return rte_dma_close(dev);
}

/* Enqueues all `n` copies and submits them, or none (-ENOSPC) when the ring lacks room. */
int vl_dma_copy_batch(int16_t dev, const uint64_t *src, const uint64_t *dst, const uint32_t *len, uint16_t n)
{
    if (rte_dma_burst_capacity(dev, 0) < n) return -ENOSPC;
    for (uint16_t i = 0; i < n; i++) {
        int r = rte_dma_copy(dev, 0, src[i], dst[i], len[i], 0);
        if (r < 0) {
            /* Capacity was checked: a failure here is a device error. What was enqueued is
             * submitted, and counted by its completions. */
            rte_dma_submit(dev, 0);
            return r;
        }
    }
    return rte_dma_submit(dev, 0);
}

/* Completions since the last call (up to `max`); failed copies counted in `*errors`. */
uint16_t vl_dma_completed(int16_t dev, uint16_t max, uint32_t *errors)
{
    uint16_t last = 0;
    bool err = false;
    uint16_t n = rte_dma_completed(dev, 0, max, &last, &err);
    if (err) {
        enum rte_dma_status_code st[64];
        uint16_t m = rte_dma_completed_status(dev, 0, 64, &last, st);
        for (uint16_t i = 0; i < m; i++)
            if (st[i] != RTE_DMA_STATUS_SUCCESSFUL) (*errors)++;
        n += m;
    }
    return n;
}

/* ---- Event devices (the proxy's priority dispatch; event_sw in software, event_dlb2 on hosts
 * with Intel's Dynamic Load Balancer). One queue per priority class; per consumer, a main port
 * linked to every queue and, with more than one queue, a catch-up port linked to all but the
 * first (so a consumer can take a lower class's item out of turn: shares and overdue items);
 * one producer port last. Every port's dequeue depth is 1, so a busy consumer holds at most
 * one item per port that another could have taken. */

/* Stops a software device's scheduling service and gives its slot back: event_sw registers
 * one at probe and nothing unregisters it, and DPDK has 64 (RTE_SERVICE_NUM_MAX), so without
 * this every device opened (each reload that changes the pool) would use one up for good. */
static void evdev_release_service(int dev)
{
	uint32_t sid;
	if (dev >= 0 && rte_event_dev_service_id_get(dev, &sid) == 0) {
		rte_service_runstate_set(sid, 0);
		rte_service_component_runstate_set(sid, 0);
		rte_service_component_unregister(sid);
	}
}

/* The event device the EAL probed on PCI device `pci` (its name, 0000:6d:00.0), or -ENODEV. */
/* The id of the attached event device named `name` (a vdev's or a PCI device's name), or
 * -ENODEV. Every id is scanned: DPDK's own rte_event_dev_get_dev_id and rte_event_dev_count
 * stop at the number of attached devices, which misses a device in a higher slot once a lower
 * one was released (devices come and go as proxies reload and tests run side by side). */
static int evdev_by_name(const char *name)
{
	for (int d = 0; d < RTE_EVENT_MAX_DEVS; d++) {
		struct rte_event_dev_info info;
		if (rte_event_dev_info_get(d, &info) == 0 && info.dev && strcmp(rte_dev_name(info.dev), name) == 0)
			return d;
	}
	return -ENODEV;
}

/* Creates the software event device `vdev` (with `vdev_args`), or finds the one probed on PCI
 * device `pci` (exactly one of the two is non-NULL), and configures it. Returns the device id
 * (>= 0) or a negative errno, having removed a vdev it created; *service gets the device's
 * scheduling service id, or UINT32_MAX when the device schedules by itself (hardware). */
int vl_evdev_setup(const char *vdev, const char *vdev_args, const char *pci, uint8_t nqueues,
		   const uint8_t *priorities, uint8_t consumers, uint32_t events, uint32_t *service)
{
	int r;
	int dev = -ENODEV;
	if (vdev) {
		r = rte_vdev_init(vdev, vdev_args ? vdev_args : "");
		if (r < 0)
			return r;
		dev = evdev_by_name(vdev);
	} else if (pci) {
		dev = evdev_by_name(pci);
	}
	if (dev < 0) {
		r = -ENODEV;
		goto fail;
	}
	struct rte_event_dev_info info;
	r = rte_event_dev_info_get(dev, &info);
	if (r < 0)
		goto fail;
	unsigned catchup = nqueues > 1 ? 1 : 0;
	unsigned nports = consumers * (1 + catchup) + 1;
	if (nqueues > info.max_event_queues || nports > info.max_event_ports) {
		r = -E2BIG;
		goto fail;
	}
	if (info.max_num_events > 0 && events > (uint32_t)info.max_num_events)
		events = info.max_num_events;
	struct rte_event_dev_config cfg = {0};
	cfg.nb_event_queues = nqueues;
	cfg.nb_event_ports = nports;
	cfg.nb_events_limit = events;
	cfg.nb_event_queue_flows = info.max_event_queue_flows < 1024 ? info.max_event_queue_flows : 1024;
	cfg.nb_event_port_dequeue_depth = 1;
	cfg.nb_event_port_enqueue_depth = 1;
	cfg.dequeue_timeout_ns = info.min_dequeue_timeout_ns;
	r = rte_event_dev_configure(dev, &cfg);
	if (r < 0)
		goto fail;
	for (unsigned q = 0; q < nqueues; q++) {
		struct rte_event_queue_conf qc;
		r = rte_event_queue_default_conf_get(dev, q, &qc);
		if (r < 0)
			goto fail;
		qc.schedule_type = RTE_SCHED_TYPE_PARALLEL;
		qc.event_queue_cfg = 0;
		qc.priority = priorities[q];
		qc.nb_atomic_flows = cfg.nb_event_queue_flows;
		r = rte_event_queue_setup(dev, q, &qc);
		if (r < 0)
			goto fail;
	}
	for (unsigned p = 0; p < nports; p++) {
		struct rte_event_port_conf pc;
		r = rte_event_port_default_conf_get(dev, p, &pc);
		if (r < 0)
			goto fail;
		pc.dequeue_depth = 1;
		pc.enqueue_depth = 1;
		pc.new_event_threshold = events;
		/* Released at dequeue (vl_evdev_dequeue): an item taken is the consumer's, and the
		 * port is free for the next at once, not only at its next dequeue call. */
		pc.event_port_cfg |= RTE_EVENT_PORT_CFG_DISABLE_IMPL_REL;
		r = rte_event_port_setup(dev, p, &pc);
		if (r < 0)
			goto fail;
	}
	uint8_t all[256];
	for (unsigned q = 0; q < nqueues; q++)
		all[q] = q;
	for (unsigned c = 0; c < consumers; c++) {
		unsigned main_port = c * (1 + catchup);
		if (rte_event_port_link(dev, main_port, all, NULL, nqueues) != nqueues ||
		    (catchup && rte_event_port_link(dev, main_port + 1, all + 1, NULL, nqueues - 1) != nqueues - 1)) {
			r = rte_errno ? -rte_errno : -EINVAL;
			goto fail;
		}
	}
	uint32_t sid = UINT32_MAX;
	if (rte_event_dev_service_id_get(dev, &sid) == 0) {
		/* Run by the consumers themselves (rte_service_run_iter_on_app_lcore), not by a
		 * service core: a scheduling pass happens only when a consumer is ready to take an
		 * item, so items are placed by the priorities of the moment they are taken. */
		rte_service_runstate_set(sid, 1);
		rte_service_set_runstate_mapped_check(sid, 0);
	} else {
		sid = UINT32_MAX;
	}
	*service = sid;
	r = rte_event_dev_start(dev);
	if (r < 0)
		goto fail;
	return dev;
fail:
	if (vdev) {
		evdev_release_service(dev);
		rte_vdev_uninit(vdev);
	}
	return r;
}

/* Stops and closes the device; for a software one (`vdev` not NULL) also gives its service
 * back and removes the vdev. Every port must be idle (the consumers have stopped). Events
 * still inside are discarded. */
void vl_evdev_close(uint8_t dev, const char *vdev)
{
	rte_event_dev_stop(dev);
	rte_event_dev_close(dev);
	if (vdev) {
		evdev_release_service(dev);
		rte_vdev_uninit(vdev);
	}
}

/* Enqueues one new event carrying `u64` on `queue` through `port`; 1 if taken, 0 if the
 * device is full (back-pressure). The port must not be used by two threads at once. */
int vl_evdev_enqueue(uint8_t dev, uint8_t port, uint8_t queue, uint64_t u64)
{
	struct rte_event ev = {0};
	ev.op = RTE_EVENT_OP_NEW;
	ev.queue_id = queue;
	ev.sched_type = RTE_SCHED_TYPE_PARALLEL;
	ev.event_type = RTE_EVENT_TYPE_CPU;
	ev.priority = RTE_EVENT_DEV_PRIORITY_NORMAL;
	ev.u64 = u64;
	return rte_event_enqueue_burst(dev, port, &ev, 1);
}

/* Dequeues at most one event from `port` without waiting; 1 with *u64 and *queue set, or 0.
 * The event is released at once (the queues are parallel: nothing to keep in order), so the
 * scheduler's next pass may give the port another. */
int vl_evdev_dequeue(uint8_t dev, uint8_t port, uint64_t *u64, uint8_t *queue)
{
	struct rte_event ev;
	if (rte_event_dequeue_burst(dev, port, &ev, 1, 0) != 1)
		return 0;
	*u64 = ev.u64;
	*queue = ev.queue_id;
	struct rte_event rel = {0};
	rel.op = RTE_EVENT_OP_RELEASE;
	rel.queue_id = ev.queue_id;
	/* A release needs no room; retried in case a device asks for it. */
	for (int i = 0; i < 1000 && rte_event_enqueue_burst(dev, port, &rel, 1) != 1; i++)
		;
	return 1;
}

/* One pass of a software event device's scheduler; callable from several threads at once
 * (the service is MT-unsafe and DPDK serialises the calls). */
int vl_evdev_schedule(uint32_t service) { return rte_service_run_iter_on_app_lcore(service, 1); }

/* The mesh's socket lookup program (csrc/vectorlb_mesh.c) loaded from `obj`, its listeners
 * set (`outbound_fd`, `inbound_fd`: listening TCP sockets), and attached to the network
 * namespace `netns_fd`. Returns the loaded object (to vl_sklookup_detach), or NULL with *err
 * a negative errno. The program stays attached while the returned object lives (its link is
 * not pinned: the process's end detaches it). */
struct vl_sklookup {
	struct bpf_object *obj;
	struct bpf_link *link;
};

void *vl_sklookup_attach(const void *obj, size_t len, int netns_fd, int outbound_fd, int inbound_fd, uint32_t tunnel_port, uint32_t ifindex, int *err)
{
	struct vl_sklookup *h = calloc(1, sizeof(*h));
	if (!h) {
		*err = -ENOMEM;
		return NULL;
	}
	h->obj = bpf_object__open_mem(obj, len, NULL);
	if (!h->obj) {
		*err = -errno;
		free(h);
		return NULL;
	}
	int r = bpf_object__load(h->obj);
	struct bpf_map *socks = r ? NULL : bpf_object__find_map_by_name(h->obj, "vl_mesh_socks");
	struct bpf_map *conf = r ? NULL : bpf_object__find_map_by_name(h->obj, "vl_mesh_conf");
	struct bpf_program *prog = r ? NULL : bpf_object__find_program_by_name(h->obj, "vectorlb_mesh");
	if (!r && (!socks || !conf || !prog))
		r = -ENOENT;
	uint32_t k0 = 0, k1 = 1;
	uint64_t out = (uint64_t)outbound_fd, in = (uint64_t)inbound_fd;
	if (!r && bpf_map_update_elem(bpf_map__fd(conf), &k0, &tunnel_port, BPF_ANY))
		r = -errno;
	if (!r && bpf_map_update_elem(bpf_map__fd(conf), &k1, &ifindex, BPF_ANY))
		r = -errno;
	if (!r && bpf_map_update_elem(bpf_map__fd(socks), &k0, &out, BPF_ANY))
		r = -errno;
	if (!r && bpf_map_update_elem(bpf_map__fd(socks), &k1, &in, BPF_ANY))
		r = -errno;
	if (!r) {
		h->link = bpf_program__attach_netns(prog, netns_fd);
		if (!h->link)
			r = -errno;
	}
	if (r) {
		*err = r;
		bpf_object__close(h->obj);
		free(h);
		return NULL;
	}
	return h;
}

void vl_sklookup_detach(void *p)
{
	struct vl_sklookup *h = p;
	if (!h)
		return;
	bpf_link__destroy(h->link);
	bpf_object__close(h->obj);
	free(h);
}
