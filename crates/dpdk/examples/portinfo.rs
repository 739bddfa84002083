//! Starts DPDK with the devices given on the command line and prints each port's details.
//! `cargo run --release -p vectorlb-dpdk --example portinfo -- net_af_xdp0,iface=veth0`
use std::sync::Arc;
use vectorlb_dpdk::{Eal, EthPort, Mempool};

fn main() {
    let devs: Vec<String> = std::env::args().skip(1).collect();
    let eal = match Eal::init(&["-l".into(), "0".into(), "--in-memory".into(), "--log-level".into(), "*:info".into()], &devs) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let pool = Mempool::new(&eal, "portinfo", 4096, 64, 2048 + 128).unwrap();
    for d in &devs {
        let p = Arc::new(EthPort::find(&eal, d).unwrap());
        println!("{d}: port {} {:?} mac {:02x?}", p.id(), p.info().unwrap(), p.mac().unwrap());
        p.setup(1, 1024, &pool, 0).unwrap();
        p.start().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        println!("link {:?} stats {:?} xstats {}", p.link(), p.stats(), p.xstats().len());
    }
}
