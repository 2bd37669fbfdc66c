// SPDX-License-Identifier: Apache-2.0
//! The insitu NVMe/TCP target: serves insitu [`Engine`]s to hosts over the NVMe over
//! Fabrics TCP transport, so a stock Linux host can `nvme connect -t tcp`, mount the
//! namespace, and send EXEC through the passthrough ioctl.
//!
//! A [`TargetConfig`] names the listen address and the subsystems; [`Server::bind`] opens
//! their namespaces and the socket; [`Server::run`] serves until the process ends and
//! [`Server::spawn`] serves on a background thread. Each connection is one queue with its
//! own thread; I/O queues run commands on a few worker threads so a queue can have many
//! commands in flight. A discovery subsystem (`nqn.2014-08.org.nvmexpress.discovery`) lists
//! the NVM subsystems each host may connect to.
//!
//! The vendor commands are specified in `docs/nvme-vendor-commands.md`.
#![deny(missing_docs)]

mod config;
mod connection;
mod controller;
mod ether;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod identify;
mod io;
mod kv;
mod kv_service;
mod lock;
mod metrics;
mod sink;

pub use config::{NamespaceSpec, SubsystemConfig, TargetConfig, DISCOVERY_NQN};
pub use insitu_engine::{Engine, Visibility};
pub use metrics::Metrics;

use controller::{Kind, Subsystem};
use insitu_engine::NamespaceConfig;
use insitu_engine::Visibility as Vis;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Where a subsystem's key-value store of `bytes` goes: (index of its first private
/// namespace, byte offset in that file, length), the region 4 KiB aligned at the file's end.
fn kv_region(s: &SubsystemConfig, bytes: u64) -> Result<(usize, u64, u64), String> {
    let Some(at) = s.namespaces.iter().position(|n| n.visibility == Vis::Private) else {
        return Err(format!(
            "subsystem {}: a key-value store (--kv-store) lives in the target's private namespace, and there is none: add --private IMG",
            s.nqn
        ));
    };
    let (offset, len) = kv_store_span(&s.namespaces[at].path, bytes)?;
    Ok((at, offset, len))
}

/// The byte offset and length in the private namespace image `path` of a key-value store
/// of `bytes`: 4 KiB aligned at the file's end, leaving at least 1 MiB to the KV cache.
fn kv_store_span(path: &std::path::Path, bytes: u64) -> Result<(u64, u64), String> {
    let file = std::fs::metadata(path).map_err(|e| format!("private namespace {}: {e}", path.display()))?.len();
    let len = bytes / 4096 * 4096;
    let min_rest = 1 << 20; // what the KV cache keeps, at least
    if len == 0 || len.saturating_add(min_rest) > file / 4096 * 4096 {
        return Err(format!(
            "--kv-store {bytes} does not fit in private namespace {} ({file} bytes): it must leave at least {min_rest} bytes to the KV cache; give a larger image or a smaller size",
            path.display()
        ));
    }
    Ok((file / 4096 * 4096 - len, len))
}

/// The file of the key-value service's store in the private namespace's file system.
pub const KV_STORE_FILE: &str = "kv.redb";
/// Buffer cache of that file system (redb keeps its own cache above it).
const KV_FS_CACHE: usize = 8 << 20;

/// The private data file system (accelfs) in `[offset, offset + len)` of `path`: opened,
/// or formatted when the region is blank; paced like its namespace when it has a model.
fn open_kv_fs(path: &std::path::Path, offset: u64, len: u64, pacing: Option<Arc<dyn insitu_media::Pacing>>) -> Result<insitu_accelfs::Fs, String> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| format!("KV store in {}: {e}", path.display()))?;
    let mut dev: Box<dyn insitu_accelfs::BlockDevice> = Box::new(insitu_accelfs::FileDevice::new(file, offset, len, path.display().to_string()));
    if let Some(p) = pacing {
        dev = Box::new(insitu_kvstore::PacedDevice::new(dev, p, offset));
    }
    insitu_accelfs::Fs::open_or_format(dev, KV_FS_CACHE).map_err(|e| {
        format!("the KV store's file system in the last {len} bytes of {}: {e} (a store made by an older insitu, or other data: use a blank image or zero that region; `insitu target fsck` checks it)", path.display())
    })
}

/// Checks, without changing anything, the file system holding the key-value store of a
/// target started with `--private path --kv-store bytes`.
pub fn fsck_kv_store(path: &std::path::Path, bytes: u64) -> Result<insitu_accelfs::FsckReport, String> {
    let (offset, len) = kv_store_span(path, bytes)?;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dev = insitu_accelfs::FileDevice::new(file, offset, len, path.display().to_string());
    insitu_accelfs::fsck(&dev).map_err(|e| e.to_string())
}

/// State shared by every connection of a server.
pub(crate) struct Shared {
    pub(crate) cfg: TargetConfig,
    pub(crate) subsystems: Vec<Arc<Subsystem>>,
    pub(crate) metrics: Arc<Metrics>,
    /// Paced host link (to the host, to the target), when a device model has one.
    pub(crate) links: Option<(Arc<insitu_model::Pacer>, Arc<insitu_model::Pacer>)>,
    /// The Ether-oN interface, when the target has one (`Server::attach_ether`).
    pub(crate) ether: ether::Port,
    stopping: AtomicBool,
    connections: Mutex<std::collections::HashMap<u64, TcpStream>>,
    /// The key of the next connection in `connections`.
    next_connection: std::sync::atomic::AtomicU64,
    live: AtomicUsize,
}

/// Flash page of the KV cache when no device model gives one.
const DEFAULT_KV_PAGE: usize = 4096;

/// Most connections served at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 1024;

impl Shared {
    pub(crate) fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn).cloned()
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}

/// A bound, not yet serving, NVMe/TCP target.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Opens every namespace and binds the listen address (port 0 picks a free port).
    pub fn bind(mut cfg: TargetConfig) -> std::io::Result<Server> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if cfg.subsystems.is_empty() {
            return Err(invalid("no subsystem configured: give at least one --nqn with a --namespace".into()));
        }
        let mut subsystems = Vec::new();
        for s in &cfg.subsystems {
            if s.nqn == DISCOVERY_NQN || !s.nqn.starts_with("nqn.") || s.nqn.len() > 223 {
                return Err(invalid(format!("{:?} is not a usable subsystem NQN (expected nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)", s.nqn)));
            }
            if subsystems.iter().any(|x: &Arc<Subsystem>| x.nqn == s.nqn) {
                return Err(invalid(format!("subsystem {} is configured twice", s.nqn)));
            }
            let mut target = Engine::new();
            let model_err = |e: insitu_model::ModelError| invalid(format!("device model: {e}"));
            if let Some(budget) = cfg.model.as_ref().map(|m| m.compute_budget()).transpose().map_err(model_err)?.flatten() {
                target = target.with_compute_budget(Arc::new(budget));
            }
            // With a key-value store, the first private namespace gives up its last bytes.
            let kv_region = match cfg.kv_store {
                Some(bytes) => Some(kv_region(s, bytes).map_err(invalid)?),
                None => None,
            };
            // The store's file system is paced with its namespace: one drive, one model.
            let mut kv_pacing = None;
            for (i, ns) in s.namespaces.iter().enumerate() {
                let mut nc =
                    NamespaceConfig { lba_size: ns.lba_size, visibility: ns.visibility, cached_reads: !cfg.direct_reads, ..NamespaceConfig::default() };
                if let Some((at, offset, _)) = &kv_region {
                    if *at == i {
                        nc.size = Some(offset / u64::from(ns.lba_size) * u64::from(ns.lba_size));
                    }
                }
                if let Some(m) = &cfg.model {
                    let size = std::fs::metadata(&ns.path).map(|x| x.len()).unwrap_or(0);
                    // The host link is paced by the connections, on the bytes they carry.
                    let drive = insitu_model::DeviceModel { link: None, ..m.clone() };
                    nc.pacing = Some(Arc::new(drive.pacer(size.max(1 << 20)).map_err(model_err)?));
                    if kv_region.as_ref().is_some_and(|(at, _, _)| *at == i) {
                        kv_pacing.clone_from(&nc.pacing);
                    }
                }
                target.add_namespace(&ns.path, nc).map_err(|e| invalid(format!("namespace {}: {e}", ns.path.display())))?;
            }
            let page_bytes = cfg.model.as_ref().and_then(|m| m.flash.as_ref()).map_or(DEFAULT_KV_PAGE, |f| f.page_bytes as usize);
            target.open_kv_cache(page_bytes).map_err(|e| invalid(format!("KV cache in the private namespace: {e}")))?;
            if let Some((at, offset, len)) = kv_region {
                let path = &s.namespaces[at].path;
                let fs = open_kv_fs(path, offset, len, kv_pacing).map_err(invalid)?;
                let store = insitu_kvstore::KvStore::open_fs(&fs, KV_STORE_FILE).map_err(|e| invalid(format!("subsystem {}: {e}", s.nqn)))?;
                let store = store.with_max_value(insitu_kvstore::DEFAULT_MAX_VALUE.min(cfg.max_transfer()));
                target.set_kv_service(store);
            }
            subsystems.push(Arc::new(Subsystem::new(&s.nqn, Kind::Nvm(Arc::new(target)), s.allow_hosts.clone())));
        }
        subsystems.push(Arc::new(Subsystem::new(DISCOVERY_NQN, Kind::Discovery, Vec::new())));
        let listener = TcpListener::bind(cfg.listen)?;
        cfg.listen = listener.local_addr()?;
        // The host link, one model per direction (links are full duplex).
        let link =
            |m: &insitu_model::DeviceModel| m.link.clone().map(|l| insitu_model::Link::new(l).map(|l| Arc::new(insitu_model::Pacer::new(None, Some(l)))));
        let links = match cfg.model.as_ref().and_then(link) {
            Some(to_host) => {
                let to_target = cfg.model.as_ref().and_then(link).expect("same model");
                let err = |e: insitu_model::ModelError| invalid(format!("device model: {e}"));
                Some((to_host.map_err(err)?, to_target.map_err(err)?))
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            links,
            cfg,
            subsystems,
            metrics: Arc::new(Metrics::default()),
            ether: Default::default(),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Default::default()),
            next_connection: Default::default(),
            live: AtomicUsize::new(0),
        });
        Ok(Server { listener, shared })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.cfg.listen
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The key-value store of the first subsystem that has one (`kv_store` in the
    /// configuration), for the target's local API (`insitu-kvfs`) to share with hosts.
    pub fn kv_store(&self) -> Option<Arc<insitu_kvstore::KvStore>> {
        self.shared.subsystems.iter().filter_map(|s| s.target()).find_map(|t| t.kv_service_nsid().and_then(|n| t.kv_service(n)).cloned())
    }

    /// The target of the first subsystem that has one: the daemon's, on which the
    /// container runtime fences the blocks of the files its containers write.
    pub fn target(&self) -> Option<Arc<insitu_engine::Engine>> {
        self.shared.subsystems.iter().find_map(|s| s.target().cloned())
    }

    /// Tells `listener` of every lock taken and released on any subsystem's namespaces.
    pub fn set_lock_listener(&self, listener: Arc<dyn insitu_engine::LockListener>) {
        for s in &self.shared.subsystems {
            if let Some(t) = s.target() {
                t.set_lock_listener(listener.clone());
            }
        }
    }

    /// Serves connections until [`ServerHandle::shutdown`] (or forever).
    pub fn run(self) -> std::io::Result<()> {
        loop {
            let accepted = self.listener.accept();
            if self.shared.stopping() {
                break;
            }
            let Ok((stream, peer)) = accepted else {
                // Out of descriptors, say: give the closing connections a moment.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            };
            let live = self.shared.live.fetch_add(1, Ordering::Relaxed);
            if live >= MAX_CONNECTIONS {
                self.shared.live.fetch_sub(1, Ordering::Relaxed);
                eprintln!("insitu-target: refusing a connection: {MAX_CONNECTIONS} are open");
                continue;
            }
            // A second descriptor of each connection, for drop_connections and shutdown;
            // it goes when its connection ends, so a client that vanishes leaves none.
            let key = self.shared.next_connection.fetch_add(1, Ordering::Relaxed);
            if let Ok(c) = stream.try_clone() {
                self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).insert(key, c);
            }
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new().name("nvmf-queue".into()).spawn(move || {
                connection::serve(shared.clone(), stream, peer);
                shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                shared.live.fetch_sub(1, Ordering::Relaxed);
            });
            if spawned.is_err() {
                // No thread for it (the process is at its limit): refuse this one, keep serving.
                self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                self.shared.live.fetch_sub(1, Ordering::Relaxed);
                eprintln!("insitu-target: refusing a connection: cannot start a thread for it");
            }
        }
        Ok(())
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> ServerHandle {
        let shared = self.shared.clone();
        let addr = self.local_addr();
        let thread = std::thread::spawn(move || {
            let _ = self.run();
        });
        ServerHandle { shared, addr, thread: Some(thread) }
    }
}

/// A server running on a background thread.
pub struct ServerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address served.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Drops every connection, as if the network failed (for reconnect tests).
    pub fn drop_connections(&self) {
        for (_, c) in self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Stops accepting, closes every connection and waits for the accept loop to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.drop_connections();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}
