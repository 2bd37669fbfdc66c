// SPDX-License-Identifier: Apache-2.0
//! `docker save`: images as one tar archive that `docker load` (Docker's and this
//! store's) reads back: Docker's `manifest.json` and an OCI image layout (`oci-layout`,
//! `index.json`, `blobs/sha256/...`), made of the blobs as the registry sent them, so
//! every digest and diff id is the image's own.

use serde_json::{json, Value};
use std::io::Write;

use super::{hex_of, ImageError, ImageStore, Record};

/// One image's part of the archive.
struct Saved {
    config: String,
    manifest: (String, String, u64),
    layers: Vec<String>,
    tags: Vec<String>,
}

/// The layer blobs an image manifest names, lowest first.
pub(super) fn layer_digests(doc: &Value) -> Vec<String> {
    doc["layers"].as_array().into_iter().flatten().filter_map(|l| l["digest"].as_str().map(str::to_string)).collect()
}

/// A manifest's media type: its own `mediaType`, or (an OCI manifest may leave it out)
/// the one its config's media type implies.
pub(super) fn manifest_media_type(doc: &Value) -> String {
    match (doc["mediaType"].as_str(), doc["config"]["mediaType"].as_str()) {
        (Some(m), _) => m.to_string(),
        (None, Some(c)) if c.starts_with("application/vnd.oci.") => "application/vnd.oci.image.manifest.v1+json".into(),
        _ => "application/vnd.docker.distribution.manifest.v2+json".into(),
    }
}

impl ImageStore {
    /// The manifest of image `id` as its registry sent it (the blob that names the
    /// config): (digest, document, bytes). An image loaded from an archive or made here
    /// has none: refused, naming it (`name`), as it cannot be saved or pushed.
    pub(super) fn manifest_of(&self, rec: &Record, id: &str, name: &str) -> Result<(String, Value, Vec<u8>), ImageError> {
        rec.blobs
            .iter()
            .find_map(|b| {
                let bytes = std::fs::read(self.blob_path(b)).ok()?;
                let v: Value = serde_json::from_slice(&bytes).ok()?;
                (v["config"]["digest"].as_str() == Some(id)).then(|| (b.clone(), v, bytes))
            })
            .ok_or_else(|| {
                ImageError::Conflict(format!(
                    "image {name} was loaded from an archive or made on this target: the target keeps its unpacked layers, not their archives, so it cannot be saved or pushed (pull it from a registry first)"
                ))
            })
    }

    /// Writes the images named by `names` (tags, ids) as a `docker save` archive to `out`;
    /// an image named by a tag carries that tag, one named by its id none.
    /// An image loaded from an archive keeps its unpacked layers only, not their
    /// archives, and cannot be saved (refused, naming it).
    pub fn save(&self, names: &[String], out: impl Write) -> Result<(), ImageError> {
        let repos = self.read_repos()?;
        let mut images: Vec<Saved> = Vec::new();
        for name in names {
            let (id, named) = self.find(&repos, name)?;
            let rec = &repos.images[&id];
            // As Docker: an image named by a tag is saved with that tag; one named by its
            // id or a digest with none (it loads back untagged).
            let tags = match named {
                Some(t) if !t.contains('@') => vec![t],
                _ => Vec::new(),
            };
            if let Some(s) = images.iter_mut().find(|s| s.config == id) {
                for t in tags {
                    if !s.tags.contains(&t) {
                        s.tags.push(t);
                    }
                }
                continue;
            }
            let (digest, doc, bytes) = self.manifest_of(rec, &id, name)?;
            let size = bytes.len() as u64;
            let layers = layer_digests(&doc);
            if let Some(missing) = layers.iter().find(|l| !self.blob_path(l).exists()) {
                return Err(ImageError::NotFound(format!("layer {missing} of image {name}")));
            }
            let media = manifest_media_type(&doc);
            images.push(Saved { config: id.clone(), manifest: (digest, media, size), layers, tags });
        }
        let mut ar = tar::Builder::new(out);
        let put_bytes = |ar: &mut tar::Builder<_>, name: &str, data: &[u8]| -> Result<(), ImageError> {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_cksum();
            ar.append_data(&mut h, name, data).map_err(|e| ImageError::Malformed(format!("writing the archive: {e}")))
        };
        put_bytes(&mut ar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let mut written = std::collections::BTreeSet::new();
        let mut manifest_json = Vec::new();
        let mut index = Vec::new();
        for s in &images {
            for b in std::iter::once(&s.config).chain(&s.layers).chain(std::iter::once(&s.manifest.0)) {
                if written.insert(b.clone()) {
                    let p = self.blob_path(b);
                    let mut f = std::fs::File::open(&p).map_err(super::io_err(&p))?;
                    ar.append_file(format!("blobs/sha256/{}", hex_of(b)), &mut f).map_err(|e| ImageError::Malformed(format!("writing the archive: {e}")))?;
                }
            }
            manifest_json.push(json!({
                "Config": format!("blobs/sha256/{}", hex_of(&s.config)), "RepoTags": s.tags,
                "Layers": s.layers.iter().map(|l| format!("blobs/sha256/{}", hex_of(l))).collect::<Vec<_>>(),
            }));
            let entry = |name: Option<&String>| {
                let mut e = json!({"mediaType": s.manifest.1, "digest": s.manifest.0, "size": s.manifest.2});
                if let Some(n) = name {
                    e["annotations"] = json!({"io.containerd.image.name": n, "org.opencontainers.image.ref.name": n.rsplit(':').next().unwrap_or("latest")});
                }
                e
            };
            if s.tags.is_empty() {
                index.push(entry(None));
            }
            index.extend(s.tags.iter().map(|t| entry(Some(t))));
        }
        put_bytes(&mut ar, "manifest.json", &serde_json::to_vec(&manifest_json).unwrap_or_default())?;
        let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": index});
        put_bytes(&mut ar, "index.json", &serde_json::to_vec(&index).unwrap_or_default())?;
        ar.into_inner().and_then(|mut w| w.flush()).map_err(|e| ImageError::Malformed(format!("writing the archive: {e}")))
    }
}
