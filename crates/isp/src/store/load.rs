// SPDX-License-Identifier: Apache-2.0
//! `docker load`: a `docker save` archive (`manifest.json`, configs, layer tars, possibly
//! linked to one another), or an OCI image layout packed as a tar (`index.json`,
//! `blobs/sha256/...`).
//!
//! The archive is spooled first, each regular entry under a name of our own (a hash of its
//! path), so no name in the archive ever becomes a path here; the archive's own symlinks
//! and hard links (`docker save` links repeated layers) are followed by name, inside the
//! archive only.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::manifest::{self, Manifest, SaveEntry, MAX_JSON};
use super::{dir_size, io_err, sha256, ImageError, ImageStore, NewImage, Progress, Reference, Staged};

/// The spooled archive: its regular files, and its links by name.
struct Spool {
    files: BTreeMap<String, PathBuf>,
    links: BTreeMap<String, String>,
}

fn bad(e: &dyn std::fmt::Display) -> ImageError {
    ImageError::Malformed(format!("not a docker save or OCI layout archive: {e}"))
}

/// `name` relative to the archive's root, without `.`/`..` (`None` if it climbs out).
fn normal(name: &Path) -> Option<String> {
    let mut out: Vec<String> = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(x) => out.push(x.to_string_lossy().into_owned()),
            Component::ParentDir => {
                out.pop()?;
            }
            _ => {}
        }
    }
    Some(out.join("/"))
}

impl Spool {
    fn read(tar: &mut dyn Read, dir: &Path) -> Result<Spool, ImageError> {
        let mut s = Spool { files: BTreeMap::new(), links: BTreeMap::new() };
        let mut ar = tar::Archive::new(tar);
        for e in ar.entries().map_err(|e| bad(&e))? {
            let mut e = e.map_err(|e| bad(&e))?;
            let path = e.path().map_err(|e| bad(&e))?.into_owned();
            let Some(name) = normal(&path) else { continue };
            match e.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let p = dir.join(hex::encode(&Sha256::digest(name.as_bytes())[..16]));
                    let mut out = std::fs::File::create(&p).map_err(io_err(&p))?;
                    std::io::copy(&mut e, &mut out).map_err(|e| bad(&e))?;
                    s.files.insert(name, p);
                }
                kind @ (tar::EntryType::Symlink | tar::EntryType::Link) => {
                    let Some(to) = e.link_name().map_err(|e| bad(&e))? else { continue };
                    // A symlink is relative to its directory; a hard link names an entry.
                    let joined = if kind == tar::EntryType::Symlink { path.parent().unwrap_or(Path::new("")).join(&to) } else { to.into_owned() };
                    if let Some(t) = normal(&joined) {
                        s.links.insert(name, t);
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    /// The spooled file of entry `name`, through at most 8 links.
    fn get(&self, name: &str) -> Option<&PathBuf> {
        let mut n = normal(Path::new(name))?;
        for _ in 0..8 {
            if let Some(p) = self.files.get(&n) {
                return Some(p);
            }
            n = self.links.get(&n)?.clone();
        }
        None
    }

    fn small(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let p = self.get(name).ok_or_else(|| ImageError::Malformed(format!("the archive has no {name}")))?;
        let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        if len > MAX_JSON {
            return Err(ImageError::Malformed(format!("{name} in the archive is {len} bytes, more than the {MAX_JSON} accepted; refused")));
        }
        std::fs::read(p).map_err(io_err(p))
    }

    /// The images of an OCI layout: `index.json` → manifests (through nested indexes).
    fn oci_entries(&self) -> Result<Vec<SaveEntry>, ImageError> {
        let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
        let index = self.small("index.json")?;
        let Manifest::Index(list) = manifest::parse_manifest(&index, "", "index.json of the archive")? else {
            return Err(ImageError::Malformed("index.json of the archive is not an OCI index".into()));
        };
        let names = index_names(&index);
        let mut out = Vec::new();
        for d in list {
            let what = format!("manifest {} of the archive", d.digest);
            let mut body = self.small(&blob(&d.digest))?;
            if let Manifest::Index(inner) = manifest::parse_manifest(&body, &d.media_type, &what)? {
                let pick = manifest::pick_platform(&inner).ok_or_else(|| ImageError::NotFound(format!("{what}: no image for linux/amd64")))?;
                body = self.small(&blob(&pick.digest))?;
            }
            let Manifest::Image { config, layers } = manifest::parse_manifest(&body, "", &what)? else {
                return Err(ImageError::Malformed(format!("{what}: an index inside an index inside an index is not supported")));
            };
            out.push(SaveEntry {
                config: blob(&config.digest),
                repo_tags: names.get(&d.digest).cloned().into_iter().collect(),
                layers: layers.iter().map(|l| blob(&l.digest)).collect(),
            });
        }
        Ok(out)
    }
}

/// Image names an OCI index gives its manifests: `io.containerd.image.name`, or a
/// `org.opencontainers.image.ref.name` that is a whole reference (a bare tag names no
/// repository, so that image loads untagged).
fn index_names(index: &[u8]) -> BTreeMap<String, String> {
    let v: serde_json::Value = serde_json::from_slice(index).unwrap_or_default();
    let mut out = BTreeMap::new();
    for m in v["manifests"].as_array().into_iter().flatten() {
        let a = &m["annotations"];
        let name =
            a["io.containerd.image.name"].as_str().or_else(|| a["org.opencontainers.image.ref.name"].as_str().filter(|n| n.contains(':') || n.contains('/')));
        if let (Some(n), Some(d)) = (name, m["digest"].as_str()) {
            out.insert(d.to_string(), n.to_string());
        }
    }
    out
}

impl ImageStore {
    /// `docker load`: reads a `docker save` archive (`manifest.json`, configs, layer tars)
    /// or an OCI image layout tar. Returns what was loaded as docker prints it after
    /// "Loaded image: ": the tags, or the ids of untagged images. All the archive's images
    /// are committed together; on any error (a layer escaping its directory, a wrong diff
    /// id, a malformed document) nothing is changed.
    pub fn load(&self, tar: &mut dyn Read, progress: &mut dyn FnMut(Progress)) -> Result<Vec<String>, ImageError> {
        let spool_dir = self.tmp(&self.root);
        std::fs::create_dir(&spool_dir).map_err(io_err(&spool_dir))?;
        let r = Spool::read(tar, &spool_dir).and_then(|spool| {
            let _w = self.write_lock()?;
            let mut staged = Staged::default();
            let r = self.load_spooled(&spool, &mut staged, progress);
            if r.is_err() {
                staged.rollback();
            }
            r
        });
        let _ = std::fs::remove_dir_all(&spool_dir);
        r
    }

    fn load_spooled(&self, spool: &Spool, staged: &mut Staged, progress: &mut dyn FnMut(Progress)) -> Result<Vec<String>, ImageError> {
        let entries = if spool.get("manifest.json").is_some() {
            manifest::parse_save_manifest(&spool.small("manifest.json")?)?
        } else if spool.get("index.json").is_some() {
            spool.oci_entries()?
        } else {
            return Err(ImageError::Malformed("not a docker save or OCI layout archive: it has neither manifest.json nor index.json".into()));
        };
        if entries.is_empty() {
            return Err(ImageError::Malformed("the archive holds no image".into()));
        }
        let mut new = Vec::new();
        let mut loaded = Vec::new();
        let mut done = Vec::new();
        for ent in entries {
            let cfg_bytes = spool.small(&ent.config)?;
            let id = sha256(&cfg_bytes);
            let cfg = manifest::parse_config(&cfg_bytes, &format!("config {} of the archive", ent.config))?;
            if cfg.diff_ids.len() != ent.layers.len() {
                return Err(ImageError::Malformed(format!(
                    "image {} of the archive: {} layers but the config has {} diff ids",
                    ent.config,
                    ent.layers.len(),
                    cfg.diff_ids.len()
                )));
            }
            let tags = ent.repo_tags.iter().map(|t| Reference::parse(t).map(|r| r.familiar())).collect::<Result<Vec<_>, _>>()?;
            let mut sizes = Vec::new();
            for (lname, diff) in ent.layers.iter().zip(&cfg.diff_ids) {
                let dest = self.layer_path(diff);
                if dest.exists() {
                    progress(Progress::AlreadyExists { digest: diff.clone() });
                    sizes.push(dir_size(&dest));
                    continue;
                }
                let src = spool.get(lname).ok_or_else(|| ImageError::Malformed(format!("the archive has no layer {lname}")))?;
                progress(Progress::Extracting { digest: diff.clone() });
                sizes.push(self.add_layer(src, diff, lname, staged)?);
                progress(Progress::LayerDone { digest: diff.clone() });
            }
            self.put_blob(&id, &cfg_bytes, staged)?;
            if tags.is_empty() {
                loaded.push(id.clone());
            } else {
                loaded.extend(tags.iter().cloned());
            }
            done.push(Progress::Done { id: id.clone(), reference: tags.first().cloned().unwrap_or_else(|| id.clone()) });
            new.push(NewImage { id: id.clone(), tags, digest_ref: None, diff_ids: cfg.diff_ids, sizes, blobs: vec![id], parent: None });
        }
        self.commit(new)?;
        done.into_iter().for_each(progress);
        Ok(loaded)
    }
}
