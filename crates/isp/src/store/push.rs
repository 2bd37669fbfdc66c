// SPDX-License-Identifier: Apache-2.0
//! `docker push`: an image's blobs and manifest, as the registry it came from sent them,
//! to the registry its name gives, under its tag.
//!
//! The manifest is pushed byte for byte, so the image keeps its digest; blobs the
//! repository holds already are not sent again.

use super::registry::{Credentials, Registry};
use super::save::{layer_digests, manifest_media_type};
use super::{hex_of, ImageError, ImageStore, Reference};

/// What a push tells as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushProgress {
    /// The repository pushed to.
    Repository(String),
    /// The registry holds the layer already.
    LayerExists(String),
    /// A layer is being sent.
    Pushing(String),
    /// A layer was sent.
    Pushed(String),
    /// The manifest is in place: tag, digest, size of the manifest.
    Done {
        /// The tag.
        tag: String,
        /// The manifest's digest.
        digest: String,
        /// The manifest's bytes.
        size: u64,
    },
}

impl ImageStore {
    /// Pushes the image tagged `name` (`127.0.0.1:5000/x:1.0`; without a tag, every tag of
    /// that repository) to its registry, with `credentials` when given. Images without
    /// the manifest they were pulled with (loaded, imported, committed or built here) are
    /// refused, naming them: their layers are kept unpacked, not as the archives a
    /// registry stores.
    pub fn push(&self, name: &str, credentials: Option<Credentials>, progress: &mut dyn FnMut(PushProgress)) -> Result<(), ImageError> {
        let r = Reference::parse(name)?;
        if r.digest.is_some() {
            return Err(ImageError::InvalidReference(format!("{name}: push a tag, not a digest")));
        }
        let repos = self.read_repos()?;
        // `docker push NAME` without a tag pushes every tag of NAME.
        let tags: Vec<String> = if name.rsplit('/').next().is_some_and(|l| l.contains(':')) {
            vec![r.familiar()]
        } else {
            let repo = r.familiar_name();
            let mut all: Vec<String> = repos.images.values().flat_map(|rec| rec.repo_tags.iter()).filter(|t| super::ref_name(t) == repo).cloned().collect();
            all.sort();
            all
        };
        if tags.is_empty() {
            return Err(ImageError::NotFound(format!("{}: no tag of it is here (docker tag IMAGE {name})", r.familiar_name())));
        }
        progress(PushProgress::Repository(r.familiar_name()));
        let bases = Registry::sources(&r, &self.registries, false).remove(0);
        let mut reg = Registry::connect(&r, &bases, credentials, format!("repository:{}:pull,push", r.repository))?;
        for tag in tags {
            let (id, _) = self.find(&repos, &tag)?;
            let (_, doc, bytes) = self.manifest_of(&repos.images[&id], &id, &tag)?;
            let media = manifest_media_type(&doc);
            for layer in layer_digests(&doc) {
                let short: String = hex_of(&layer).chars().take(12).collect();
                if reg.has_blob(&layer)? {
                    progress(PushProgress::LayerExists(short));
                    continue;
                }
                let path = self.blob_path(&layer);
                if !path.exists() {
                    return Err(ImageError::NotFound(format!("layer {layer} of image {tag}")));
                }
                progress(PushProgress::Pushing(short.clone()));
                reg.upload_blob(&layer, &path)?;
                progress(PushProgress::Pushed(short));
            }
            if !reg.has_blob(&id)? {
                reg.upload_blob(&id, &self.blob_path(&id))?;
            }
            let tag_only = Reference::parse(&tag)?.tag.unwrap_or_else(|| "latest".into());
            let digest = reg.put_manifest(&tag_only, &bytes, &media)?;
            progress(PushProgress::Done { tag: tag_only, digest, size: bytes.len() as u64 });
        }
        Ok(())
    }
}
