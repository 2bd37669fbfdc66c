// SPDX-License-Identifier: Apache-2.0
//! `docker pull`: manifest (through an index when there is one), config and layer blobs
//! from a registry, verified, unpacked and committed.
//!
//! Blobs are downloaded to temporary files without the store's lock (so `docker images`
//! and other pulls go on meanwhile); unpacking and the commit happen under it, where a
//! layer another pull has just unpacked is found and reused.

use std::path::PathBuf;

use super::manifest::{self, Descriptor, Manifest};
use super::registry::{FetchedManifest, Registry};
use super::{dir_size, hex_of, Image, ImageError, ImageStore, NewImage, Progress, Reference, Staged};

/// A blob fetched for this pull and not yet in place.
struct Fetched {
    tmp: Vec<PathBuf>,
}

impl Drop for Fetched {
    fn drop(&mut self) {
        for t in &self.tmp {
            let _ = std::fs::remove_file(t);
        }
    }
}

impl ImageStore {
    /// Pulls `reference` (`127.0.0.1:5000/busybox`, `127.0.0.1:5000/busybox:1.0`,
    /// `NAME@sha256:...`; Docker Hub short names such as `busybox` normalise to
    /// `docker.io/library/busybox:latest`).
    ///
    /// Tries HTTPS, and plain HTTP only for the target's insecure registries (loopback
    /// always, as dockerd's default); Docker Hub's images from its mirrors first, the next
    /// source when one fails; answers anonymous bearer-token challenges. Accepts Docker v2 schema 2 and OCI manifests, and manifest lists / OCI
    /// indexes (linux/amd64 is picked). Every blob's sha256 and every layer's diff id is
    /// verified; blobs are kept and each layer is unpacked once. `progress` hears about it
    /// as it happens. On any error the store is left as it was.
    pub fn pull(&self, reference: &str, progress: &mut dyn FnMut(Progress)) -> Result<Image, ImageError> {
        let r = Reference::parse(reference)?;
        let what = r.familiar();
        progress(Progress::Resolving { reference: what.clone() });
        let want = r.digest.clone().or(r.tag.clone()).unwrap_or_else(|| "latest".into());
        let (mut reg, (top_body, ct, top_digest)) = self.resolve(&r, &want)?;
        let mut manifests = vec![(top_digest.clone(), top_body.clone())];
        let (config, layers) = match manifest::parse_manifest(&top_body, &ct, &format!("manifest of {what}"))? {
            Manifest::Image { config, layers } => (config, layers),
            Manifest::Index(list) => {
                let pick = manifest::pick_platform(&list).ok_or_else(|| {
                    let have: Vec<&str> = list.iter().filter_map(|d| d.platform.as_deref()).collect();
                    ImageError::NotFound(format!(
                        "{what}: no image for linux/amd64 (the index has {})",
                        if have.is_empty() { "none".into() } else { have.join(", ") }
                    ))
                })?;
                let (body, ct, digest) = reg.manifest(&r, &pick.digest)?;
                manifests.push((digest, body.clone()));
                match manifest::parse_manifest(&body, &ct, &format!("manifest of {what} for linux/amd64"))? {
                    Manifest::Image { config, layers } => (config, layers),
                    Manifest::Index(_) => return Err(ImageError::Malformed(format!("{what}: an index inside an index is not supported"))),
                }
            }
        };

        // The config first: it names the diff ids, and so which layers are here already.
        let mut fetched = Fetched { tmp: Vec::new() };
        let cfg_bytes = match std::fs::read(self.blob_path(&config.digest)) {
            Ok(b) => b,
            Err(_) => {
                let tmp = self.tmp(&self.root);
                fetched.tmp.push(tmp.clone());
                reg.blob(&r, &config.digest, config.size, &tmp, &mut |_| {})?;
                std::fs::read(&tmp).map_err(super::io_err(&tmp))?
            }
        };
        let cfg = manifest::parse_config(&cfg_bytes, &format!("config of {what}"))?;
        if cfg.diff_ids.len() != layers.len() {
            return Err(ImageError::Malformed(format!("{what}: the manifest has {} layers but the config {} diff ids", layers.len(), cfg.diff_ids.len())));
        }
        let mut blob_tmp: Vec<Option<PathBuf>> = Vec::new();
        for (l, diff) in layers.iter().zip(&cfg.diff_ids) {
            if self.layer_path(diff).exists() || self.blob_path(&l.digest).exists() {
                blob_tmp.push(None);
                continue;
            }
            let tmp = self.tmp(&self.root);
            fetched.tmp.push(tmp.clone());
            reg.blob(&r, &l.digest, l.size, &tmp, progress)?;
            blob_tmp.push(Some(tmp));
        }

        let _w = self.write_lock()?;
        let mut staged = Staged::default();
        let result = (|| {
            let mut sizes = Vec::new();
            for ((l, diff), tmp) in layers.iter().zip(&cfg.diff_ids).zip(&blob_tmp) {
                sizes.push(self.pull_layer(&mut reg, &r, l, diff, tmp.as_ref(), &mut fetched, &mut staged, progress)?);
            }
            self.put_blob(&config.digest, &cfg_bytes, &mut staged)?;
            for (d, body) in &manifests {
                self.put_blob(d, body, &mut staged)?;
            }
            let blobs = std::iter::once(&config).chain(&layers).map(|d| d.digest.clone()).chain(manifests.iter().map(|m| m.0.clone())).collect();
            self.commit(vec![NewImage {
                id: config.digest.clone(),
                tags: r.tag.as_ref().map(|_| what.clone()).into_iter().collect(),
                digest_ref: Some(format!("{}@{top_digest}", r.familiar_name())),
                diff_ids: cfg.diff_ids.clone(),
                sizes,
                blobs,
                parent: None,
            }])
        })();
        if let Err(e) = result {
            staged.rollback();
            return Err(e);
        }
        drop(_w);
        progress(Progress::Done { id: config.digest.clone(), reference: what });
        let repos = self.read_repos()?;
        let rec = repos.images.get(&config.digest).ok_or_else(|| ImageError::NotFound(config.digest.clone()))?;
        self.image(&config.digest, rec)
    }

    /// The first source of `r` (mirrors, then its registry) that has the manifest `want`:
    /// the session and the manifest. When none has it, the first "not found" is told, or
    /// else the last error.
    fn resolve(&self, r: &Reference, want: &str) -> Result<(Registry, FetchedManifest), ImageError> {
        let mut errors = Vec::new();
        for bases in Registry::sources(r, &self.registries, true) {
            let scope = format!("repository:{}:pull", r.repository);
            match Registry::connect(r, &bases, None, scope).and_then(|mut reg| reg.manifest(r, want).map(|m| (reg, m))) {
                Ok(found) => return Ok(found),
                Err(e) => errors.push(e),
            }
        }
        let first_missing = errors.iter().position(|e| matches!(e, ImageError::NotFound(_)));
        Err(match first_missing {
            Some(i) => errors.swap_remove(i),
            None => errors.pop().unwrap_or_else(|| ImageError::NotFound(r.familiar())),
        })
    }

    /// Puts one layer in place under the writer's lock; returns its unpacked size.
    #[allow(clippy::too_many_arguments)]
    fn pull_layer(
        &self,
        reg: &mut Registry,
        r: &Reference,
        l: &Descriptor,
        diff: &str,
        tmp: Option<&PathBuf>,
        fetched: &mut Fetched,
        staged: &mut Staged,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64, ImageError> {
        let dest = self.layer_path(diff);
        if dest.exists() {
            progress(Progress::AlreadyExists { digest: l.digest.clone() });
            return Ok(dir_size(&dest));
        }
        let final_blob = self.blob_path(&l.digest);
        let src = match tmp {
            Some(t) => t.clone(),
            None if final_blob.exists() => final_blob.clone(),
            None => {
                // Removed by an `rmi` since we looked: fetch it now.
                let t = self.tmp(&self.root);
                fetched.tmp.push(t.clone());
                reg.blob(r, &l.digest, l.size, &t, progress)?;
                t
            }
        };
        progress(Progress::Extracting { digest: l.digest.clone() });
        let size = self.add_layer(&src, diff, &format!("{} of {}", &hex_of(&l.digest)[..12], r.familiar()), staged)?;
        if src != final_blob && !final_blob.exists() {
            std::fs::rename(&src, &final_blob).map_err(super::io_err(&final_blob))?;
            staged.0.push(final_blob);
        }
        progress(Progress::LayerDone { digest: l.digest.clone() });
        Ok(size)
    }
}
