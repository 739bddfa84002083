//! The container image recipe (deploy/kubernetes/image/build.sh): an OCI image layout whose
//! digests, sizes and diff_id check out, the same bytes when built twice, and a root file
//! system that runs vectorlb and vectorlb-tools with nothing from the host (chroot).

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use vectorlb_testkit::{bin, is_root, repo, stdout};

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    stdout(&o).split_whitespace().next().unwrap().to_string()
}

fn build(out: &Path) {
    let bins = Path::new(bin()).parent().unwrap();
    let o = Command::new("bash").arg(repo().join("deploy/kubernetes/image/build.sh")).arg(bins).arg(out).arg("vectorlb.local/vectorlb:test").output().unwrap();
    assert!(o.status.success(), "build.sh: {}", String::from_utf8_lossy(&o.stderr));
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_image_is_a_valid_reproducible_oci_layout_that_runs_on_its_own() {
    if !is_root() {
        eprintln!("skipped: needs root (chroot)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vectorlb-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.tar"), dir.join("b.tar"));
    build(&a);
    build(&b);
    assert_eq!(sha256(&a), sha256(&b), "two builds of the same binaries give the same image");

    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    assert!(Command::new("tar").arg("-xf").arg(&a).arg("-C").arg(&layout).status().unwrap().success());
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    let m = &index["manifests"][0];
    assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "vectorlb.local/vectorlb:test");
    // Every blob is named by its digest and has the size its reference says.
    let blob = |r: &Value| {
        let d = r["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap().to_string();
        let p = layout.join("blobs/sha256").join(&d);
        assert_eq!(sha256(&p), d, "{}", p.display());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), r["size"].as_u64().unwrap(), "{}", p.display());
        p
    };
    let manifest = json(&blob(m));
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let config = json(&blob(&manifest["config"]));
    assert_eq!((config["os"].as_str(), config["architecture"].as_str()), (Some("linux"), Some("amd64")));
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/vectorlb");
    let layer = blob(&manifest["layers"][0]);
    let raw = dir.join("layer.tar");
    let o = Command::new("sh").arg("-c").arg(format!("gzip -dc {} > {}", layer.display(), raw.display())).status().unwrap();
    assert!(o.success());
    assert_eq!(format!("sha256:{}", sha256(&raw)), config["rootfs"]["diff_ids"][0].as_str().unwrap(), "the diff_id is the uncompressed layer's digest");

    // The root file system alone runs the binaries.
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    assert!(Command::new("tar").arg("-xf").arg(&raw).arg("-C").arg(&root).status().unwrap().success());
    let run = |args: &[&str]| {
        let o = Command::new("/usr/sbin/chroot").arg(&root).args(args).env_clear().env("PATH", "/usr/local/bin").output().unwrap();
        assert!(o.status.success(), "{args:?} in the image: {}", String::from_utf8_lossy(&o.stderr));
        stdout(&o)
    };
    assert!(run(&["/usr/local/bin/vectorlb", "--version"]).starts_with("vectorlb "));
    assert!(run(&["/usr/local/bin/vectorlb", "kube", "crds"]).contains("\"kind\": \"CustomResourceDefinition\""));
    assert!(run(&["/usr/local/bin/vectorlb-tools", "--help"]).contains("probe"));
    let perms = std::fs::metadata(root.join("tmp")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(perms.permissions().mode() & 0o7777, 0o1777, "/tmp as usual");
    let _ = std::fs::remove_dir_all(&dir);
}
