//! Declarations of the C shim's functions (csrc/shim.c).
#![allow(dead_code)]
use std::os::raw::{c_char, c_int, c_uint, c_void};

#[repr(C)]
pub struct RteMempool {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct RteMbuf {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct RteRing {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct VlPortInfo {
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub max_rx_pktlen: u32,
    pub rss_offloads: u64,
    pub driver: [u8; 64],
}

impl Default for VlPortInfo {
    fn default() -> Self {
        VlPortInfo { max_rx_queues: 0, max_tx_queues: 0, max_rx_pktlen: 0, rss_offloads: 0, driver: [0; 64] }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VlStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    pub rx_nombuf: u64,
}

impl VlStats {
    /// Every counter by its `rte_eth_stats` name.
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("ipackets", self.ipackets),
            ("opackets", self.opackets),
            ("ibytes", self.ibytes),
            ("obytes", self.obytes),
            ("imissed", self.imissed),
            ("ierrors", self.ierrors),
            ("oerrors", self.oerrors),
            ("rx_nombuf", self.rx_nombuf),
        ]
    }
}

extern "C" {
    pub fn vl_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    pub fn vl_eal_cleanup() -> c_int;
    pub fn vl_strerror(e: c_int) -> *const c_char;
    pub fn vl_thread_register() -> c_int;
    pub fn vl_runtime_dir() -> *const c_char;
    pub fn vl_thread_unregister();
    pub fn vl_lcore_id() -> c_uint;
    pub fn vl_socket_id() -> c_int;
    pub fn vl_pool_create(name: *const c_char, n: c_uint, cache: c_uint, data_room: u16, socket: c_int, err: *mut c_int) -> *mut RteMempool;
    pub fn vl_pool_free(mp: *mut RteMempool);
    pub fn vl_pool_avail(mp: *mut RteMempool) -> c_uint;
    pub fn vl_mbuf_alloc(mp: *mut RteMempool) -> *mut RteMbuf;
    pub fn vl_mbuf_alloc_bulk(mp: *mut RteMempool, m: *mut *mut RteMbuf, n: c_uint) -> c_int;
    pub fn vl_mbuf_free_bulk(m: *mut *mut RteMbuf, n: c_uint);
    pub fn vl_mbuf_free(m: *mut RteMbuf);
    pub fn vl_port_by_name(name: *const c_char, port: *mut u16) -> c_int;
    pub fn vl_port_count() -> u16;
    pub fn vl_port_info(port: u16, out: *mut VlPortInfo) -> c_int;
    pub fn vl_port_configure(port: u16, nrxq: u16, ntxq: u16, mtu: u16) -> c_int;
    pub fn vl_rx_queue_setup(port: u16, q: u16, desc: u16, socket: c_int, mp: *mut RteMempool) -> c_int;
    pub fn vl_tx_queue_setup(port: u16, q: u16, desc: u16, socket: c_int) -> c_int;
    pub fn vl_port_start(port: u16) -> c_int;
    pub fn vl_port_stop(port: u16) -> c_int;
    pub fn vl_port_close(port: u16) -> c_int;
    pub fn vl_promiscuous(port: u16, on: c_int) -> c_int;
    pub fn vl_port_mac(port: u16, out: *mut u8) -> c_int;
    pub fn vl_set_mac(port: u16, mac: *const u8) -> c_int;
    pub fn vl_link(port: u16, speed: *mut u32, up: *mut c_int) -> c_int;
    pub fn vl_stats(port: u16, s: *mut VlStats) -> c_int;
    pub fn vl_xstats(port: u16, names: *mut c_char, values: *mut u64, n: c_int) -> c_int;
    pub fn vl_rx_burst(port: u16, q: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn vl_tx_burst(port: u16, q: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn vl_ring_create(name: *const c_char, count: c_uint, socket: c_int, err: *mut c_int) -> *mut RteRing;
    pub fn vl_ring_free(r: *mut RteRing);
    pub fn vl_ring_enqueue_burst(r: *mut RteRing, objs: *mut *mut c_void, n: c_uint) -> c_uint;
    pub fn vl_ring_dequeue_burst(r: *mut RteRing, objs: *mut *mut c_void, n: c_uint, left: *mut c_uint) -> c_uint;
    pub fn vl_rx_queue_count(port: u16, q: u16) -> c_int;
    pub fn vl_xdp_prog(ifname: *const c_char, name: *mut c_char, len: c_int) -> c_int;
    pub fn vl_xdp_detach(ifname: *const c_char) -> c_int;
    pub fn vl_iova_is_va() -> c_int;
    pub fn vl_dma_count() -> c_int;
    pub fn vl_dma_by_name(name: *const c_char) -> c_int;
    pub fn vl_dma_name(dev: i16, out: *mut c_char, len: usize) -> c_int;
    pub fn vl_dma_setup(dev: i16, nb_desc: u16) -> c_int;
    pub fn vl_dma_stop(dev: i16) -> c_int;
    pub fn vl_dma_copy_batch(dev: i16, src: *const u64, dst: *const u64, len: *const u32, n: u16) -> c_int;
    pub fn vl_dma_completed(dev: i16, max: u16, errors: *mut u32) -> u16;
    pub fn vl_evdev_setup(
        vdev: *const c_char,
        vdev_args: *const c_char,
        pci: *const c_char,
        nqueues: u8,
        priorities: *const u8,
        consumers: u8,
        events: u32,
        service: *mut u32,
    ) -> c_int;
    pub fn vl_evdev_close(dev: u8, vdev: *const c_char);
    pub fn vl_evdev_enqueue(dev: u8, port: u8, queue: u8, value: u64) -> c_int;
    pub fn vl_evdev_dequeue(dev: u8, port: u8, value: *mut u64, queue: *mut u8) -> c_int;
    pub fn vl_evdev_schedule(service: u32) -> c_int;
    pub fn vl_flow_queues(
        port: u16,
        priority: u32,
        family: u8,
        proto: u8,
        addr: *const u8,
        dport: u16,
        queues: *const u16,
        nq: u16,
        err: *mut c_char,
        errlen: c_int,
    ) -> *mut c_void;
    pub fn vl_flow_destroy(port: u16, flow: *mut c_void) -> c_int;
    pub fn vl_xdp_map_fd(ifname: *const c_char, map: *const c_char) -> c_int;
    pub fn vl_map_replace(fd: c_int, keys: *const u8, values: *const u32, n: c_int, key_size: c_int) -> c_int;
    pub fn vl_map_put(fd: c_int, key: *const c_void, value: *const c_void) -> c_int;
    pub fn vl_map_percpu_sum(fd: c_int, key: u32, out: *mut u64, words: c_int) -> c_int;
    pub fn vl_bpf_load(obj: *const c_void, len: usize, err: *mut c_int) -> *mut c_void;
    pub fn vl_sklookup_attach(
        obj: *const c_void,
        len: usize,
        netns_fd: c_int,
        outbound_fd: c_int,
        inbound_fd: c_int,
        tunnel_port: u32,
        ifindex: u32,
        err: *mut c_int,
    ) -> *mut c_void;
    pub fn vl_sklookup_detach(h: *mut c_void);
    pub fn vl_bpf_fd(obj: *mut c_void, name: *const c_char, is_map: c_int) -> c_int;
    pub fn vl_bpf_test_run(prog_fd: c_int, data: *const c_void, len: u32, retval: *mut u32) -> c_int;
    pub fn vl_bpf_test_run_out(prog_fd: c_int, data: *const c_void, len: u32, out: *mut c_void, cap: u32, out_len: *mut u32, retval: *mut u32) -> c_int;
    pub fn vl_xdp_attach(ifname: *const c_char, prog_fd: c_int, generic: c_int) -> c_int;
    pub fn vl_bpf_close(obj: *mut c_void);
}
