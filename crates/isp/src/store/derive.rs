// SPDX-License-Identifier: Apache-2.0
//! `docker commit`: a new image made of another's layers and one more layer (a container's
//! changes, as a tar archive), with a configuration document the caller prepared.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;

use super::{dir_size, io_err, ImageError, ImageStore, NewImage, Reference, Staged};

impl ImageStore {
    /// Adds the image of `parent`'s layers (none: `docker import`) and the uncompressed
    /// layer archive `layer`, configured by `config` (an image configuration document; its
    /// `rootfs` is filled here), tagged `tag` if given, with `parent` recorded as its
    /// parent (moby's `Parent`). Nothing is stored if any step fails. Returns the id.
    pub fn derive(&self, parent: Option<&str>, layer: &Path, mut config: Value, tag: Option<&str>) -> Result<String, ImageError> {
        let tag = tag.map(|t| Reference::parse(t).map(|r| r.familiar())).transpose()?;
        let mut f = std::fs::File::open(layer).map_err(io_err(layer))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(io_err(layer))?;
        let diff = format!("sha256:{}", hex::encode(h.finalize()));
        let _w = self.write_lock()?;
        let repos = self.read_repos()?;
        let (mut diff_ids, mut sizes, parent_id) = match parent {
            Some(p) => {
                let (parent_id, _) = self.find(&repos, p)?;
                let rec = &repos.images[&parent_id];
                (rec.diff_ids.clone(), rec.sizes.clone(), Some(parent_id))
            }
            None => (Vec::new(), Vec::new(), None),
        };
        diff_ids.push(diff.clone());
        config["rootfs"] = json!({"type": "layers", "diff_ids": diff_ids});
        let bytes = serde_json::to_vec(&config).map_err(|e| ImageError::Malformed(e.to_string()))?;
        let id = super::sha256(&bytes);
        let mut staged = Staged::default();
        let r = (|| {
            let dest = self.layer_path(&diff);
            sizes.push(if dest.exists() { dir_size(&dest) } else { self.add_layer(layer, &diff, "the container's changes", &mut staged)? });
            self.put_blob(&id, &bytes, &mut staged)?;
            self.commit(vec![NewImage {
                id: id.clone(),
                tags: tag.into_iter().collect(),
                digest_ref: None,
                diff_ids,
                sizes,
                blobs: vec![id.clone()],
                parent: parent_id,
            }])
        })();
        if r.is_err() {
            staged.rollback();
        }
        r.map(|_| id)
    }
}
