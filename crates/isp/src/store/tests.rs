// SPDX-License-Identifier: Apache-2.0
//! Store tests: load, get, remove, and pulls from a fake registry on loopback (bearer
//! tokens, indexes, hostile and oversized answers); hostile archives must leave the store
//! exactly as it was. The real registry (Debian's docker-registry) is exercised in
//! `crates/isp/tests/image_registry.rs`.

use super::manifest::{parse_config, parse_manifest, parse_save_manifest, parse_time, Manifest};
use super::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::Arc;

type Entry<'a> = (&'a str, tar::EntryType, &'a [u8], Option<&'a str>);

/// A tar with raw names (the builder itself refuses `..`, a hostile layer does not).
fn tar_of(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data, link) in entries {
        let mut h = tar::Header::new_old();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(1_600_000_000);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gz(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn config_of(layers: &[&[u8]], cmd: &str) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "created": "2023-11-14T22:13:20Z",
        "config": {"Env": ["PATH=/bin"], "Cmd": [cmd], "WorkingDir": "/w", "ExposedPorts": {"80/tcp": {}}, "Volumes": {"/v": {}}, "Labels": {"k": "v"}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// A `docker save` archive of images given as (uncompressed layers, tags); the first
/// layer of each is stored gzip-compressed, as registries hand them out.
fn archive(images: &[(Vec<Vec<u8>>, Vec<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut manifest = Vec::new();
    for (n, (layers, tags)) in images.iter().enumerate() {
        let refs: Vec<&[u8]> = layers.iter().map(|l| l.as_slice()).collect();
        let cfg = config_of(&refs, &format!("cmd{n}"));
        let cfg_name = format!("{}.json", hex_of(&sha256(&cfg)));
        add(&cfg_name, &cfg);
        let mut names = Vec::new();
        for (i, l) in layers.iter().enumerate() {
            let name = format!("{}/layer.tar", hex_of(&sha256(l)));
            add(&name, &if i == 0 { gz(l) } else { l.clone() });
            names.push(name);
        }
        manifest.push(serde_json::json!({"Config": cfg_name, "RepoTags": tags, "Layers": names}));
    }
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    b.into_inner().unwrap()
}

fn good_layer(content: &[u8]) -> Vec<u8> {
    tar_of(&[
        ("bin/", tar::EntryType::Directory, b"", None),
        ("bin/hello", tar::EntryType::Regular, content, None),
        ("bin/hi", tar::EntryType::Symlink, b"", Some("hello")),
        ("etc/.wh.gone", tar::EntryType::Regular, b"", None),
    ])
}

fn store() -> (tempfile::TempDir, ImageStore) {
    let d = tempfile::tempdir().unwrap();
    let s = ImageStore::open(&d.path().join("images")).unwrap();
    (d, s)
}

fn load(s: &ImageStore, tar: &[u8]) -> Result<Vec<String>, ImageError> {
    s.load(&mut &tar[..], &mut |_| {})
}

/// Every image with its tags, and every path under the store (but the lock file).
fn snapshot(s: &ImageStore) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let images = s.list().unwrap().into_iter().map(|i| (i.id, i.repo_tags)).collect();
    let mut files = Vec::new();
    let mut stack = vec![s.root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(&s.root).unwrap().display().to_string();
            if rel != ".lock" {
                files.push(rel);
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    files.sort();
    (images, files)
}

#[test]
fn load_get_list_and_layers() {
    let (_d, s) = store();
    let base = good_layer(b"hello\n");
    let top = tar_of(&[("data/x", tar::EntryType::Regular, b"x", None), ("bin/.wh..wh..opq", tar::EntryType::Regular, b"", None)]);
    let mut events = Vec::new();
    let loaded = s.load(&mut &archive(&[(vec![base.clone(), top], vec!["busybox:latest", "127.0.0.1:5000/team/x:1"])])[..], &mut |p| events.push(p)).unwrap();
    assert_eq!(loaded, ["busybox:latest", "127.0.0.1:5000/team/x:1"]);
    assert!(events.iter().any(|e| matches!(e, Progress::Extracting { .. })));
    let img = s.get("busybox").unwrap();
    assert_eq!(img.repo_tags, ["busybox:latest", "127.0.0.1:5000/team/x:1"]);
    assert_eq!((img.created, img.architecture.as_str(), img.os.as_str()), (1_700_000_000, "amd64", "linux"));
    assert_eq!(img.config.cmd.as_deref(), Some(&["cmd0".to_string()][..]));
    assert_eq!(
        (img.config.working_dir.as_str(), img.config.exposed_ports.as_slice(), img.config.volumes.as_slice()),
        ("/w", &["80/tcp".to_string()][..], &["/v".to_string()][..])
    );
    assert_eq!(img.layers.len(), 2);
    assert_eq!(img.size, 7);
    assert_eq!(std::fs::read(img.layers[0].join("bin/hello")).unwrap(), b"hello\n");
    assert_eq!(std::fs::read_link(img.layers[0].join("bin/hi")).unwrap(), Path::new("hello"));
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(std::fs::symlink_metadata(img.layers[0].join("etc/gone")).unwrap().file_type().is_char_device());
    assert_eq!(std::fs::metadata(img.layers[0].join("bin/hello")).unwrap().mtime(), 1_600_000_000);
    assert_eq!(std::fs::metadata(img.layers[0].join("bin")).unwrap().mtime(), 1_600_000_000);
    let mut v = vec![0u8; 2];
    let n = opaque_xattr(&img.layers[1].join("bin"), &mut v);
    assert_eq!(&v[..n], b"y");
    for key in [
        "busybox:latest",
        "docker.io/library/busybox",
        "127.0.0.1:5000/team/x:1",
        &img.id,
        hex_of(&img.id),
        &hex_of(&img.id)[..4],
        &format!("sha256:{}", &hex_of(&img.id)[..12]),
    ] {
        assert_eq!(s.get(key).unwrap().id, img.id, "{key}");
    }
    assert_eq!(s.list().unwrap().len(), 1);
    // Loading again finds every layer.
    let mut again = Vec::new();
    let top = tar_of(&[("data/x", tar::EntryType::Regular, b"x", None), ("bin/.wh..wh..opq", tar::EntryType::Regular, b"", None)]);
    s.load(&mut &archive(&[(vec![base, top], vec!["other:1"])])[..], &mut |p| again.push(p)).unwrap();
    assert!(!again.iter().any(|e| matches!(e, Progress::Extracting { .. })), "{again:?}");
    assert_eq!(s.get("other:1").unwrap().id, img.id);
}

/// `trusted.overlay.opaque` of `p` (`getfattr` may not be installed).
fn opaque_xattr(p: &Path, out: &mut [u8]) -> usize {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated strings and an output buffer of the length given.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), c"trusted.overlay.opaque".as_ptr(), out.as_mut_ptr().cast(), out.len()) };
    n.max(0) as usize
}

#[test]
fn unknown_images_are_404() {
    let (_d, s) = store();
    for key in ["nope", "sha256:abcd", "abcdef", "127.0.0.1:5000/x:1"] {
        let e = s.get(key).unwrap_err();
        assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
        assert_eq!(e.http_status(), 404);
        assert_eq!(e.to_string(), format!("No such image: {key}"));
        assert_eq!(s.remove(key, false, &|_| false).unwrap_err().http_status(), 404);
    }
}

#[test]
fn hostile_archives_leave_the_store_unchanged() {
    let (d, s) = store();
    load(&s, &archive(&[(vec![good_layer(b"keep\n")], vec!["keep:1"])])).unwrap();
    let before = snapshot(&s);
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let out = outside.to_str().unwrap().to_string();
    let escapes: Vec<Vec<u8>> = vec![
        tar_of(&[("ok", tar::EntryType::Regular, b"1", None), ("../x", tar::EntryType::Regular, b"x", None)]),
        tar_of(&[("/abs", tar::EntryType::Regular, b"x", None)]),
        tar_of(&[("a/../../x", tar::EntryType::Regular, b"x", None)]),
        tar_of(&[("a", tar::EntryType::Symlink, b"", Some(&out)), ("a/passwd", tar::EntryType::Regular, b"pwned", None)]),
        tar_of(&[("a", tar::EntryType::Symlink, b"", Some(&out)), ("a/sub/", tar::EntryType::Directory, b"", None)]),
        tar_of(&[("a", tar::EntryType::Symlink, b"", Some("/etc")), ("a/.wh.passwd", tar::EntryType::Regular, b"", None)]),
        tar_of(&[("h", tar::EntryType::Link, b"", Some("../../x"))]),
        tar_of(&[("h", tar::EntryType::Link, b"", Some("/etc/passwd"))]),
        tar_of(&[("a", tar::EntryType::Symlink, b"", Some("/etc")), ("h", tar::EntryType::Link, b"", Some("a/passwd"))]),
        tar_of(&[(".wh...", tar::EntryType::Regular, b"", None)]),
    ];
    for (i, layer) in escapes.iter().enumerate() {
        // A good layer first, so something was already unpacked when the bad one fails.
        let ar = archive(&[(vec![good_layer(format!("new{i}").as_bytes()), layer.clone()], vec!["keep:1", "evil:latest"])]);
        let e = load(&s, &ar).unwrap_err();
        assert!(matches!(e, ImageError::LayerEscapes { .. }), "case {i}: {e:?}");
        assert_eq!(e.http_status(), 400);
        assert!(e.to_string().contains("escape"), "{e}");
        assert_eq!(snapshot(&s), before, "case {i} changed the store");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "case {i} wrote outside");
    }
    // A layer that is not what the config says, and a second image that fails after a
    // good first one: nothing of either lands.
    let mut ar = archive(&[(vec![good_layer(b"a")], vec!["liar:1"])]);
    let lie = tar_of(&[("x", tar::EntryType::Regular, b"other", None)]);
    let (name, cfg_diff) = (format!("{}/layer.tar", hex_of(&sha256(&good_layer(b"a")))), sha256(&good_layer(b"a")));
    ar = replace_entry(&ar, &name, &gz(&lie));
    let e = load(&s, &ar).unwrap_err();
    assert!(matches!(&e, ImageError::DigestMismatch { expected, .. } if *expected == cfg_diff), "{e:?}");
    let ar = archive(&[(vec![good_layer(b"first")], vec!["first:1"]), (vec![escapes[0].clone()], vec!["second:1"])]);
    assert!(matches!(load(&s, &ar), Err(ImageError::LayerEscapes { .. })));
    assert_eq!(snapshot(&s), before);
    // Entries under a file: refused as malformed, nothing left.
    let under_file = tar_of(&[("f", tar::EntryType::Regular, b"1", None), ("f/x", tar::EntryType::Regular, b"2", None)]);
    let e = load(&s, &archive(&[(vec![under_file], vec!["odd:1"])])).unwrap_err();
    assert!(matches!(e, ImageError::Malformed(_)) && e.http_status() == 400, "{e:?}");
    assert_eq!(snapshot(&s), before);
    // Not archives at all.
    for junk in [&b""[..], b"garbage", &[0u8; 1024][..], &tar_of(&[("manifest.json", tar::EntryType::Regular, b"{]", None)])] {
        assert!(load(&s, junk).is_err());
        assert_eq!(snapshot(&s), before);
    }
    // A huge manifest.json is refused by its size.
    let huge = vec![b' '; (MAX_JSON + 1) as usize];
    let e = load(&s, &tar_of_big("manifest.json", &huge)).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    // The store still works.
    assert_eq!(std::fs::read(s.get("keep:1").unwrap().layers[0].join("bin/hello")).unwrap(), b"keep\n");
    assert_eq!(ImageStore::open(&s.root).unwrap().list().unwrap().len(), 1);
}

fn tar_of_big(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
    b.into_inner().unwrap()
}

fn replace_entry(ar: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = tar::Builder::new(Vec::new());
    let mut a = tar::Archive::new(ar);
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let mut body = Vec::new();
        e.read_to_end(&mut body).unwrap();
        let body = if path == name { data.to_vec() } else { body };
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_cksum();
        out.append_data(&mut h, &path, &body[..]).unwrap();
    }
    out.into_inner().unwrap()
}

#[test]
fn docker_save_links_and_oci_layouts_load() {
    let (_d, s) = store();
    // `docker save` links a repeated layer to its first copy.
    let l = good_layer(b"linked\n");
    let cfg = config_of(&[&l], "sh");
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("blob.tar", &l);
    add("c.json", &cfg);
    add("manifest.json", br#"[{"Config":"c.json","RepoTags":null,"Layers":["abc/layer.tar"]}]"#);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "abc/layer.tar", "../blob.tar").unwrap();
    let loaded = load(&s, &b.into_inner().unwrap()).unwrap();
    assert_eq!(loaded, [sha256(&cfg)], "untagged images are reported by id");

    // An OCI layout tar.
    let l2 = good_layer(b"oci\n");
    let cfg2 = config_of(&[&l2], "sh");
    let gl = gz(&l2);
    let m = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&cfg2), "size": cfg2.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(&gl), "size": gl.len()}]}))
    .unwrap();
    let idx = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha256(&m), "size": m.len(), "annotations": {"io.containerd.image.name": "docker.io/library/ocitest:2", "org.opencontainers.image.ref.name": "2"}}]})).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("oci-layout".to_string(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json".into(), idx),
        (format!("blobs/sha256/{}", hex_of(&sha256(&m))), m.clone()),
        (format!("blobs/sha256/{}", hex_of(&sha256(&cfg2))), cfg2.clone()),
        (format!("blobs/sha256/{}", hex_of(&sha256(&gl))), gl.clone()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    assert_eq!(load(&s, &b.into_inner().unwrap()).unwrap(), ["ocitest:2"]);
    assert_eq!(std::fs::read(s.get("ocitest:2").unwrap().layers[0].join("bin/hello")).unwrap(), b"oci\n");
}

#[test]
fn remove_like_docker_rmi() {
    let (_d, s) = store();
    let shared = good_layer(b"shared\n");
    load(&s, &archive(&[(vec![shared.clone(), good_layer(b"a")], vec!["a:1", "a:2", "b:1"])])).unwrap();
    load(&s, &archive(&[(vec![shared.clone()], vec!["c:1"])])).unwrap();
    let a = s.get("a:1").unwrap();
    let c = s.get("c:1").unwrap();
    let never = |_: &str| false;
    // By id with several tags: refused unless forced.
    let e = s.remove(&a.id, false, &never).unwrap_err();
    assert!(matches!(e, ImageError::Conflict(_)) && e.http_status() == 409 && e.to_string().contains("must be forced"), "{e}");
    // By tag: untags while other tags are left.
    assert_eq!(s.remove("a:2", false, &never).unwrap(), [Removed::Untagged("a:2".into())]);
    assert_eq!(s.remove("b:1", false, &never).unwrap(), [Removed::Untagged("b:1".into())]);
    // In use: refused by id, left dangling by its last tag.
    let busy = |id: &str| id == a.id;
    assert!(matches!(s.remove(&a.id[..20], false, &busy), Err(ImageError::InUse { .. })));
    assert_eq!(s.remove("a:1", false, &busy).unwrap(), [Removed::Untagged("a:1".into())]);
    assert!(s.get(&a.id).unwrap().repo_tags.is_empty());
    // By id, now untagged: deleted with its own layer; the shared layer stays for c.
    let r = s.remove(&a.id, false, &never).unwrap();
    assert_eq!(r, [Removed::Deleted(a.id.clone()), Removed::Deleted(a.diff_ids[1].clone())]);
    assert!(!a.layers[1].exists() && a.layers[0].exists());
    assert!(!s.blob_path(&a.id).exists());
    // The last tag of c: untagged and deleted, every file with it.
    let r = s.remove("c:1", false, &never).unwrap();
    assert_eq!(r, [Removed::Untagged("c:1".into()), Removed::Deleted(c.id.clone()), Removed::Deleted(c.diff_ids[0].clone())]);
    assert!(s.list().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(s.root.join("blobs/sha256")).unwrap().count(), 0);
    // Forced, with tags in several repositories and in use.
    load(&s, &archive(&[(vec![shared], vec!["x:1", "y:1"])])).unwrap();
    let x = s.get("x:1").unwrap();
    let r = s.remove(&x.id[7..19], true, &|_| true).unwrap();
    assert_eq!(r[..3], [Removed::Untagged("x:1".into()), Removed::Untagged("y:1".into()), Removed::Deleted(x.id.clone())]);
}

// ---- a fake registry on loopback ---------------------------------------------------

type Handler = dyn Fn(&str, &HashMap<String, String>) -> (u16, Vec<(String, String)>, Vec<u8>) + Send + Sync;

/// Serves HTTP/1.1 on 127.0.0.1 (one request per connection) with `h`; returns the port.
fn serve(h: Arc<Handler>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().unwrap());
                // Plain HTTP only: a TLS hello (the client's first try) is hung up on.
                if !r.fill_buf().is_ok_and(|b| b.first().is_some_and(u8::is_ascii_uppercase)) {
                    return;
                }
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                let mut headers = HashMap::new();
                loop {
                    let mut l = String::new();
                    if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = l.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let (code, hs, body) = h(&path, &headers);
                let mut c = c;
                let mut head = format!("HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
                for (k, v) in hs {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = c.write_all(head.as_bytes()).and_then(|_| c.write_all(&body));
            });
        }
    });
    port
}

fn manifest_of(cfg: &[u8], layers: &[&[u8]]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": sha256(cfg), "size": cfg.len()},
        "layers": layers.iter().map(|l| serde_json::json!({"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": sha256(l), "size": l.len()})).collect::<Vec<_>>()}))
    .unwrap()
}

/// A registry wanting anonymous bearer tokens, with `team/app` (an index), `team/evil`
/// (a layer that escapes), `team/liar` (a blob that is not what its digest says) and
/// `team/huge` (a 5 MiB manifest).
fn fake_registry() -> (u16, Vec<u8>) {
    let layer = good_layer(b"pulled\n");
    let glayer = gz(&layer);
    let cfg = config_of(&[&layer], "sh");
    let m = manifest_of(&cfg, &[&glayer]);
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "1".repeat(64)), "size": 10, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": sha256(&m), "size": m.len(), "platform": {"os": "linux", "architecture": "amd64"}}]})).unwrap();
    let evil_layer = tar_of(&[("../../../escaped", tar::EntryType::Regular, b"x", None)]);
    let evil_cfg = config_of(&[&evil_layer], "sh");
    let evil_m = manifest_of(&evil_cfg, &[&evil_layer]);
    // Announces the uncompressed layer's digest and size, serves it gzip-compressed.
    let liar_layer = good_layer(b"liar\n");
    let liar_cfg = config_of(&[&liar_layer], "sh");
    let liar_m = manifest_of(&liar_cfg, &[&liar_layer]);
    let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
    for b in [&glayer, &cfg, &evil_layer, &evil_cfg, &liar_cfg] {
        blobs.insert(sha256(b), b.clone());
    }
    blobs.insert(sha256(&liar_layer), gz(&liar_layer));
    let mut manifests: HashMap<String, (String, Vec<u8>)> = HashMap::new();
    manifests.insert(format!("team/app/{}", sha256(&index)), ("application/vnd.oci.image.index.v1+json".into(), index.clone()));
    manifests.insert("team/app/latest".into(), ("application/vnd.oci.image.index.v1+json".into(), index));
    manifests.insert(format!("team/app/{}", sha256(&m)), ("application/vnd.docker.distribution.manifest.v2+json".into(), m));
    manifests.insert("team/evil/latest".into(), ("application/vnd.docker.distribution.manifest.v2+json".into(), evil_m));
    manifests.insert("team/liar/latest".into(), ("application/vnd.docker.distribution.manifest.v2+json".into(), liar_m));
    let mut huge = b"{\"schemaVersion\":2,\"pad\":\"".to_vec();
    huge.resize(5 << 20, b'a');
    huge.extend_from_slice(b"\"}");
    manifests.insert("team/huge/latest".into(), ("application/json".into(), huge));
    let port_cell = Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let port = serve(Arc::new(move |path: &str, h: &HashMap<String, String>| {
        let port = *pc.get().unwrap();
        let challenge = vec![("WWW-Authenticate".to_string(), format!("Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"fake\""))];
        if path.starts_with("/token?") {
            return if path.contains("scope=repository%3Ateam%2F") || path.contains("scope=repository:team/") {
                (200, vec![], br#"{"token":"tok"}"#.to_vec())
            } else {
                (400, vec![], path.as_bytes().to_vec())
            };
        }
        if h.get("authorization").map(String::as_str) != Some("Bearer tok") {
            return (401, challenge, b"{}".to_vec());
        }
        let Some(rest) = path.strip_prefix("/v2/") else { return (404, vec![], vec![]) };
        if rest.is_empty() {
            return (200, vec![], b"{}".to_vec());
        }
        if let Some((repo, r)) = rest.split_once("/manifests/") {
            return match manifests.get(&format!("{repo}/{r}")) {
                Some((ct, b)) => (200, vec![("Content-Type".into(), ct.clone())], b.clone()),
                None => (404, vec![], br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#.to_vec()),
            };
        }
        if let Some((_, d)) = rest.split_once("/blobs/") {
            return match blobs.get(d) {
                Some(b) => (200, vec![], b.clone()),
                None => (404, vec![], vec![]),
            };
        }
        (404, vec![], vec![])
    }));
    port_cell.set(port).unwrap();
    (port, layer)
}

#[test]
fn pull_from_a_registry_with_tokens_and_an_index() {
    let (port, _) = fake_registry();
    let (_d, s) = store();
    let name = format!("127.0.0.1:{port}/team/app");
    let mut events = Vec::new();
    let img = s.pull(&name, &mut |p| events.push(p)).unwrap();
    assert_eq!(img.repo_tags, [format!("{name}:latest")]);
    assert!(img.repo_digests[0].starts_with(&format!("{name}@sha256:")));
    assert_eq!(std::fs::read(img.layers[0].join("bin/hello")).unwrap(), b"pulled\n");
    assert!(matches!(events.first(), Some(Progress::Resolving { .. })));
    assert!(events.iter().any(|e| matches!(e, Progress::Downloading { .. })));
    assert!(events.iter().any(|e| matches!(e, Progress::LayerDone { .. })));
    assert!(matches!(events.last(), Some(Progress::Done { id, .. }) if *id == img.id));
    // Every blob kept: index, manifest, config, layer.
    assert_eq!(std::fs::read_dir(s.root.join("blobs/sha256")).unwrap().count(), 4);
    // Again: nothing downloaded.
    let mut again = Vec::new();
    assert_eq!(s.pull(&format!("{name}:latest"), &mut |p| again.push(p)).unwrap().id, img.id);
    assert!(again.iter().any(|e| matches!(e, Progress::AlreadyExists { .. })));
    assert!(!again.iter().any(|e| matches!(e, Progress::Downloading { .. })), "{again:?}");
    assert_eq!(s.get(&name).unwrap().id, img.id);
    assert_eq!(s.get(&img.repo_digests[0]).unwrap().id, img.id);
    // By digest.
    let by_digest = s.pull(&img.repo_digests[0], &mut |_| {}).unwrap();
    assert_eq!(by_digest.id, img.id);
}

#[test]
fn hostile_registries_leave_the_store_unchanged() {
    let (port, _) = fake_registry();
    let (_d, s) = store();
    s.pull(&format!("127.0.0.1:{port}/team/app"), &mut |_| {}).unwrap();
    let before = snapshot(&s);
    let e = s.pull(&format!("127.0.0.1:{port}/team/evil"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImageError::LayerEscapes { .. }), "{e:?}");
    assert_eq!(snapshot(&s), before);
    let e = s.pull(&format!("127.0.0.1:{port}/team/liar"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. } | ImageError::Registry { .. }), "{e:?}");
    assert_eq!(snapshot(&s), before);
    let e = s.pull(&format!("127.0.0.1:{port}/team/huge"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImageError::Malformed(_)) && e.to_string().contains("larger than"), "{e:?}");
    let e = s.pull(&format!("127.0.0.1:{port}/team/nothing:1"), &mut |_| {}).unwrap_err();
    assert_eq!(e.http_status(), 404, "{e:?}");
    let e = s.pull(&format!("127.0.0.1:{port}/other/x"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImageError::Registry { .. } | ImageError::Unauthorized(_)), "{e:?}");
    assert_eq!(snapshot(&s), before);
    // Nobody listening.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = s.pull(&format!("127.0.0.1:{free}/x"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImageError::Registry { .. }) && e.to_string().contains("cannot reach"), "{e}");
    assert!(matches!(s.pull("Bad Name", &mut |_| {}), Err(ImageError::InvalidReference(_))));
}

#[test]
fn concurrent_pulls_of_one_image() {
    let (port, _) = fake_registry();
    let (_d, s) = store();
    let s = Arc::new(s);
    let name = format!("127.0.0.1:{port}/team/app");
    let ts: Vec<_> = (0..4)
        .map(|_| {
            let (s, name) = (s.clone(), name.clone());
            std::thread::spawn(move || s.pull(&name, &mut |_| {}).map(|i| i.id))
        })
        .collect();
    let ids: BTreeSet<String> = ts.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 1);
    assert_eq!(snapshot(&s).1.iter().filter(|f| f.contains(".tmp-")).count(), 0);
}

// ---- parsers ------------------------------------------------------------------------

#[test]
fn manifests_and_configs_parse() {
    let cfg = config_of(&[b"x"], "sh");
    let c = parse_config(&cfg, "c").unwrap();
    assert_eq!((c.diff_ids.len(), c.created), (1, 1_700_000_000));
    let m = manifest_of(&cfg, &[b"l"]);
    assert!(matches!(parse_manifest(&m, "", "m").unwrap(), Manifest::Image { layers, .. } if layers.len() == 1));
    let e = parse_manifest(br#"{"schemaVersion":1,"fsLayers":[]}"#, "", "m").unwrap_err();
    assert!(e.to_string().contains("schema 1"), "{e}");
    let e = parse_manifest(br#"{"config":{"digest":"sha256:../../etc"},"layers":[]}"#, "", "m").unwrap_err();
    assert!(e.to_string().contains("digest"), "{e}");
    let e = parse_config(br#"{"rootfs":{"diff_ids":["sha256:x/../../y"]}}"#, "c").unwrap_err();
    assert!(e.to_string().contains("diff id"), "{e}");
    let e = parse_save_manifest(b"{}").unwrap_err();
    assert!(e.to_string().contains("not a list"), "{e}");
    assert_eq!(parse_time("1970-01-01T00:00:00Z"), 0);
    assert_eq!(parse_time("2023-11-14T22:13:20.123456789Z"), 1_700_000_000);
    assert_eq!(parse_time("2023-11-15T00:13:20+02:00"), 1_700_000_000);
    assert_eq!(parse_time("junk"), 0);
    assert_eq!(parse_time("2023-13-99T99:00:00Z"), 0);
}

proptest::proptest! {
    #[test]
    fn parsers_never_panic_on_bytes(b in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = parse_manifest(&b, "", "m");
        let _ = parse_config(&b, "c");
        let _ = parse_save_manifest(&b);
        let _ = parse_time(&String::from_utf8_lossy(&b));
    }

    #[test]
    fn parsers_never_panic_on_json_like_text(s in r#"[\[\]{}",:0-9a-z \-\.]{0,200}"#) {
        for wrapped in [s.clone(), format!(r#"{{"manifests":[{s}]}}"#), format!(r#"{{"config":{{{s}}},"layers":[{s}]}}"#), format!(r#"{{"config":{{"Env":{s}}},"rootfs":{{"diff_ids":[{s}]}}}}"#), format!("[{{\"Config\":{s}}}]")] {
            let _ = parse_manifest(wrapped.as_bytes(), "", "m");
            let _ = parse_config(wrapped.as_bytes(), "c");
            let _ = parse_save_manifest(wrapped.as_bytes());
        }
    }

    #[test]
    fn references_round_trip(name in "[a-z0-9]{1,8}(/[a-z0-9]{1,4}([._-][a-z0-9]{1,4})?){0,2}", tag in proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}"), host in proptest::option::of("(localhost|127\\.0\\.0\\.1|reg\\.example)(:[0-9]{2,5})?")) {
        let mut s = host.map(|h| format!("{h}/{name}")).unwrap_or(name);
        if let Some(t) = &tag {
            s = format!("{s}:{t}");
        }
        let r = Reference::parse(&s).unwrap();
        let again = Reference::parse(&r.familiar()).unwrap();
        proptest::prop_assert_eq!(r, again);
    }

    #[test]
    fn random_lookups_never_panic(key in ".{0,80}") {
        let (_d, s) = store();
        let _ = s.get(&key);
        let _ = s.remove(&key, false, &|_| false);
    }
}
