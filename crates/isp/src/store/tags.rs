// SPDX-License-Identifier: Apache-2.0
//! `docker tag` and what `history` reads: another name for an image (taken from any
//! image that held it), and an image's configuration document as stored.

use super::{ImageError, ImageStore, Reference};

impl ImageStore {
    /// Tags the image `name_or_id` as `repo[:tag]` (`latest` when no tag is given); an
    /// image that had that name loses it, as with Docker. A digest cannot be a tag.
    pub fn tag(&self, name_or_id: &str, repo: &str, tag: Option<&str>) -> Result<String, ImageError> {
        let full = match tag.filter(|t| !t.is_empty()) {
            Some(t) => {
                if t.len() > 128 || !t.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) || t.starts_with(['.', '-']) {
                    return Err(ImageError::InvalidReference(format!("invalid tag format {t:?}: [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")));
                }
                format!("{repo}:{t}")
            }
            None => repo.to_string(),
        };
        let r = Reference::parse(&full)?;
        if r.digest.is_some() {
            return Err(ImageError::InvalidReference(format!("refusing to create a tag with a digest reference: {full}")));
        }
        let name = r.familiar();
        let _w = self.write_lock()?;
        let mut repos = self.read_repos()?;
        let (id, _) = self.find(&repos, name_or_id)?;
        for rec in repos.images.values_mut() {
            rec.repo_tags.retain(|t| *t != name);
        }
        repos.images.get_mut(&id).expect("found above").repo_tags.push(name.clone());
        self.write_repos(&repos)?;
        Ok(name)
    }

    /// The configuration document of image `name_or_id` (its `history`, `config`, ...).
    pub fn config_document(&self, name_or_id: &str) -> Result<serde_json::Value, ImageError> {
        let img = self.get(name_or_id)?;
        let p = self.blob_path(&img.id);
        let bytes = std::fs::read(&p).map_err(super::io_err(&p))?;
        serde_json::from_slice(&bytes).map_err(|e| ImageError::Malformed(format!("config of image {}: {e}", img.id)))
    }
}

/// The bytes of an unpacked layer's files.
pub fn layer_size(p: &std::path::Path) -> u64 {
    super::dir_size(p)
}
