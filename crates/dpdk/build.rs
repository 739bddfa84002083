//! Builds the C shim against DPDK (`pkg-config libdpdk libbpf`) and the XDP program (clang).
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config(args: &[&str]) -> Result<String, String> {
    let out = Command::new("pkg-config").args(args).output().map_err(|e| format!("cannot run pkg-config ({e}); run scripts/setup.sh"))?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config {}: {}; install DPDK 22.11 and libbpf (scripts/setup.sh: apt-get install libdpdk-dev libbpf-dev)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn run(cmd: &mut Command, what: &str) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    if !st.success() {
        panic!("{what} failed ({st})");
    }
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/vectorlb_xdp.c");
    println!("cargo:rerun-if-changed=csrc/vectorlb_decap.c");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let cflags = pkg_config(&["--cflags", "libdpdk", "libbpf"]).unwrap_or_else(|e| panic!("{e}"));
    let libs = pkg_config(&["--libs", "libdpdk", "libbpf"]).unwrap_or_else(|e| panic!("{e}"));

    let obj = out.join("shim.o");
    let mut cc = Command::new(env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-O2", "-g", "-fPIC", "-Wall", "-Werror", "-c", "csrc/shim.c", "-o"]).arg(&obj);
    cc.args(cflags.split_whitespace());
    run(&mut cc, "compiling csrc/shim.c");
    run(Command::new("ar").arg("rcs").arg(out.join("libvlshim.a")).arg(&obj), "archiving the shim");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=vlshim");
    for tok in libs.split_whitespace() {
        if let Some(l) = tok.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={l}");
        } else if let Some(p) = tok.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={p}");
        }
    }

    // rte_vdev_init (event devices created at run time) lives in the vdev bus driver, which
    // pkg-config's list leaves out (drivers are loaded as plugins).
    println!("cargo:rustc-link-lib=rte_bus_vdev");

    // The XDP programs (the flow director; the backends' decapsulation): clang's BPF target.
    // The multiarch include directory has asm/types.h.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let include = [format!("/usr/include/{arch}-linux-gnu"), "/usr/include/x86_64-linux-gnu".to_string()].into_iter().find(|d| std::path::Path::new(d).exists());
    for name in ["vectorlb_xdp", "vectorlb_decap", "vectorlb_mesh"] {
        let mut clang = Command::new(env::var("BPF_CLANG").unwrap_or_else(|_| "clang".into()));
        clang.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-c", &format!("csrc/{name}.c"), "-o"]).arg(out.join(format!("{name}.o")));
        if let Some(dir) = &include {
            clang.arg(format!("-I{dir}"));
        }
        run(&mut clang, &format!("compiling the XDP program csrc/{name}.c with clang (apt-get install clang)"));
    }
}
