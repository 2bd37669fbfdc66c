// SPDX-License-Identifier: Apache-2.0
//! The image store, kept in the target's private namespace (DockerSSD keeps `/images/` there).
//!
//! ```text
//! ROOT/blobs/sha256/<hex>      manifests, configs and layer blobs, as the registry sent them
//! ROOT/layers/<diff id hex>/   each layer unpacked once, ready as an overlayfs lowerdir
//! ROOT/repositories.json       image id (the config's digest) → tags, digests, layers
//! ROOT/.lock                   held (flock) by the one writer
//! ```
//!
//! [`ImageStore::pull`] fetches from a registry, [`ImageStore::load`] reads a `docker save`
//! archive; both verify every digest, unpack each layer once (keyed by its diff id) into a
//! temporary directory renamed into place, and replace `repositories.json` atomically last,
//! so a failed or hostile pull or load leaves the store exactly as it was. Readers
//! ([`ImageStore::list`], [`ImageStore::get`]) take no lock: they see the last committed
//! `repositories.json`.

mod derive;
mod load;
pub(crate) mod manifest;
mod pull;
mod push;
mod reference;
mod registries;
mod registry;
mod save;
mod search;
mod tags;
#[cfg(test)]
mod tests;
mod unpack;

pub use manifest::MAX_JSON;
pub use push::PushProgress;
pub use reference::Reference;
pub use registries::RegistryConfig;
pub use registry::Credentials;
pub use search::SearchHit;
pub use tags::layer_size;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

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
    /// The registry wants credentials, or refused the ones given.
    #[error("access denied for {0}: the repository does not exist or requires credentials (docker login, or X-Registry-Auth)")]
    Unauthorized(String),
    /// Content does not match its digest.
    #[error("{what}: digest mismatch (expected {expected}, got {actual}); nothing was stored")]
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
    #[error("conflict: unable to delete {image} (must be forced) - the image is being used by a container; remove the container first")]
    InUse {
        /// The image.
        image: String,
    },
    /// The request is ambiguous or conflicts (several tags, need force).
    #[error("{0}")]
    Conflict(String),
    /// A file of the store could not be used.
    #[error("image store: {path}: {source}")]
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

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io { path: path.to_path_buf(), source }
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
    /// A tag or digest reference was removed.
    Untagged(String),
    /// An image or layer was deleted.
    Deleted(String),
}

/// An image's runtime configuration (the parts containers use).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
    /// Exposed ports, `PORT/PROTO` (`80/tcp`).
    pub exposed_ports: Vec<String>,
    /// Volume mount points the image declares.
    pub volumes: Vec<String>,
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
    /// The image it was made from here (`docker commit`: the container's image), as
    /// moby records it; empty for pulled, loaded, imported and built images.
    pub parent: String,
}

/// One image in `repositories.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    repo_tags: Vec<String>,
    repo_digests: Vec<String>,
    diff_ids: Vec<String>,
    sizes: Vec<u64>,
    /// Every blob the image holds: config, layers, manifests.
    blobs: Vec<String>,
    /// The image this one was committed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Repositories {
    images: BTreeMap<String, Record>,
}

/// What an image being added brings, committed in one step.
struct NewImage {
    id: String,
    tags: Vec<String>,
    digest_ref: Option<String>,
    diff_ids: Vec<String>,
    sizes: Vec<u64>,
    blobs: Vec<String>,
    /// The image it was committed from.
    parent: Option<String>,
}

/// Files and layer directories a pull or load put in place; removed again if it fails
/// before `repositories.json` names them.
#[derive(Default)]
struct Staged(Vec<PathBuf>);

impl Staged {
    fn rollback(self) {
        for f in self.0.into_iter().rev() {
            let _ = std::fs::remove_dir_all(&f).or_else(|_| std::fs::remove_file(&f));
        }
    }
}

/// The writer's hold on the store: the in-process mutex and an `flock` on `ROOT/.lock`
/// (so two daemons on one namespace cannot interleave either).
struct WriteLock<'a> {
    _guard: MutexGuard<'a, ()>,
    _file: std::fs::File,
}

/// The image store of one target.
pub struct ImageStore {
    root: PathBuf,
    lock: Mutex<()>,
    registries: RegistryConfig,
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// The repository part of `NAME:TAG` or `NAME@DIGEST`.
fn ref_name(r: &str) -> &str {
    if let Some((n, _)) = r.split_once('@') {
        return n;
    }
    match r.rfind(':') {
        Some(i) if !r[i..].contains('/') => &r[..i],
        _ => r,
    }
}

fn fsync_dir(dir: &Path) -> Result<(), ImageError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

impl ImageStore {
    /// Opens (creating if missing) a store under `root` (a directory in the target's
    /// private namespace); leftovers of an interrupted pull or load are removed.
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        for d in [root.join("blobs/sha256"), root.join("layers")] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        let s = ImageStore { root: root.to_path_buf(), lock: Mutex::new(()), registries: RegistryConfig::default() };
        let _w = s.write_lock()?;
        for dir in [root.join("layers"), root.to_path_buf(), root.join("blobs/sha256")] {
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(".tmp-") {
                        let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
                    }
                }
            }
        }
        drop(_w);
        Ok(s)
    }

    /// The store with these registry settings (insecure registries, mirrors) for pulls
    /// and pushes; by default only loopback registries are insecure and there are no
    /// mirrors.
    pub fn with_registries(mut self, registries: RegistryConfig) -> ImageStore {
        self.registries = registries;
        self
    }

    /// The registry settings.
    pub fn registries(&self) -> &RegistryConfig {
        &self.registries
    }

    fn write_lock(&self) -> Result<WriteLock<'_>, ImageError> {
        use std::os::fd::AsRawFd;
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.root.join(".lock");
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(io_err(&p))?;
        // SAFETY: the descriptor is open for the duration of the call; flock has no other
        // memory effects.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(ImageError::Io { path: p, source: std::io::Error::last_os_error() });
        }
        Ok(WriteLock { _guard: guard, _file: file })
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(hex_of(digest))
    }

    fn layer_path(&self, diff_id: &str) -> PathBuf {
        self.root.join("layers").join(hex_of(diff_id))
    }

    /// A fresh temporary name in `dir` (removed by `open` if left behind).
    fn tmp(&self, dir: &Path) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        dir.join(format!(".tmp-{}-{n}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)))
    }

    /// Writes `bytes` to `path` atomically: a temporary file, fsync, rename, fsync the directory.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
        let dir = path.parent().unwrap_or(&self.root);
        let tmp = self.tmp(dir);
        let r = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(ImageError::Io { path: path.to_path_buf(), source: e });
        }
        fsync_dir(dir)
    }

    /// Stores a small blob (manifest, config) unless it is there.
    fn put_blob(&self, digest: &str, bytes: &[u8], staged: &mut Staged) -> Result<(), ImageError> {
        let p = self.blob_path(digest);
        if !p.exists() {
            self.write_atomic(&p, bytes)?;
            staged.0.push(p);
        }
        Ok(())
    }

    fn read_repos(&self) -> Result<Repositories, ImageError> {
        let p = self.root.join("repositories.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                ImageError::Malformed(format!("{}: {e}; the image index is damaged (restore it, or remove it and pull the images again)", p.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Repositories::default()),
            Err(e) => Err(ImageError::Io { path: p, source: e }),
        }
    }

    fn write_repos(&self, r: &Repositories) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec_pretty(r).map_err(|e| ImageError::Malformed(format!("repositories.json: {e}")))?;
        self.write_atomic(&self.root.join("repositories.json"), &bytes)
    }

    /// Unpacks a layer blob into `layers/<diff id>` through a temporary directory,
    /// checking its diff id; returns its size.
    fn add_layer(&self, blob: &Path, diff: &str, name: &str, staged: &mut Staged) -> Result<u64, ImageError> {
        let dest = self.layer_path(diff);
        let tmp = self.tmp(&self.root.join("layers"));
        let (actual, size) = unpack::unpack_layer(blob, &tmp, name)?;
        if actual != diff {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(ImageError::DigestMismatch {
                what: format!("layer {name} (uncompressed, against the config's diff id)"),
                expected: diff.into(),
                actual,
            });
        }
        if let Err(e) = std::fs::rename(&tmp, &dest) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(ImageError::Io { path: dest, source: e });
        }
        staged.0.push(dest);
        fsync_dir(&self.root.join("layers"))?;
        Ok(size)
    }

    /// Records images (their tags move to them from any other image), then writes
    /// `repositories.json`: the commit point of a pull or load.
    fn commit(&self, new: Vec<NewImage>) -> Result<(), ImageError> {
        let mut repos = self.read_repos()?;
        for n in new {
            for t in &n.tags {
                repos.images.values_mut().for_each(|rec| rec.repo_tags.retain(|x| x != t));
            }
            let rec = repos.images.entry(n.id).or_default();
            for t in n.tags {
                if !rec.repo_tags.contains(&t) {
                    rec.repo_tags.push(t);
                }
            }
            if let Some(d) = n.digest_ref {
                if !rec.repo_digests.contains(&d) {
                    rec.repo_digests.push(d);
                }
            }
            rec.diff_ids = n.diff_ids;
            rec.sizes = n.sizes;
            if n.parent.is_some() {
                rec.parent = n.parent;
            }
            for b in n.blobs {
                if !rec.blobs.contains(&b) {
                    rec.blobs.push(b);
                }
            }
        }
        self.write_repos(&repos)
    }

    fn image(&self, id: &str, rec: &Record) -> Result<Image, ImageError> {
        let cfg_path = self.blob_path(id);
        let bytes = match std::fs::read(&cfg_path) {
            Ok(b) => b,
            // Removed between reading the index and now.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ImageError::NotFound(id.to_string())),
            Err(e) => return Err(ImageError::Io { path: cfg_path, source: e }),
        };
        let c = manifest::parse_config(&bytes, &format!("config of image {id}"))?;
        Ok(Image {
            id: id.to_string(),
            repo_tags: rec.repo_tags.clone(),
            repo_digests: rec.repo_digests.clone(),
            created: c.created,
            size: rec.sizes.iter().sum(),
            architecture: c.architecture,
            os: c.os,
            config: c.config,
            layers: rec.diff_ids.iter().map(|d| self.layer_path(d)).collect(),
            diff_ids: rec.diff_ids.clone(),
            parent: rec.parent.clone().unwrap_or_default(),
        })
    }

    /// Every image, ordered by id.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let r = self.read_repos()?;
        r.images
            .iter()
            .filter_map(|(id, rec)| match self.image(id, rec) {
                Err(ImageError::NotFound(_)) => None,
                x => Some(x),
            })
            .collect()
    }

    /// Finds an image: its id and, when `key` named it by tag or digest, that reference.
    fn find(&self, repos: &Repositories, key: &str) -> Result<(String, Option<String>), ImageError> {
        if repos.images.contains_key(key) {
            return Ok((key.to_string(), None));
        }
        if let Ok(r) = Reference::parse(key) {
            let name = r.familiar();
            if let Some((id, _)) = repos.images.iter().find(|(_, rec)| rec.repo_tags.contains(&name) || rec.repo_digests.contains(&name)) {
                return Ok((id.clone(), Some(name)));
            }
        }
        let hexkey = key.strip_prefix("sha256:").unwrap_or(key);
        if hexkey.len() >= 4 && hexkey.len() <= 64 && hexkey.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hexkey = hexkey.to_ascii_lowercase();
            let hits: Vec<&String> = repos.images.keys().filter(|id| hex_of(id).starts_with(&hexkey)).collect();
            match hits.len() {
                1 => return Ok((hits[0].clone(), None)),
                0 => {}
                n => return Err(ImageError::Conflict(format!("{key} is the start of {n} image ids: give more of the id"))),
            }
        }
        Err(ImageError::NotFound(key.to_string()))
    }

    /// An image by tag (`busybox`, `busybox:latest`, `127.0.0.1:5000/x:tag`, normalised as
    /// [`ImageStore::pull`] does), digest reference (`NAME@sha256:...`), full id
    /// (`sha256:<hex>`), or a unique id prefix of at least 4 hex digits (with or without
    /// `sha256:`).
    pub fn get(&self, name_or_id: &str) -> Result<Image, ImageError> {
        let repos = self.read_repos()?;
        let (id, _) = self.find(&repos, name_or_id)?;
        self.image(&id, &repos.images[&id])
    }

    /// `docker rmi`, as dockerd does it.
    ///
    /// By tag or digest reference: removes that reference (and, with the last tag of a
    /// repository, its digest references); the image is deleted when no reference is left
    /// and no container uses it (`in_use(id)`; an image in use is left dangling). By id:
    /// refuses when the image is tagged in several repositories or in use, unless `force`,
    /// else removes its references and deletes it. Deleting removes the blobs and unpacked
    /// layers no other image holds. Returns what happened, in docker's order.
    pub fn remove(&self, name_or_id: &str, force: bool, in_use: &dyn Fn(&str) -> bool) -> Result<Vec<Removed>, ImageError> {
        let _w = self.write_lock()?;
        let mut repos = self.read_repos()?;
        let (id, named) = self.find(&repos, name_or_id)?;
        let short = &hex_of(&id)[..12];
        let mut done = Vec::new();
        let has_children = repos.images.values().any(|r| r.parent.as_deref() == Some(id.as_str()));
        let rec = repos.images.get_mut(&id).expect("found above");
        if let Some(r) = named {
            rec.repo_tags.retain(|x| *x != r);
            rec.repo_digests.retain(|x| *x != r);
            done.push(Removed::Untagged(r.clone()));
            let name = ref_name(&r);
            if !r.contains('@') && !rec.repo_tags.iter().any(|t| ref_name(t) == name) {
                let (gone, kept): (Vec<String>, Vec<String>) = rec.repo_digests.drain(..).partition(|d| ref_name(d) == name);
                rec.repo_digests = kept;
                done.extend(gone.into_iter().map(Removed::Untagged));
            }
            // As moby: an image others were committed from stays, untagged, while they do.
            if !rec.repo_tags.is_empty() || !rec.repo_digests.is_empty() || (in_use(&id) && !force) || has_children {
                self.write_repos(&repos)?;
                return Ok(done);
            }
        } else {
            let names: BTreeSet<&str> = rec.repo_tags.iter().chain(&rec.repo_digests).map(|t| ref_name(t)).collect();
            if (names.len() > 1 || rec.repo_tags.len() > 1) && !force {
                return Err(ImageError::Conflict(format!(
                    "conflict: unable to delete {short} (must be forced) - image is referenced in multiple repositories ({}); remove the tags one by one or force",
                    rec.repo_tags.join(", "))));
            }
            if in_use(&id) && !force {
                return Err(ImageError::InUse { image: short.to_string() });
            }
            if has_children {
                return Err(ImageError::Conflict(format!(
                    "conflict: unable to delete {short} (cannot be forced) - image has dependent child images (remove the images committed from it first)"
                )));
            }
            done.extend(rec.repo_tags.drain(..).map(Removed::Untagged));
            done.extend(rec.repo_digests.drain(..).map(Removed::Untagged));
        }
        let rec = repos.images.remove(&id).expect("found above");
        done.push(Removed::Deleted(id.clone()));
        self.write_repos(&repos)?;
        let still: BTreeSet<&String> = repos.images.values().flat_map(|r| r.diff_ids.iter().chain(r.blobs.iter())).collect();
        for d in &rec.diff_ids {
            if !still.contains(d) && self.layer_path(d).exists() {
                // Renamed away first, so a half-removed layer is never seen under its name.
                let tmp = self.tmp(&self.root.join("layers"));
                match std::fs::rename(self.layer_path(d), &tmp) {
                    Ok(()) => {
                        let _ = std::fs::remove_dir_all(&tmp);
                    }
                    Err(_) => {
                        let _ = std::fs::remove_dir_all(self.layer_path(d));
                    }
                }
                done.push(Removed::Deleted(d.clone()));
            }
        }
        for b in rec.blobs.iter().chain(std::iter::once(&id)) {
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
