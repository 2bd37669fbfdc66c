// SPDX-License-Identifier: Apache-2.0
//! A target from its [`TargetConfig`]: per subsystem an engine over its namespaces (paced
//! by the device model), the KV cache and the key-value store in its private namespace, and
//! every vendor command registered on the transport.

use std::net::SocketAddr;
use std::sync::Arc;

use insitu_engine::{Engine, NamespaceConfig};
use insitu_nvmf::{HostLinks, LinkPacer, Metrics, NvmSubsystem, Server, ServerHandle};

use crate::handlers::kv_store::{self, KV_STORE_FILE};
use crate::handlers::{self, ether};
use crate::TargetConfig;

/// The KV cache's page: the unit SparF reads and a flash page holds whole (InstInfer
/// Section IV-C stores 16 tokens' K or V per 4 KB page). A drive with larger flash pages
/// reads 4 KiB of one for a page sense and a 4 KiB transfer, as the device model charges,
/// so a larger KV page would only make sparse reads coarser.
const KV_PAGE: usize = 4096;

/// A bound, not yet serving, target.
pub struct Target {
    server: Server,
    engines: Vec<Arc<Engine>>,
    kv_stores: Vec<Arc<insitu_kvstore::KvStore>>,
    ether: Arc<ether::Port>,
}

/// A modelled link direction as the transport's pacer.
struct PacedLink(insitu_model::Pacer);

impl LinkPacer for PacedLink {
    fn book(&self, bytes: u64, from: std::time::Instant) -> std::time::Instant {
        self.0.reserve_link_from(bytes, from)
    }

    fn wait_until(&self, deadline: std::time::Instant) {
        self.0.wait_until(deadline);
    }
}

impl Target {
    /// Opens every namespace and service and binds the listen address (port 0 picks a free
    /// port).
    pub fn bind(cfg: TargetConfig) -> std::io::Result<Target> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        let model_err = |e: insitu_model::ModelError| invalid(format!("device model: {e}"));
        if cfg.subsystems.is_empty() {
            return Err(invalid("no subsystem configured: give at least one --nqn with a --namespace".into()));
        }
        let ether = Arc::new(ether::Port::default());
        let (mut engines, mut kv_stores, mut subsystems) = (Vec::new(), Vec::new(), Vec::new());
        for s in &cfg.subsystems {
            let mut engine = Engine::new();
            if let Some(budget) = cfg.model.as_ref().map(|m| m.compute_budget()).transpose().map_err(model_err)?.flatten() {
                engine = engine.with_compute_budget(Arc::new(budget));
            }
            // With a key-value store, the first private namespace gives up its last bytes.
            let kv_region = match cfg.kv_store {
                Some(bytes) => Some(kv_store::kv_region(s, bytes).map_err(invalid)?),
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
                engine.add_namespace(&ns.path, nc).map_err(|e| invalid(format!("namespace {}: {e}", ns.path.display())))?;
            }
            let flash_page = cfg.model.as_ref().and_then(|m| m.flash.as_ref()).map_or(KV_PAGE, |f| f.page_bytes as usize);
            engine.open_kv_cache(KV_PAGE.min(flash_page), flash_page).map_err(|e| invalid(format!("KV cache in the private namespace: {e}")))?;
            let engine = Arc::new(engine);
            let mut nvm = NvmSubsystem::new(&s.nqn, Arc::new(handlers::EngineBlocks(engine.clone()))).with_allowed_hosts(s.allow_hosts.clone());
            if let Some((at, offset, len)) = kv_region {
                let path = &s.namespaces[at].path;
                let fs = kv_store::open_kv_fs(path, offset, len, kv_pacing).map_err(invalid)?;
                let store = insitu_kvstore::KvStore::open_fs(&fs, KV_STORE_FILE).map_err(|e| invalid(format!("subsystem {}: {e}", s.nqn)))?;
                let store = Arc::new(store.with_max_value(insitu_kvstore::DEFAULT_MAX_VALUE.min(cfg.max_transfer())));
                nvm.add_command_set(Arc::new(kv_store::KvNamespace(store.clone())));
                kv_stores.push(store);
            }
            handlers::register(&mut nvm, &engine, &ether);
            engines.push(engine);
            subsystems.push(nvm);
        }
        // The host link, one model per direction (links are full duplex).
        let links = match cfg.model.as_ref().and_then(|m| m.link.clone()) {
            Some(l) => {
                let pacer = || -> std::io::Result<Arc<dyn LinkPacer>> {
                    let link = insitu_model::Link::new(l.clone()).map_err(model_err)?;
                    Ok(Arc::new(PacedLink(insitu_model::Pacer::new(None, Some(link)))))
                };
                Some(HostLinks { to_host: pacer()?, to_target: pacer()? })
            }
            None => None,
        };
        let server = Server::bind(cfg.transport(links), subsystems)?;
        let kv_caches: Vec<_> = cfg.subsystems.iter().zip(&engines).filter(|(_, e)| e.kv_cache().is_ok()).map(|(s, e)| (s.nqn.clone(), e)).collect();
        if !kv_caches.is_empty() {
            server.metrics().add_source(handlers::kv_cache_metrics(kv_caches));
        }
        Ok(Target { server, engines, kv_stores, ether })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The transport's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.server.metrics()
    }

    /// The key-value store of the first subsystem that has one (`kv_store` in the
    /// configuration), for the target's local API (`insitu-kvfs`) to share with hosts.
    pub fn kv_store(&self) -> Option<Arc<insitu_kvstore::KvStore>> {
        self.kv_stores.first().cloned()
    }

    /// The engine of the first subsystem: on which the container runtime fences the blocks
    /// of the files its containers write.
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.engines.first().cloned()
    }

    /// Tells `listener` of every lock taken and released on any subsystem's namespaces.
    pub fn set_lock_listener(&self, listener: Arc<dyn insitu_engine::LockListener>) {
        for e in &self.engines {
            e.set_lock_listener(listener.clone());
        }
    }

    /// Gives the target an Ether-oN interface (see `docs/etheron.md`). Without one, both
    /// Ether-oN commands complete with SCT 7 / SC 0xD0 (*no Ether-oN interface*). Fails if
    /// it has one already.
    pub fn attach_ether(&self, tap: insitu_etheron::Tap) -> std::io::Result<()> {
        self.ether.attach(tap, self.server.stop_token(), &self.server.metrics())
    }

    /// Serves connections until the process ends.
    pub fn run(self) -> std::io::Result<()> {
        self.server.run()
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> ServerHandle {
        self.server.spawn()
    }

    /// The transport, for the fuzzing harness.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn server(&self) -> &Server {
        &self.server
    }
}
