// SPDX-License-Identifier: Apache-2.0
//! The image store against a real registry: Debian's `docker-registry` on loopback, holding
//! a busybox image built offline with `umoci` and pushed with `skopeo` (the fixtures in
//! `tests/containers/`). Pull, list, get, pull again, pull by digest, `docker load` of a
//! `docker save` archive, rmi until the store is empty. Skipped (and passing) only when
//! those tools are missing.

use insitu_isp::image::{ImageError, ImageStore, Progress, Removed};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/containers")
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn script(name: &str, args: &[&str]) {
    let out = Command::new("bash").arg(fixtures().join(name)).args(args).output().unwrap();
    assert!(out.status.success(), "{name} {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// Stops the registry however the test ends.
struct Registry(PathBuf);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(fixtures().join("registry.sh")).arg("stop").arg(&self.0).status();
    }
}

fn sha(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().filter(|e| !e.as_ref().unwrap().file_name().to_string_lossy().starts_with('.')).count()
}

#[test]
fn image_store_pulls_loads_and_removes_busybox_from_a_loopback_registry() {
    let missing: Vec<&str> = ["docker-registry", "skopeo", "umoci", "curl", "busybox"].into_iter().filter(|t| !have(t)).collect();
    if !missing.is_empty() {
        eprintln!("SKIPPED: {} not installed (Debian packages docker-registry, skopeo, umoci, curl, busybox-static)", missing.join(", "));
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let oci = d.path().join("oci");
    script("busybox-oci.sh", &[oci.to_str().unwrap(), "latest"]);
    script("busybox-oci.sh", &[oci.to_str().unwrap(), "latest"]); // idempotent
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let reg_dir = d.path().join("registry");
    script("registry.sh", &["start", reg_dir.to_str().unwrap(), &port.to_string()]);
    let _reg = Registry(reg_dir);
    let name = format!("127.0.0.1:{port}/busybox");
    script("push.sh", &[oci.to_str().unwrap(), "latest", &format!("{name}:latest")]);
    script("push.sh", &[oci.to_str().unwrap(), "latest", &format!("{name}:1.0")]);

    let root = d.path().join("store");
    let s = ImageStore::open(&root).unwrap();
    let mut events = Vec::new();
    let img = s.pull(&name, &mut |p| events.push(p)).unwrap();
    assert_eq!(img.repo_tags, [format!("{name}:latest")]);
    assert!(img.repo_digests[0].starts_with(&format!("{name}@sha256:")), "{:?}", img.repo_digests);
    assert_eq!((img.os.as_str(), img.architecture.as_str()), ("linux", "amd64"));
    assert_eq!(img.config.cmd.as_deref(), Some(&["sh".to_string()][..]));
    assert!(img.config.env.contains(&"PATH=/bin".to_string()));
    assert_eq!(img.layers.len(), 1);
    assert!(events.iter().any(|e| matches!(e, Progress::Downloading { .. })));
    assert!(matches!(events.last(), Some(Progress::Done { .. })));
    // The unpacked busybox is the very binary the fixture packed.
    let unpacked = sha(&img.layers[0].join("bin/busybox"));
    assert!(["/bin/busybox", "/usr/bin/busybox"].iter().any(|p| Path::new(p).exists() && sha(Path::new(p)) == unpacked), "bin/busybox differs from the host's");
    assert_eq!(std::fs::read_link(img.layers[0].join("bin/sh")).unwrap(), Path::new("busybox"));
    assert!(img.layers[0].join("etc/passwd").is_file() && img.layers[0].join("tmp").is_dir());
    assert!(img.size > 1 << 20);

    // Lookups.
    let hex = img.id.strip_prefix("sha256:").unwrap();
    for key in [name.as_str(), &format!("{name}:latest"), &img.id, hex, &hex[..4], &format!("sha256:{}", &hex[..12]), &img.repo_digests[0]] {
        assert_eq!(s.get(key).unwrap().id, img.id, "{key}");
    }
    assert_eq!(s.list().unwrap().len(), 1);
    let e = s.get("127.0.0.1:1/nothing").unwrap_err();
    assert_eq!((e.http_status(), e.to_string()), (404, "No such image: 127.0.0.1:1/nothing".to_string()));

    // Again, by another tag and by digest: nothing downloaded.
    for r in [format!("{name}:latest"), format!("{name}:1.0"), img.repo_digests[0].clone()] {
        let mut again = Vec::new();
        assert_eq!(s.pull(&r, &mut |p| again.push(p)).unwrap().id, img.id);
        assert!(
            again.iter().any(|e| matches!(e, Progress::AlreadyExists { .. })) && !again.iter().any(|e| matches!(e, Progress::Downloading { .. })),
            "{r}: {again:?}"
        );
    }
    assert_eq!(s.get(&img.id).unwrap().repo_tags, [format!("{name}:latest"), format!("{name}:1.0")]);
    let e = s.pull(&format!("{name}:nosuchtag"), &mut |_| {}).unwrap_err();
    assert_eq!(e.http_status(), 404, "{e}");

    // `docker load` of a `docker save` archive of the same image: its layer is known.
    let archive = d.path().join("busybox.tar");
    script("save.sh", &[oci.to_str().unwrap(), "latest", archive.to_str().unwrap(), "loaded/busybox:saved"]);
    let mut events = Vec::new();
    let loaded = s.load(&mut std::fs::File::open(&archive).unwrap(), &mut |p| events.push(p)).unwrap();
    assert_eq!(loaded, ["loaded/busybox:saved"]);
    assert!(events.iter().any(|e| matches!(e, Progress::AlreadyExists { .. })), "{events:?}");
    let l = s.get("loaded/busybox:saved").unwrap();
    assert_eq!(l.diff_ids, img.diff_ids);

    // rmi: by tag while other tags are left, by id once forced, and everything is gone.
    assert_eq!(s.remove(&format!("{name}:1.0"), false, &|_| false).unwrap(), [Removed::Untagged(format!("{name}:1.0"))]);
    let e = s.remove(&img.id, false, &|_| true).unwrap_err();
    assert!(matches!(e, ImageError::InUse { .. } | ImageError::Conflict(_)) && e.http_status() == 409, "{e}");
    for id in s.list().unwrap().into_iter().map(|i| i.id) {
        let r = s.remove(&id, true, &|_| false).unwrap();
        assert!(r.contains(&Removed::Deleted(id.clone())), "{r:?}");
    }
    assert!(s.list().unwrap().is_empty());
    assert_eq!(count(&root.join("layers")), 0);
    assert_eq!(count(&root.join("blobs/sha256")), 0);
    // Pullable again after all that.
    assert_eq!(s.pull(&name, &mut |_| {}).unwrap().id, img.id);
}
