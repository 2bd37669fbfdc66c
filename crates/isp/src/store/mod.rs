// SPDX-License-Identifier: Apache-2.0
//! The image store, kept in the target's private namespace (DockerSSD keeps `/images/` there).
//!
//! ```text
//! ROOT/blobs/sha256/<hex>      manifests, configs and layer blobs, as the registry sent them
//! ROOT/layers/<diff id hex>/   each layer unpacked once, ready as an overlayfs lowerdir
//! ROOT/repositories.json       image id (the config's digest) → tags, digests, layers
//! ```
//!
//! Writers hold one lock; every change lands in a temporary name first and is renamed into
//! place, and `repositories.json` is replaced atomically last, so a failed pull or load
//! leaves the store as it was.

mod reference;
mod registry;
mod unpack;

pub use reference::Reference;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use registry::{Registry, MAX_JSON};

/// What went wrong with an image, with the HTTP status the Docker API answers with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// No image by that name or id, here or in the registry.
    #[error("No such image: {0}")]
    NotFound(String),
    /// The name is not a valid image reference.
    #[error("{0}")]
    InvalidReference(String),
    /// The registry could not be used.
    #[error("registry {registry}: {message}")]
    Registry {
        /// host[:port].
        registry: String,
        /// What happened.
        message: String,
    },
    /// The registry wants credentials (only anonymous pulls are supported).
    #[error("pull access denied for {0}: the registry requires credentials (only anonymous pulls are supported)")]
    Unauthorized(String),
    /// Content does not match its digest.
    #[error("{what}: digest mismatch (expected {expected}, got {actual})")]
    DigestMismatch {
        /// Which content.
        what: String,
        /// The digest it was announced with.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A layer entry would land outside the layer's directory.
    #[error("layer {layer}: entry {path:?} would escape the layer's directory; the image is refused and nothing was stored")]
    LayerEscapes {
        /// The layer.
        layer: String,
        /// The offending entry.
        path: String,
    },
    /// A manifest, config or archive is not what it should be.
    #[error("{0}")]
    Malformed(String),
    /// Containers use the image.
    #[error("conflict: unable to delete {image} (must be forced) - the image is being used by a container")]
    InUse {
        /// The image.
        image: String,
    },
    /// The request is ambiguous or conflicts (several tags, need force).
    #[error("{0}")]
    Conflict(String),
    /// A file of the store could not be used.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl ImageError {
    /// The HTTP status of this error in the Docker Engine API.
    pub fn http_status(&self) -> u16 {
        match self {
            ImageError::NotFound(_) => 404,
            ImageError::InvalidReference(_) | ImageError::Malformed(_) | ImageError::LayerEscapes { .. } | ImageError::DigestMismatch { .. } => 400,
            ImageError::Unauthorized(_) => 401,
            ImageError::InUse { .. } | ImageError::Conflict(_) => 409,
            _ => 500,
        }
    }
}

/// Progress of a pull or load.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Asking the registry for the manifest.
    Resolving {
        /// The reference.
        reference: String,
    },
    /// Bytes of a blob arrived.
    Downloading {
        /// The blob.
        digest: String,
        /// Bytes so far.
        current: u64,
        /// Bytes in all.
        total: u64,
    },
    /// A layer is being unpacked.
    Extracting {
        /// The layer blob.
        digest: String,
    },
    /// A layer is in the store.
    LayerDone {
        /// The layer blob.
        digest: String,
    },
    /// A layer was already in the store.
    AlreadyExists {
        /// The layer blob.
        digest: String,
    },
    /// The image is in the store.
    Done {
        /// Its id.
        id: String,
        /// The reference pulled.
        reference: String,
    },
}

/// What `remove` did, in docker's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// A tag was removed.
    Untagged(String),
    /// An image or layer was deleted.
    Deleted(String),
}

/// An image's runtime configuration (the parts containers use).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImageConfig {
    /// Environment, `NAME=value`.
    pub env: Vec<String>,
    /// Default command.
    pub cmd: Option<Vec<String>>,
    /// Entrypoint.
    pub entrypoint: Option<Vec<String>>,
    /// Working directory ("" for `/`).
    pub working_dir: String,
    /// User ("" for root).
    pub user: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// An image in the store.
#[derive(Debug, Clone, Serialize)]
pub struct Image {
    /// `sha256:<hex>` of the config blob.
    pub id: String,
    /// `NAME:TAG` as docker shows them.
    pub repo_tags: Vec<String>,
    /// `NAME@sha256:<manifest digest>`.
    pub repo_digests: Vec<String>,
    /// Creation time, seconds since the epoch (0 if the config has none).
    pub created: i64,
    /// Bytes of the unpacked layers.
    pub size: u64,
    /// CPU architecture.
    pub architecture: String,
    /// Operating system.
    pub os: String,
    /// Runtime configuration.
    pub config: ImageConfig,
    /// Unpacked layer directories, lowest first.
    pub layers: Vec<PathBuf>,
    /// Diff ids of the layers, lowest first.
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    repo_tags: Vec<String>,
    repo_digests: Vec<String>,
    diff_ids: Vec<String>,
    sizes: Vec<u64>,
    blobs: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Repositories {
    images: BTreeMap<String, Record>,
}

/// The image store of one target.
pub struct ImageStore {
    root: PathBuf,
    lock: Mutex<()>,
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
}

fn parse_time(s: &str) -> i64 {
    // "2024-05-01T12:34:56.789Z": enough of RFC 3339 for a creation date.
    let p = |a: usize, b: usize| s.get(a..b).and_then(|x| x.parse::<i64>().ok());
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(se)) = (p(0, 4), p(5, 7), p(8, 10), p(11, 13), p(14, 16), p(17, 19)) else { return 0 };
    let (y, mo) = if mo <= 2 { (y - 1, mo + 9) } else { (y, mo - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) * 86_400 + h * 3600 + mi * 60 + se
}

impl ImageStore {
    /// Opens (creating if missing) a store under `root`; leftovers of an interrupted pull
    /// or load are removed.
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        for d in [root.join("blobs/sha256"), root.join("layers")] {
            std::fs::create_dir_all(&d).map_err(|e| ImageError::Io { path: d.clone(), source: e })?;
        }
        let s = ImageStore { root: root.to_path_buf(), lock: Mutex::new(()) };
        for dir in [root.join("layers"), root.to_path_buf()] {
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(".tmp-") {
                        let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
                    }
                }
            }
        }
        Ok(s)
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(hex_of(digest))
    }

    fn layer_path(&self, diff_id: &str) -> PathBuf {
        self.root.join("layers").join(hex_of(diff_id))
    }

    fn tmp(&self, dir: &Path) -> PathBuf {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        dir.join(format!(".tmp-{}-{n}", std::process::id()))
    }

    fn read_repos(&self) -> Result<Repositories, ImageError> {
        let p = self.root.join("repositories.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ImageError::Malformed(format!("{}: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Repositories::default()),
            Err(e) => Err(ImageError::Io { path: p, source: e }),
        }
    }

    fn write_repos(&self, r: &Repositories) -> Result<(), ImageError> {
        let p = self.root.join("repositories.json");
        let tmp = self.tmp(&self.root);
        let ioe = |e: std::io::Error| ImageError::Io { path: p.clone(), source: e };
        let mut f = std::fs::File::create(&tmp).map_err(ioe)?;
        std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(r).unwrap_or_default()).map_err(ioe)?;
        f.sync_all().map_err(ioe)?;
        std::fs::rename(&tmp, &p).map_err(ioe)
    }

    fn image(&self, id: &str, rec: &Record) -> Result<Image, ImageError> {
        let cfg_path = self.blob_path(id);
        let bytes = std::fs::read(&cfg_path).map_err(|e| ImageError::Io { path: cfg_path.clone(), source: e })?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| ImageError::Malformed(format!("config {id}: {e}")))?;
        let c = &v["config"];
        let config = ImageConfig {
            env: strings(&c["Env"]).unwrap_or_default(),
            cmd: strings(&c["Cmd"]),
            entrypoint: strings(&c["Entrypoint"]),
            working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
            user: c["User"].as_str().unwrap_or("").to_string(),
            labels: c["Labels"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect()).unwrap_or_default(),
        };
        Ok(Image {
            id: id.to_string(),
            repo_tags: rec.repo_tags.clone(),
            repo_digests: rec.repo_digests.clone(),
            created: v["created"].as_str().map_or(0, parse_time),
            size: rec.sizes.iter().sum(),
            architecture: v["architecture"].as_str().unwrap_or("").to_string(),
            os: v["os"].as_str().unwrap_or("").to_string(),
            config,
            layers: rec.diff_ids.iter().map(|d| self.layer_path(d)).collect(),
            diff_ids: rec.diff_ids.clone(),
        })
    }

    /// Every image.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let r = self.read_repos()?;
        r.images.iter().map(|(id, rec)| self.image(id, rec)).collect()
    }

    fn find(&self, repos: &Repositories, key: &str) -> Result<(String, Option<String>), ImageError> {
        if repos.images.contains_key(key) {
            return Ok((key.to_string(), None));
        }
        let hexkey = key.strip_prefix("sha256:").unwrap_or(key);
        if hexkey.len() >= 4 && hexkey.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hits: Vec<&String> = repos.images.keys().filter(|id| hex_of(id).starts_with(hexkey)).collect();
            match hits.len() {
                1 => return Ok((hits[0].clone(), None)),
                n if n > 1 => return Err(ImageError::Conflict(format!("{key} matches {n} images: give more of the id"))),
                _ => {}
            }
        }
        if let Ok(r) = Reference::parse(key) {
            let tag = r.familiar();
            if let Some((id, _)) = repos.images.iter().find(|(_, rec)| rec.repo_tags.contains(&tag) || rec.repo_digests.contains(&tag)) {
                return Ok((id.clone(), Some(tag)));
            }
        }
        Err(ImageError::NotFound(key.to_string()))
    }

    /// An image by tag, id, or unique id prefix (at least 4 hex digits).
    pub fn get(&self, name_or_id: &str) -> Result<Image, ImageError> {
        let repos = self.read_repos()?;
        let (id, _) = self.find(&repos, name_or_id)?;
        self.image(&id, &repos.images[&id])
    }

    /// Pulls `reference` from its registry.
    pub fn pull(&self, reference: &str, progress: &mut dyn FnMut(Progress)) -> Result<Image, ImageError> {
        let r = Reference::parse(reference)?;
        progress(Progress::Resolving { reference: r.familiar() });
        let mut reg = Registry::connect(&r)?;
        let want = r.digest.clone().or(r.tag.clone()).unwrap_or_else(|| "latest".into());
        let (mut body, mut ct, mut digest) = reg.manifest(&r, &want)?;
        let mut m: Value = serde_json::from_slice(&body).map_err(|e| ImageError::Malformed(format!("manifest of {}: {e}", r.familiar())))?;
        if ct.contains("index") || ct.contains("list") || m.get("manifests").is_some() {
            let list = m["manifests"].as_array().ok_or_else(|| ImageError::Malformed(format!("index of {} has no manifests", r.familiar())))?;
            let pick = list.iter().find(|x| x["platform"]["os"] == "linux" && x["platform"]["architecture"] == "amd64").or_else(|| list.iter().find(|x| x.get("platform").is_none()));
            let d = pick.and_then(|x| x["digest"].as_str()).ok_or_else(|| ImageError::NotFound(format!("{} for linux/amd64", r.familiar())))?.to_string();
            (body, ct, digest) = reg.manifest(&r, &d)?;
            m = serde_json::from_slice(&body).map_err(|e| ImageError::Malformed(format!("manifest of {}: {e}", r.familiar())))?;
        }
        let _ = ct;
        let cfg_digest = m["config"]["digest"].as_str().ok_or_else(|| ImageError::Malformed(format!("manifest of {} has no config", r.familiar())))?.to_string();
        let cfg_size = m["config"]["size"].as_u64().unwrap_or(0);
        if cfg_size > MAX_JSON || !cfg_digest.starts_with("sha256:") || hex_of(&cfg_digest).len() != 64 {
            return Err(ImageError::Malformed(format!("the config of {} is not a sha256 blob of at most {MAX_JSON} bytes", r.familiar())));
        }
        let layers: Vec<(String, u64)> = m["layers"].as_array().ok_or_else(|| ImageError::Malformed(format!("manifest of {} has no layers", r.familiar())))?
            .iter().map(|l| Ok((l["digest"].as_str().filter(|d| d.starts_with("sha256:") && hex_of(d).len() == 64 && hex_of(d).bytes().all(|b| b.is_ascii_hexdigit())).ok_or_else(|| ImageError::Malformed("a layer without a sha256 digest".into()))?.to_string(), l["size"].as_u64().unwrap_or(0))))
            .collect::<Result<_, ImageError>>()?;

        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut new_files: Vec<PathBuf> = Vec::new();
        let result = (|| {
            let cfg_path = self.blob_path(&cfg_digest);
            if !cfg_path.exists() {
                let tmp = self.tmp(&self.root);
                reg.blob(&r, &cfg_digest, cfg_size, &tmp, &mut |_| {})?;
                std::fs::rename(&tmp, &cfg_path).map_err(|e| ImageError::Io { path: cfg_path.clone(), source: e })?;
                new_files.push(cfg_path.clone());
            }
            let cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).map_err(|e| ImageError::Io { path: cfg_path.clone(), source: e })?)
                .map_err(|e| ImageError::Malformed(format!("config of {}: {e}", r.familiar())))?;
            let diff_ids = strings(&cfg["rootfs"]["diff_ids"]).unwrap_or_default();
            if diff_ids.len() != layers.len() {
                return Err(ImageError::Malformed(format!("{}: {} layers but {} diff ids", r.familiar(), layers.len(), diff_ids.len())));
            }
            let mut sizes = Vec::new();
            for ((blob, size), diff) in layers.iter().zip(&diff_ids) {
                let dest = self.layer_path(diff);
                if dest.exists() {
                    progress(Progress::AlreadyExists { digest: blob.clone() });
                    sizes.push(dir_size(&dest));
                    continue;
                }
                let bpath = self.blob_path(blob);
                if !bpath.exists() {
                    let tmp = self.tmp(&self.root);
                    reg.blob(&r, blob, *size, &tmp, progress)?;
                    std::fs::rename(&tmp, &bpath).map_err(|e| ImageError::Io { path: bpath.clone(), source: e })?;
                    new_files.push(bpath.clone());
                }
                progress(Progress::Extracting { digest: blob.clone() });
                sizes.push(self.add_layer(&bpath, diff, blob, &mut new_files)?);
                progress(Progress::LayerDone { digest: blob.clone() });
            }
            let mpath = self.blob_path(&digest);
            if !mpath.exists() {
                std::fs::write(&mpath, &body).map_err(|e| ImageError::Io { path: mpath.clone(), source: e })?;
                new_files.push(mpath);
            }
            let mut repos = self.read_repos()?;
            let tag = r.tag.as_ref().map(|_| r.familiar());
            if let Some(t) = &tag {
                repos.images.values_mut().for_each(|rec| rec.repo_tags.retain(|x| x != t));
            }
            let rec = repos.images.entry(cfg_digest.clone()).or_default();
            rec.repo_tags.extend(tag);
            let dig = format!("{}@{digest}", r.familiar_name());
            if !rec.repo_digests.contains(&dig) {
                rec.repo_digests.push(dig);
            }
            rec.diff_ids = diff_ids;
            rec.sizes = sizes;
            for b in std::iter::once(&cfg_digest).chain(layers.iter().map(|l| &l.0)).chain(std::iter::once(&digest)) {
                if !rec.blobs.contains(b) {
                    rec.blobs.push(b.clone());
                }
            }
            self.write_repos(&repos)?;
            Ok(())
        })();
        if let Err(e) = result {
            for f in new_files {
                let _ = std::fs::remove_dir_all(&f).or_else(|_| std::fs::remove_file(&f));
            }
            return Err(e);
        }
        progress(Progress::Done { id: cfg_digest.clone(), reference: r.familiar() });
        let repos = self.read_repos()?;
        self.image(&cfg_digest, &repos.images[&cfg_digest])
    }

    /// Unpacks a layer blob into place, checking its diff id; returns its size.
    fn add_layer(&self, blob: &Path, diff: &str, name: &str, new_files: &mut Vec<PathBuf>) -> Result<u64, ImageError> {
        let dest = self.layer_path(diff);
        let tmp = self.tmp(&self.root.join("layers"));
        let (actual, size) = unpack::unpack_layer(blob, &tmp, name)?;
        if actual != diff {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(ImageError::DigestMismatch { what: format!("layer {name}"), expected: diff.into(), actual });
        }
        std::fs::rename(&tmp, &dest).map_err(|e| ImageError::Io { path: dest.clone(), source: e })?;
        new_files.push(dest);
        Ok(size)
    }

    /// `docker load`: a `docker save` archive (manifest.json, configs, layer tars).
    /// Returns the tags loaded (ids for untagged images).
    pub fn load(&self, tar: &mut dyn Read, progress: &mut dyn FnMut(Progress)) -> Result<Vec<String>, ImageError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let spool = self.tmp(&self.root);
        std::fs::create_dir(&spool).map_err(|e| ImageError::Io { path: spool.clone(), source: e })?;
        let mut new_files = Vec::new();
        let r = self.load_inner(tar, &spool, &mut new_files, progress);
        let _ = std::fs::remove_dir_all(&spool);
        if r.is_err() {
            for f in new_files {
                let _ = std::fs::remove_dir_all(&f).or_else(|_| std::fs::remove_file(&f));
            }
        }
        r
    }

    fn load_inner(&self, tar: &mut dyn Read, spool: &Path, new_files: &mut Vec<PathBuf>, progress: &mut dyn FnMut(Progress)) -> Result<Vec<String>, ImageError> {
        let bad = |e: &dyn std::fmt::Display| ImageError::Malformed(format!("not a docker save archive: {e}"));
        // Entries are spooled under names of our own (the hash of their path), so no name
        // in the archive ever becomes a path here.
        let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut ar = tar::Archive::new(tar);
        for e in ar.entries().map_err(|e| bad(&e))? {
            let mut e = e.map_err(|e| bad(&e))?;
            if e.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let name = e.path().map_err(|e| bad(&e))?.to_string_lossy().trim_start_matches("./").to_string();
            let p = spool.join(hex::encode(&Sha256::digest(name.as_bytes())[..16]));
            let mut out = std::fs::File::create(&p).map_err(|e| ImageError::Io { path: p.clone(), source: e })?;
            std::io::copy(&mut e, &mut out).map_err(|e| ImageError::Io { path: p.clone(), source: e })?;
            files.insert(name, p);
        }
        let read_small = |name: &str| -> Result<Vec<u8>, ImageError> {
            let p = files.get(name).ok_or_else(|| ImageError::Malformed(format!("the archive has no {name}")))?;
            let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            if len > MAX_JSON {
                return Err(ImageError::Malformed(format!("{name} is larger than {MAX_JSON} bytes")));
            }
            std::fs::read(p).map_err(|e| ImageError::Io { path: p.clone(), source: e })
        };
        let manifest: Value = serde_json::from_slice(&read_small("manifest.json")?).map_err(|e| ImageError::Malformed(format!("manifest.json: {e}")))?;
        let entries = manifest.as_array().ok_or_else(|| ImageError::Malformed("manifest.json is not a list".into()))?;
        let mut repos = self.read_repos()?;
        let mut loaded = Vec::new();
        for ent in entries {
            let cfg_name = ent["Config"].as_str().ok_or_else(|| ImageError::Malformed("an entry of manifest.json has no Config".into()))?;
            let cfg_bytes = read_small(cfg_name)?;
            let id = sha256(&cfg_bytes);
            let cfg: Value = serde_json::from_slice(&cfg_bytes).map_err(|e| ImageError::Malformed(format!("{cfg_name}: {e}")))?;
            let diff_ids = strings(&cfg["rootfs"]["diff_ids"]).unwrap_or_default();
            let layer_names = strings(&ent["Layers"]).unwrap_or_default();
            if diff_ids.len() != layer_names.len() {
                return Err(ImageError::Malformed(format!("{cfg_name}: {} layers but {} diff ids", layer_names.len(), diff_ids.len())));
            }
            if diff_ids.iter().any(|d| !d.starts_with("sha256:") || hex_of(d).len() != 64 || !hex_of(d).bytes().all(|b| b.is_ascii_hexdigit())) {
                return Err(ImageError::Malformed(format!("{cfg_name}: a diff id is not sha256:<64 hex digits>")));
            }
            let mut sizes = Vec::new();
            for (lname, diff) in layer_names.iter().zip(&diff_ids) {
                let dest = self.layer_path(diff);
                if dest.exists() {
                    progress(Progress::AlreadyExists { digest: diff.clone() });
                    sizes.push(dir_size(&dest));
                    continue;
                }
                let src = files.get(lname).ok_or_else(|| ImageError::Malformed(format!("the archive has no layer {lname}")))?;
                progress(Progress::Extracting { digest: diff.clone() });
                sizes.push(self.add_layer(src, diff, lname, new_files)?);
            }
            let cfg_path = self.blob_path(&id);
            if !cfg_path.exists() {
                std::fs::write(&cfg_path, &cfg_bytes).map_err(|e| ImageError::Io { path: cfg_path.clone(), source: e })?;
                new_files.push(cfg_path);
            }
            let tags: Vec<String> = strings(&ent["RepoTags"]).unwrap_or_default().iter().map(|t| Reference::parse(t).map(|r| r.familiar())).collect::<Result<_, _>>()?;
            for t in &tags {
                repos.images.values_mut().for_each(|rec| rec.repo_tags.retain(|x| x != t));
            }
            let rec = repos.images.entry(id.clone()).or_default();
            rec.diff_ids = diff_ids;
            rec.sizes = sizes;
            if !rec.blobs.contains(&id) {
                rec.blobs.push(id.clone());
            }
            for t in &tags {
                if !rec.repo_tags.contains(t) {
                    rec.repo_tags.push(t.clone());
                }
            }
            if tags.is_empty() {
                loaded.push(id);
            } else {
                loaded.extend(tags);
            }
        }
        self.write_repos(&repos)?;
        Ok(loaded)
    }

    /// `docker rmi`.
    pub fn remove(&self, name_or_id: &str, force: bool, in_use: &dyn Fn(&str) -> bool) -> Result<Vec<Removed>, ImageError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut repos = self.read_repos()?;
        let (id, tag) = self.find(&repos, name_or_id)?;
        let mut done = Vec::new();
        let rec = repos.images.get_mut(&id).expect("found above");
        match &tag {
            Some(t) if rec.repo_tags.len() > 1 || (!rec.repo_tags.contains(t)) => {
                rec.repo_tags.retain(|x| x != t);
                rec.repo_digests.retain(|x| !x.starts_with(&format!("{}@", t.rsplit_once(':').map_or(t.as_str(), |(n, _)| n))));
                done.push(Removed::Untagged(t.clone()));
                self.write_repos(&repos)?;
                return Ok(done);
            }
            None if rec.repo_tags.len() > 1 && !force => {
                return Err(ImageError::Conflict(format!(
                    "conflict: unable to delete {} (must be forced) - image is referenced in multiple repositories", &hex_of(&id)[..12])));
            }
            _ => {}
        }
        if in_use(&id) && !force {
            return Err(ImageError::InUse { image: name_or_id.to_string() });
        }
        let rec = repos.images.remove(&id).expect("found above");
        done.extend(rec.repo_tags.iter().cloned().map(Removed::Untagged));
        done.extend(rec.repo_digests.iter().cloned().map(Removed::Untagged));
        done.push(Removed::Deleted(id.clone()));
        self.write_repos(&repos)?;
        let still: std::collections::BTreeSet<&String> = repos.images.values().flat_map(|r| r.diff_ids.iter().chain(r.blobs.iter())).collect();
        for d in &rec.diff_ids {
            if !still.contains(d) {
                let _ = std::fs::remove_dir_all(self.layer_path(d));
                done.push(Removed::Deleted(d.clone()));
            }
        }
        for b in &rec.blobs {
            if !still.contains(b) {
                let _ = std::fs::remove_file(self.blob_path(b));
            }
        }
        Ok(done)
    }
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if let Ok(m) = e.metadata() {
                    if m.is_dir() {
                        stack.push(e.path());
                    } else {
                        total += m.len();
                    }
                }
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    #[test]
    fn creation_times_parse() {
        assert_eq!(super::parse_time("1970-01-01T00:00:00Z"), 0);
        assert_eq!(super::parse_time("2023-11-14T22:13:20.123456789Z"), 1_700_000_000);
        assert_eq!(super::parse_time("junk"), 0);
    }
}
