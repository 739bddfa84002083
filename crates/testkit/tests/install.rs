//! `make install` (scripts/install.sh) into a scratch root: the binaries, a systemd unit that
//! systemd accepts and that reloads with SIGHUP, and an example configuration that loads and is
//! never overwritten by a second install.

use std::path::Path;
use std::process::Command;
use vectorlb_testkit::{bin, repo};

fn install(dest: &Path) {
    let bin_dir = Path::new(bin()).parent().unwrap();
    let o = Command::new("bash").arg(repo().join("scripts/install.sh")).env("DESTDIR", dest).env("BIN_DIR", bin_dir).output().unwrap();
    assert!(o.status.success(), "install: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

#[test]
fn installs_binaries_unit_and_configuration() {
    let dest = std::env::temp_dir().join(format!("vectorlb-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dest);
    install(&dest);
    let installed = dest.join("usr/local/bin/vectorlb");
    for b in ["vectorlb", "vectorlb-tools"] {
        let m = std::fs::metadata(dest.join("usr/local/bin").join(b)).unwrap();
        assert!(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0, "{b} is executable");
    }
    let conf = dest.join("etc/vectorlb/vectorlb.toml");
    let o = Command::new(&installed).args(["check", "--config"]).arg(&conf).output().unwrap();
    assert!(o.status.success(), "the example configuration loads: {}", String::from_utf8_lossy(&o.stderr));
    let unit = std::fs::read_to_string(dest.join("etc/systemd/system/vectorlb.service")).unwrap();
    for line in [
        "ExecStart=/usr/local/bin/vectorlb run --config ${VECTORLB_CONFIG}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "Environment=VECTORLB_CONFIG=/etc/vectorlb/vectorlb.toml",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit has `{line}`:\n{unit}");
    }
    assert!(unit.contains("CapabilityBoundingSet=CAP_NET_ADMIN"), "{unit}");
    // systemd's own check, with the binaries where the unit expects them.
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let here = dest.join("check.service");
        std::fs::write(&here, unit.replace("/usr/local/bin", &dest.join("usr/local/bin").display().to_string())).unwrap();
        let o = Command::new("systemd-analyze").arg("verify").arg(&here).output().unwrap();
        assert!(o.status.success(), "systemd-analyze verify: {}", String::from_utf8_lossy(&o.stderr));
    }
    // A second install keeps the operator's configuration and refreshes the example.
    std::fs::write(&conf, "# edited by the operator\n").unwrap();
    install(&dest);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "# edited by the operator\n");
    assert!(dest.join("etc/vectorlb/vectorlb.toml.example").exists());
    let _ = std::fs::remove_dir_all(&dest);
}
