/*
 * What this machine's DPDK eventdev software scheduler (event_sw) offers, and whether it
 * serves a more urgent queue first: the groundwork of the proxy's planned eventdev dispatch
 * backend (issue 13). Prints the device's capabilities, sets up two queues (highest and lowest
 * priority), one producer and one consumer port, runs the scheduler service on this thread,
 * enqueues three low then three high events and prints the order they come out in.
 *
 *   cc -O2 bench/experiments/eventdev-probe.c -o /tmp/eventdev-probe $(pkg-config --cflags --libs libdpdk)
 *   /tmp/eventdev-probe --no-huge -m 64 --no-pci --vdev=event_sw0 -l 0 --log-level=3
 *
 * (With --in-memory or --no-telemetry added to --no-huge, DPDK 22.11's EAL refused to start
 * here.) Measured 2026-11-25, AMD EPYC VM: caps 0x7f3 (queue and event QoS among them), 255
 * queue priority levels, 64 ports; events 3, 4, 5 (high) came out before 0, 1, 2 (low).
 */
#include <stdio.h>
#include <stdint.h>
#include <rte_eal.h>
#include <rte_eventdev.h>
#include <rte_service.h>
int main(int argc, char **argv) {
    char **eargv = argv;
    int r = rte_eal_init(argc, eargv);
    if (r < 0) { printf("eal init failed %d\n", r); return 1; }
    int dev = rte_event_dev_get_dev_id("event_sw0");
    struct rte_event_dev_info info; rte_event_dev_info_get(dev, &info);
    printf("dev %d caps 0x%x queues %u qprio %u evprio %u ports %u deq %u enq %u events %d\n", dev, info.event_dev_cap, info.max_event_queues, info.max_event_queue_priority_levels, info.max_event_priority_levels, info.max_event_ports, info.max_event_port_dequeue_depth, info.max_event_port_enqueue_depth, info.max_num_events);
    struct rte_event_dev_config cfg = {0};
    cfg.nb_event_queues = 2; cfg.nb_event_ports = 2; cfg.nb_events_limit = 4096;
    cfg.nb_event_queue_flows = 1024; cfg.nb_event_port_dequeue_depth = 1; cfg.nb_event_port_enqueue_depth = 1;
    cfg.dequeue_timeout_ns = info.min_dequeue_timeout_ns;
    r = rte_event_dev_configure(dev, &cfg); printf("configure %d\n", r);
    for (int q = 0; q < 2; q++) {
        struct rte_event_queue_conf qc; rte_event_queue_default_conf_get(dev, q, &qc);
        qc.schedule_type = RTE_SCHED_TYPE_PARALLEL; qc.priority = q == 0 ? RTE_EVENT_DEV_PRIORITY_HIGHEST : RTE_EVENT_DEV_PRIORITY_LOWEST;
        qc.event_queue_cfg = 0;
        r = rte_event_queue_setup(dev, q, &qc); printf("queue %d setup %d\n", q, r);
    }
    for (int p = 0; p < 2; p++) {
        struct rte_event_port_conf pc; rte_event_port_default_conf_get(dev, p, &pc);
        pc.dequeue_depth = 1; pc.enqueue_depth = 1; pc.new_event_threshold = 4096;
        r = rte_event_port_setup(dev, p, &pc); printf("port %d setup %d\n", p, r);
    }
    uint8_t qs[2] = {0, 1};
    r = rte_event_port_link(dev, 1, qs, NULL, 2); printf("link %d\n", r);
    uint32_t sid; r = rte_event_dev_service_id_get(dev, &sid); printf("service id %d (%u)\n", r, sid);
    rte_service_runstate_set(sid, 1); rte_service_set_runstate_mapped_check(sid, 0);
    r = rte_event_dev_start(dev); printf("start %d\n", r);
    // Enqueue 3 low then 3 high on producer port 0; dequeue on port 1.
    for (int i = 0; i < 6; i++) {
        struct rte_event ev = {0};
        int q = i < 3 ? 1 : 0;
        ev.op = RTE_EVENT_OP_NEW; ev.queue_id = q; ev.sched_type = RTE_SCHED_TYPE_PARALLEL; ev.event_type = RTE_EVENT_TYPE_CPU; ev.priority = RTE_EVENT_DEV_PRIORITY_NORMAL; ev.u64 = i;
        while (rte_event_enqueue_burst(dev, 0, &ev, 1) != 1) rte_service_run_iter_on_app_lcore(sid, 1);
    }
    int got = 0;
    for (int it = 0; it < 100000 && got < 6; it++) {
        rte_service_run_iter_on_app_lcore(sid, 1);
        struct rte_event ev;
        if (rte_event_dequeue_burst(dev, 1, &ev, 1, 0) == 1) { printf("got %lu (queue %u)\n", (unsigned long)ev.u64, ev.queue_id); got++; }
    }
    return 0;
}
