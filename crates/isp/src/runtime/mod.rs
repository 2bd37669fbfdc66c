// SPDX-License-Identifier: Apache-2.0
//! Containers on the target: runc bundles over an overlayfs of an image's layers, kept in
//! the private namespace with their logs and exit codes.
//!
//! A container's life is an explicit state machine ([`RunState`]):
//!
//! ```text
//!  create ──► Created ──start──► Running ──(process exits)──► Exited ──start/restart──► Running
//!                │                  │                            │
//!                └──────── rm ──────┴── rm --force ──────────────┴──► removed
//! ```
//!
//! Each run's output goes to the container's log and to every attached client; `wait`
//! watches a counter of exits and a removed flag, so `next-exit`, `not-running` and
//! `removed` are all answered from one channel.
//!
//! The [`Runtime`] drives that life (create, start, stop, kill, rm) and finds containers;
//! a [`Container`] (`container.rs`) records its state, its log and its exits; one run is
//! `process.rs`, what it binds `binds.rs`.

pub mod archive;
mod binds;
mod bridge;
pub mod cgroup;
pub mod changes;
pub mod commit;
mod console;
mod container;
pub mod devices;
pub(crate) mod dns;
pub mod events;
mod exec;
mod extents;
mod files;
pub mod health;
pub mod links;
pub mod log;
mod manage;
pub mod networks;
pub mod options;
mod ports;
mod process;
pub mod spec;
pub mod update;
mod view;
pub mod volumes;

pub use container::{Container, CreateSpec, ExitEvent, RunState};
pub use exec::{Exec, ExecIo, ExecSpec, ExecState};
pub use extents::Unfit;
pub use ports::{exposed_ports, parse_host_ip, parse_host_port, parse_port_key, port_bindings, NetworkMode, PortBinding, PortKey, Proto, Published};
pub use process::{frame, STDERR, STDOUT};
pub use view::{SharableView, ViewPin};

use container::{HeldFile, Meta};
use extents::ExtentMap;
use files::WritableFiles;

/// Whether `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    view::is_mount_point(path)
}

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::image::{Image, ImageStore};

/// Errors of the runtime, each with the HTTP status the Docker API answers with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No container has this id, id prefix or name.
    #[error("No such container: {0}")]
    NotFound(String),
    /// The request contradicts the container's state or another container (name taken, running).
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed or asks for something not offered.
    #[error("{0}")]
    BadRequest(String),
    /// Something other than a container (a network, ...) is not there; the message names it.
    #[error("{0}")]
    Missing(String),
    /// The request is understood but not allowed in the current state (a network in use).
    #[error("{0}")]
    Forbidden(String),
    /// Setting up or driving the container failed on the target.
    #[error("{0}")]
    Setup(String),
    /// A file of the runtime's state could not be used.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl RuntimeError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        RuntimeError::Io { path: path.to_path_buf(), source }
    }

    /// The HTTP status of this error in the Docker Engine API.
    pub fn http_status(&self) -> u16 {
        match self {
            RuntimeError::NotFound(_) | RuntimeError::Missing(_) => 404,
            RuntimeError::Forbidden(_) => 403,
            RuntimeError::Conflict(_) => 409,
            RuntimeError::BadRequest(_) => 400,
            _ => 500,
        }
    }
}

/// Write fences on the sharable namespace's blocks, kept by the target that serves the
/// namespace to hosts (`insitu_engine::Engine::lock`, the LOCK command's fences): while a
/// container writes a file of the namespace in place, host writes to that file's blocks
/// are refused, so neither side overwrites the other.
pub trait BlockFence: Send + Sync {
    /// Fences `extents`, (byte offset, byte length) on the namespace in multiples of 512,
    /// which hold `path` (relative to the file system's root, for messages). Returns an id
    /// for [`BlockFence::release`], or why the fence could not be taken.
    fn hold(&self, path: &str, extents: &[(u64, u64)]) -> Result<u64, String>;
    /// Releases fence `id`.
    fn release(&self, id: u64);
}

/// Where containers see the target's KV store (`insitu-kvfs`), when it has one.
pub const KV_MOUNT: &str = "/kv";

/// Limits applied to containers that ask for none (from the target's device model).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// CPUs (e.g. the device's offload cores); `None`: unlimited.
    pub cpus: Option<f64>,
    /// Memory in bytes; `None`: unlimited.
    pub memory: Option<i64>,
    /// Most processes per container.
    pub pids: i64,
    /// Bytes per second a container may read from `/data` (the device's internal read
    /// rate); `None`: unlimited.
    pub data_read_bps: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { cpus: None, memory: None, pids: 1024, data_read_bps: None }
    }
}

/// One `-v` binding, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bind {
    /// A directory or file of the target bound as it is.
    Path {
        /// On the target.
        src: String,
        /// In the container.
        dst: String,
        /// Read-only.
        ro: bool,
    },
    /// A file of the sharable namespace the host pre-allocated, written in place
    /// (`-v /FILE:/DST:rw`); resolved to an entry of [`WritableFiles`] when the
    /// container starts.
    File {
        /// Path relative to the namespace's root.
        rel: String,
        /// The source as the request gave it (for messages).
        src: String,
        /// In the container.
        dst: String,
    },
}

/// A `-v SRC:DST[:MODE]` string, parsed: where it comes from, where it goes, and whether
/// it was asked writable (`rw`), read-only (`ro`) or neither. Refuses what is not a
/// binding, a relative or climbing destination, a climbing source and unknown modes.
pub fn parse_bind(b: &str) -> Result<(BindSource, String, Option<bool>), String> {
    let parts: Vec<&str> = b.split(':').collect();
    let (src, dst, mode) = match parts.as_slice() {
        [s, d] => (*s, *d, ""),
        [s, d, m] => (*s, *d, *m),
        _ => return Err(format!("invalid volume specification {b:?}: use SRC:DST[:ro|rw]")),
    };
    if !dst.starts_with('/') || Path::new(dst).components().any(|c| c == Component::ParentDir) {
        return Err(format!("invalid volume destination {dst:?}: an absolute path without '..'"));
    }
    if mode.split(',').any(|m| !matches!(m, "" | "ro" | "rw" | "z" | "Z")) {
        return Err(format!("invalid mode {mode:?} in {b:?}: use ro or rw"));
    }
    let (ro, rw) = (mode.split(',').any(|m| m == "ro"), mode.split(',').any(|m| m == "rw"));
    if ro && rw {
        return Err(format!("invalid mode {mode:?} in {b:?}: ro or rw, not both"));
    }
    let access = if rw {
        Some(true)
    } else if ro {
        Some(false)
    } else {
        None
    };
    let source = if src.starts_with('/') {
        if Path::new(src).components().any(|c| c == Component::ParentDir) {
            return Err(format!("invalid volume source {src:?}: '..' is not allowed"));
        }
        BindSource::Sharable(src.trim_start_matches('/').to_string())
    } else {
        if src.is_empty() || !src.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err(format!("invalid volume name {src:?}: [a-zA-Z0-9][a-zA-Z0-9_.-]"));
        }
        BindSource::Volume(src.to_string())
    };
    Ok((source, dst.to_string(), access))
}

/// Where a `-v` binding comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindSource {
    /// A path of the sharable namespace, relative to its root (`""`: the root).
    Sharable(String),
    /// A named volume in the private namespace.
    Volume(String),
}

/// All containers of a target.
pub struct Runtime {
    root: PathBuf,
    runc_root: PathBuf,
    images: Arc<ImageStore>,
    view: Option<Arc<SharableView>>,
    /// The KV store's directory on the target, every container's `/kv`.
    kv_dir: Option<PathBuf>,
    limits: Limits,
    containers: Mutex<BTreeMap<String, Arc<Container>>>,
    /// What happens, for `docker events`.
    events: events::Events,
    /// Execs by id (those of removed containers are dropped as new ones come).
    execs: Mutex<BTreeMap<String, Arc<Exec>>>,
    /// The FUSE mount of writable files, made when a container first needs one.
    files: Mutex<Option<Arc<WritableFiles>>>,
    /// The fences that keep host writes off files containers write.
    fence: Mutex<Option<Arc<dyn BlockFence>>>,
    /// Where ports are published when a binding names no address.
    publish_ip: Mutex<std::net::IpAddr>,
    /// User-defined networks.
    networks: networks::Networks,
    /// The legacy links wired for the current runs.
    wires: Mutex<Vec<links::Wire>>,
    /// The running DNS servers of user-defined networks, by network id.
    dns: Mutex<std::collections::BTreeMap<String, tokio::task::JoinHandle<()>>>,
    /// Containers' health, from their checks' probes.
    health: Mutex<BTreeMap<String, health::Health>>,
}

impl Runtime {
    /// A runtime keeping containers under `root` (in the private namespace), runc's state
    /// under `runc_root` (tmpfs: a restarted target has no running containers), images in
    /// `images`, `/data` from `view`, and `/kv` (read-write) from `kv_dir`. Containers left
    /// by an earlier run are listed as exited.
    pub fn open(
        root: &Path,
        runc_root: &Path,
        images: Arc<ImageStore>,
        view: Option<Arc<SharableView>>,
        kv_dir: Option<PathBuf>,
        limits: Limits,
    ) -> Result<Arc<Runtime>, RuntimeError> {
        for d in [root, runc_root] {
            std::fs::create_dir_all(d).map_err(|e| RuntimeError::io(d, e))?;
        }
        // Unique per target (its runc state directory is), short enough for link names.
        let prefix = {
            use sha2::Digest;
            format!("isn-{}", &hex::encode(sha2::Sha256::digest(runc_root.as_os_str().as_encoded_bytes()))[..10])
        };
        let networks = networks::Networks::open(&root.parent().unwrap_or(root).join("networks"), &prefix)?;
        let rt = Runtime {
            networks,
            dns: Mutex::new(BTreeMap::new()),
            wires: Mutex::new(Vec::new()),
            health: Mutex::new(BTreeMap::new()),
            root: root.into(),
            runc_root: runc_root.into(),
            images,
            view,
            kv_dir,
            limits,
            containers: Mutex::new(BTreeMap::new()),
            events: events::Events::default(),
            execs: Mutex::new(BTreeMap::new()),
            files: Mutex::new(None),
            fence: Mutex::new(None),
            publish_ip: Mutex::new(std::net::Ipv4Addr::LOCALHOST.into()),
        };
        let mut found = BTreeMap::new();
        for e in std::fs::read_dir(root).map_err(|e| RuntimeError::io(root, e))?.flatten() {
            let Ok(text) = std::fs::read(e.path().join("meta.json")) else { continue };
            let Ok(m) = serde_json::from_slice::<Meta>(&text) else { continue };
            let _ = process::unmount(&e.path().join("rootfs"));
            let code = std::fs::read_to_string(e.path().join("exit-code")).ok().and_then(|t| t.trim().parse().ok());
            let layers = rt.images.get(&m.image_id).map(|i| i.layers).unwrap_or_default();
            let c = Container::new(m, layers, e.path());
            if let Some(code) = code {
                c.set_state(RunState::Exited { code, started: None, finished: SystemTime::now() });
            }
            found.insert(c.id.clone(), c);
        }
        *rt.containers.lock().unwrap_or_else(|e| e.into_inner()) = found;
        Ok(Arc::new(rt))
    }

    /// The target's events.
    pub fn events(&self) -> &events::Events {
        &self.events
    }

    /// The image store.
    pub fn images(&self) -> &Arc<ImageStore> {
        &self.images
    }

    /// Where uploads wait before they are loaded (in the private namespace).
    pub fn spool_dir(&self) -> PathBuf {
        self.root.parent().unwrap_or(&self.root).join("spool")
    }

    /// The view of the sharable namespace, if any.
    pub fn view(&self) -> Option<&Arc<SharableView>> {
        self.view.as_ref()
    }

    /// Sets the address ports are published on when a binding (`-p HOSTPORT:PORT`) names
    /// none; 127.0.0.1 by default. An unspecified address (0.0.0.0, ::) is refused in
    /// favour of loopback: publishing on every address must be asked for by name.
    pub fn set_publish_ip(&self, ip: std::net::IpAddr) {
        let ip = if ip.is_unspecified() { std::net::Ipv4Addr::LOCALHOST.into() } else { ip };
        *self.publish_ip.lock().unwrap_or_else(|e| e.into_inner()) = ip;
    }

    /// Sets the fences taken on the blocks of every writable file a container holds
    /// (`-v /FILE:/DST:rw`), for as long as it runs. Without one such files are served
    /// all the same, and only the host's own lock (`insitu lock`) keeps its writers off.
    pub fn set_fence(&self, fence: Arc<dyn BlockFence>) {
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = Some(fence);
    }

    fn all(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Container>>> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every container, newest first.
    pub fn list(&self) -> Vec<Arc<Container>> {
        let mut v: Vec<_> = self.all().values().cloned().collect();
        v.sort_by(|a, b| b.created.cmp(&a.created).then(a.id.cmp(&b.id)));
        v
    }

    /// Whether a container uses the image `id` (`docker rmi` refuses then).
    pub fn image_in_use(&self, id: &str) -> bool {
        self.all().values().any(|c| c.image_id == id)
    }

    /// A container by full id, unique id prefix, or name (with or without `/`).
    pub fn get(&self, key: &str) -> Result<Arc<Container>, RuntimeError> {
        let all = self.all();
        let name = key.trim_start_matches('/');
        if let Some(c) = all.get(key).or_else(|| all.values().find(|c| c.name() == name)) {
            return Ok(c.clone());
        }
        let hits: Vec<_> =
            if !key.is_empty() && key.bytes().all(|b| b.is_ascii_hexdigit()) { all.values().filter(|c| c.id.starts_with(key)).collect() } else { Vec::new() };
        match hits.len() {
            1 => Ok(hits[0].clone()),
            0 => Err(RuntimeError::NotFound(key.to_string())),
            _ => Err(RuntimeError::BadRequest(format!("multiple containers match {key:?}: give more of the id"))),
        }
    }

    /// `docker create`: checks the image and the request, writes the container's record.
    pub fn create(&self, name: Option<&str>, spec: CreateSpec) -> Result<Arc<Container>, RuntimeError> {
        let image: Image = self.images.get(&spec.image).map_err(|e| {
            if e.http_status() == 404 {
                RuntimeError::NotFound(format!("image {}", spec.image))
            } else {
                RuntimeError::BadRequest(e.to_string())
            }
        })?;
        let id = random_id();
        let name = match name.map(|n| n.trim_start_matches('/')).filter(|n| !n.is_empty()) {
            Some(n) => valid_name(n)?,
            None => format!("insitu_{}", &id[..8]),
        };
        if self.all().values().any(|c| c.name() == name) {
            return Err(RuntimeError::Conflict(format!(
                "Conflict. The container name \"/{name}\" is already in use. Remove that container or choose another name."
            )));
        }
        // As Docker: an entrypoint given drops the image's command too.
        let (entrypoint, cmd) = match (&spec.entrypoint, &spec.cmd) {
            (Some(ep), cmd) => (Some(ep.clone()), cmd.clone()),
            (None, Some(cmd)) => (image.config.entrypoint.clone(), Some(cmd.clone())),
            (None, None) => (image.config.entrypoint.clone(), image.config.cmd.clone()),
        };
        let args: Vec<String> = entrypoint.iter().flatten().chain(cmd.iter().flatten()).cloned().collect();
        let mut spec = spec;
        if spec.options.user.is_none() && !image.config.user.is_empty() {
            spec.options.user = Some(image.config.user.clone());
        }
        if args.is_empty() {
            return Err(RuntimeError::BadRequest("no command specified: the image has no CMD or ENTRYPOINT; give one after the image name".into()));
        }
        let mut env: Vec<String> = image.config.env.clone();
        for e in &spec.env {
            let key = e.split('=').next().unwrap_or("");
            env.retain(|x| x.split('=').next() != Some(key));
            env.push(e.clone());
        }
        if !env.iter().any(|e| e.starts_with("PATH=")) {
            env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
        }
        let cwd = spec
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .or_else(|| Some(image.config.working_dir.clone()).filter(|w| !w.is_empty()))
            .unwrap_or_else(|| "/".into());
        if !cwd.starts_with('/') {
            return Err(RuntimeError::BadRequest(format!("the working directory {cwd:?} is invalid: it needs to be an absolute path")));
        }
        if !spec.ports.is_empty() && !matches!(spec.network, NetworkMode::Default | NetworkMode::User) {
            return Err(RuntimeError::BadRequest(format!(
                "conflicting options: port publishing (-p) and --network {}: {}",
                spec.network.name(),
                if spec.network == NetworkMode::Host {
                    "with the target's network the container's ports are the target's already"
                } else {
                    "a container without a network has no ports to publish"
                }
            )));
        }
        for from in spec.volumes_from.clone() {
            spec.binds.extend(self.binds_of(&from)?);
        }
        let files: Vec<_> = self
            .binds(&spec)?
            .into_iter()
            .filter_map(|b| match b {
                Bind::File { rel, src, dst } => Some((rel, src, dst)),
                Bind::Path { .. } => None,
            })
            .collect();
        if !files.is_empty() {
            if let Some(v) = &self.view {
                // The host may have made the file since the view was last refreshed.
                v.refresh()?;
            }
            for (rel, src, dst) in &files {
                self.probe(rel, src, dst)?;
            }
        }
        if spec.network == NetworkMode::User && spec.endpoints.keys().all(|n| networks::PREDEFINED.contains(&n.as_str())) {
            return Err(RuntimeError::BadRequest("a container on a user-defined network needs that network's endpoint settings".into()));
        }
        if spec.options.init && !std::path::Path::new(options::INIT_BINARY).is_file() {
            return Err(RuntimeError::BadRequest(format!(
                "HostConfig.Init: the target has no init binary ({} is missing: install Debian's tini, as `make deps` does)",
                options::INIT_BINARY
            )));
        }
        self.resolve_links(&mut spec)?;
        let joins = self.endpoint_networks(&spec)?;
        let dir = self.root.join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::io(&dir, e))?;
        let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
        let meta = Meta { id: id.clone(), name, image_id: image.id.clone(), created, spec, args, env, cwd, entrypoint, cmd };
        meta.write(&dir)?;
        let c = Container::new(meta, image.layers, dir);
        for (nid, cfg) in joins {
            if let Err(e) = self.networks.join(&id, &nid, cfg, false) {
                self.networks.forget(&id);
                let _ = std::fs::remove_dir_all(&c.dir);
                return Err(e);
            }
        }
        // As moby: a container's anonymous volumes are made with it, labelled anonymous.
        for v in &c.spec.anonymous_volumes {
            if let Err(e) = self.anonymous_volume(v) {
                self.networks.forget(&id);
                self.remove_anonymous_volumes(&c);
                let _ = std::fs::remove_dir_all(&c.dir);
                return Err(e);
            }
        }
        self.all().insert(id, c.clone());
        self.container_event(&c, "create", &[]);
        Ok(c)
    }

    /// The binds (volumes and paths) of the container `from` names (`CONTAINER[:ro|:rw]`),
    /// with the mode it asks for, for `VolumesFrom`.
    fn binds_of(&self, from: &str) -> Result<Vec<String>, RuntimeError> {
        let (name, mode) = match from.rsplit_once(':') {
            Some((n, m @ ("ro" | "rw"))) => (n, Some(m)),
            _ => (from, None),
        };
        let other = self.get(name).map_err(|_| RuntimeError::BadRequest(format!("HostConfig.VolumesFrom {from:?}: no such container: {name}")))?;
        let mut out = Vec::new();
        for b in &other.spec.binds {
            let (src, dst, ro) = parse_bind(b).map_err(RuntimeError::BadRequest)?;
            let src = match src {
                BindSource::Volume(v) => v,
                BindSource::Sharable(rel) => format!("/{rel}"),
            };
            let ro = mode.map_or(ro == Some(true), |m| m == "ro");
            out.push(format!("{src}:{dst}{}", if ro { ":ro" } else { "" }));
        }
        Ok(out)
    }

    /// `docker start`: starts a created or exited container (a running one is left alone).
    pub async fn start(self: &Arc<Self>, key: &str) -> Result<bool, RuntimeError> {
        let c = self.get(key)?;
        if matches!(c.state(), RunState::Running { .. }) {
            return Ok(false);
        }
        if c.layers.is_empty() && self.images.get(&c.image_id).is_err() {
            return Err(RuntimeError::Conflict(format!("the image of container {} was removed", c.name())));
        }
        c.lock().stopped_by_client = false;
        let started = self.run(&c).await;
        {
            // A restart in progress ends here, run or not.
            let mut g = c.lock();
            g.restarting = false;
            g.error = started.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
        }
        if started.is_err() {
            self.network_down(&c.id);
            c.lock().view_pin = None;
            c.unpublish();
            self.release_files(&c);
            // As dockerd: a `--rm` container that cannot start is removed, or the CLI,
            // which waits for its removal, would wait for ever.
            if c.spec.auto_remove {
                let _ = self.remove(&c.id, true).await;
            }
        }
        if started.is_ok() {
            self.container_event(&c, "start", &[]);
            self.watch_health(&c);
        }
        started.map(|_| true)
    }

    /// Refreshes the view, publishes the container's ports, then starts its process.
    async fn run(self: &Arc<Self>, c: &Arc<Container>) -> Result<(), RuntimeError> {
        if let Some(v) = &self.view {
            // The container starts on the host's latest data.
            c.lock().view_pin = v.refresh_for_start()?;
        }
        if !c.spec.ports.is_empty() {
            let ip = *self.publish_ip.lock().unwrap_or_else(|e| e.into_inner());
            let proxy = ports::publish(&c.spec.ports, ip, &self.runc_root, &c.id)?;
            c.lock().proxy = Some(proxy);
        }
        process::start(self, c).await
    }

    /// `docker stop`: the container's stop signal (SIGTERM unless created with another),
    /// then SIGKILL after `timeout` (the container's stop timeout, else 10 seconds, when
    /// `None`). False if it was not running.
    pub async fn stop(&self, key: &str, timeout: Option<Duration>, signal: Option<&str>) -> Result<bool, RuntimeError> {
        let c = self.get(key)?;
        if !matches!(c.state(), RunState::Running { .. }) {
            // A restart about to happen is called off.
            let mut g = c.lock();
            let was = std::mem::take(&mut g.restarting);
            g.stopped_by_client = true;
            return Ok(was);
        }
        c.lock().stopped_by_client = true;
        let timeout = timeout.unwrap_or_else(|| Duration::from_secs(c.spec.options.stop_timeout.map_or(10, |s| s.max(0) as u64)));
        let mut rx = c.exits();
        let before = rx.borrow().exits;
        // A frozen container would never see its signal.
        let _ = self.set_paused(&c, false).await;
        let sig = signal.map(str::to_string).or_else(|| c.spec.options.stop_signal.clone()).unwrap_or_else(|| "TERM".into());
        let _ = self.signal_running(&c, &sig).await;
        self.container_event(&c, "kill", &[("signal", sig.trim_start_matches("SIG").to_string())]);
        let ended = tokio::time::timeout(timeout, rx.wait_for(|e| e.exits > before)).await.is_ok();
        if !ended {
            let _ = self.signal_running(&c, "KILL").await;
            self.container_event(&c, "kill", &[("signal", "KILL".into())]);
            let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|e| e.exits > before)).await;
        }
        self.container_event(&c, "stop", &[]);
        Ok(true)
    }

    /// `docker restart`.
    pub async fn restart(self: &Arc<Self>, key: &str, timeout: Option<Duration>, signal: Option<&str>) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        self.stop(key, timeout, signal).await?;
        c.lock().restarts += 1;
        self.start(key).await.map(|_| ())
    }

    /// `docker kill`. With SIGKILL, which cannot be caught, it returns once the container
    /// has exited and its run is cleaned up, as Docker's does: `inspect` or `rm` right
    /// after sees it stopped. Other signals may be handled, so it returns once sent.
    pub async fn kill(&self, key: &str, signal: &str) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        if !matches!(c.state(), RunState::Running { .. }) {
            return Err(RuntimeError::Conflict(format!("Cannot kill container: {key}: container {} is not running", &c.id[..12])));
        }
        let mut rx = c.exits();
        let before = rx.borrow().exits;
        let kills = matches!(signal.trim_start_matches("SIG"), "KILL" | "9");
        if kills {
            c.lock().stopped_by_client = true;
            let _ = self.set_paused(&c, false).await;
        }
        self.signal_running(&c, signal).await?;
        self.container_event(&c, "kill", &[("signal", signal.trim_start_matches("SIG").to_string())]);
        if kills {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|e| e.exits > before || e.removed)).await;
        }
        Ok(())
    }

    /// Signals a running container. Its state turns Running when `runc run` is spawned,
    /// a moment before runc has made the container: a signal in that moment finds no
    /// container, so it is tried again while the container still counts as running.
    async fn signal_running(&self, c: &Container, signal: &str) -> Result<(), RuntimeError> {
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        loop {
            match process::signal(self, &c.id, signal).await {
                Err(_) if std::time::Instant::now() < deadline && matches!(c.state(), RunState::Running { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                r => return r,
            }
        }
    }

    /// `docker rm`: refuses a running container unless `force` (which kills it first).
    pub async fn remove(&self, key: &str, force: bool) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        // One its restart policy is about to start again counts as running, as with Docker.
        if !force && c.restarting() {
            return Err(RuntimeError::Conflict(format!(
                "cannot remove container \"/{}\": container is restarting: stop the container before removing or force remove",
                c.name()
            )));
        }
        if force && c.restarting() {
            c.lock().restarting = false;
            c.lock().stopped_by_client = true;
        }
        if matches!(c.state(), RunState::Running { .. }) {
            if !force {
                return Err(RuntimeError::Conflict(format!(
                    "cannot remove container \"/{}\": container is running: stop the container before removing or force remove",
                    c.name()
                )));
            }
            c.lock().stopped_by_client = true;
            let _ = self.set_paused(&c, false).await;
            let mut rx = c.exits();
            let before = rx.borrow().exits;
            let _ = self.signal_running(&c, "KILL").await;
            let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|e| e.exits > before)).await;
        }
        if self.all().remove(&c.id).is_none() {
            return Ok(()); // removed meanwhile (auto-remove)
        }
        let _ = process::unmount(&c.dir.join("rootfs"));
        let _ = std::fs::remove_dir_all(&c.dir);
        self.networks.forget(&c.id);
        self.health.lock().unwrap_or_else(|e| e.into_inner()).remove(&c.id);
        c.exits.send_modify(|e| e.removed = true);
        self.container_event(&c, "destroy", &[]);
        Ok(())
    }

    /// Stops every container (at shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<_> = self.all().values().cloned().collect();
        for c in all {
            let _ = self.stop(&c.id, Some(Duration::from_secs(2)), None).await;
        }
        drop(self.files.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.dns_down_all();
        self.networks.shutdown();
        if let Some(v) = &self.view {
            v.close();
        }
    }
}

/// A container name as given (without `/`), checked.
pub(super) fn valid_name(n: &str) -> Result<String, RuntimeError> {
    if !n.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) || !n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return Err(RuntimeError::BadRequest(format!("Invalid container name ({n}), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed")));
    }
    Ok(n.to_string())
}

/// 64 random hex digits: a new container's or network's id.
pub(crate) fn random_id() -> String {
    let mut b = [0u8; 32];
    // SAFETY: getrandom(2) writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
        b[..16].copy_from_slice(&t.to_le_bytes());
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(dir: &Path, kv_dir: Option<PathBuf>) -> Arc<Runtime> {
        let images = Arc::new(ImageStore::open(&dir.join("images")).unwrap());
        Runtime::open(&dir.join("containers"), &dir.join("runc"), images, None, kv_dir, Limits::default()).unwrap()
    }

    #[test]
    fn the_kv_store_is_every_containers_writable_kv_and_absent_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let kv = dir.path().join("kv-mount");
        let binds = runtime(dir.path(), Some(kv.clone())).binds(&CreateSpec::default()).unwrap();
        assert_eq!(binds, vec![Bind::Path { src: kv.to_string_lossy().into_owned(), dst: KV_MOUNT.to_string(), ro: false }]);
        let binds = runtime(dir.path(), None).binds(&CreateSpec::default()).unwrap();
        assert!(binds.iter().all(|b| !matches!(b, Bind::Path { dst, .. } if dst == KV_MOUNT)), "no KV store, no /kv");
    }

    #[test]
    fn bind_strings_are_parsed_and_bad_ones_refused() {
        let s = |x: &str| BindSource::Sharable(x.into());
        assert_eq!(parse_bind("/d/x:/in:ro"), Ok((s("d/x"), "/in".into(), Some(false))));
        assert_eq!(parse_bind("/out.bin:/out:rw"), Ok((s("out.bin"), "/out".into(), Some(true))));
        assert_eq!(parse_bind("results:/out"), Ok((BindSource::Volume("results".into()), "/out".into(), None)));
        assert_eq!(parse_bind("/:/all:z,ro"), Ok((s(""), "/all".into(), Some(false))));
        for bad in ["x", "a:b:c:d", "/x:rel", "/x:/a/../b", "/../x:/y", "v:/y:rx", "/x:/y:ro,rw", "bad name:/y", ":/y"] {
            assert!(parse_bind(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_writable_sharable_path_needs_a_sharable_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CreateSpec { binds: vec!["/out.bin:/out:rw".into()], ..Default::default() };
        let e = runtime(dir.path(), None).binds(&spec).unwrap_err();
        assert_eq!(e.http_status(), 400);
        assert!(e.to_string().contains("no sharable namespace"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn parsed_binds_never_climb_and_are_absolute(b in "[/a-z.:_-]{0,24}") {
            if let Ok((src, dst, _)) = parse_bind(&b) {
                proptest::prop_assert!(dst.starts_with('/') && !dst.split('/').any(|c| c == ".."));
                if let BindSource::Sharable(rel) = src {
                    proptest::prop_assert!(!rel.starts_with('/') && !rel.split('/').any(|c| c == ".."));
                }
            }
        }
    }
}
