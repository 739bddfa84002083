//! The tools binary's command line: every tool is there, and bad arguments are clear errors.

use std::process::Command;

fn tools(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vectorlb-tools")).args(args).output().unwrap()
}

#[test]
fn lists_its_tools_and_refuses_nonsense() {
    let help = String::from_utf8_lossy(&tools(&["--help"]).stdout).into_owned();
    for t in ["probe", "gen", "rfc2544"] {
        assert!(help.contains(t), "{t} in {help}");
    }
    let probes = String::from_utf8_lossy(&tools(&["probe", "--help"]).stdout).into_owned();
    for p in ["http", "serve-udp", "serve-tcp", "udp", "tcp", "garbage", "hold", "sync-inject"] {
        assert!(probes.contains(p), "{p} in {probes}");
    }
    let o = tools(&["probe", "http", "--url", "ftp://x/"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--url: 'ftp://x/' must start with http://"));
    let o = tools(&["gen", "--tx", "x", "--dst-mac", "nonsense"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--dst-mac"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn tun_forward_refuses_bad_names_and_durations_before_it_opens_anything() {
    for (args, says) in [
        (vec!["tun-forward", "--a", "", "--b", "x"], "interface name \"\""),
        (vec!["tun-forward", "--a", "a-name-far-too-long", "--b", "x"], "1 to 15 bytes"),
        (vec!["tun-forward", "--a", "x", "--b", "y", "--duration-s", "0"], "--duration-s 0"),
        (vec!["tun-forward", "--a", "x", "--b", "y", "--duration-s", "NaN"], "--duration-s NaN"),
    ] {
        let o = tools(&args);
        assert!(!o.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
