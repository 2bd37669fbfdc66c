// SPDX-License-Identifier: Apache-2.0
//! The container service beside the target (`--docker`): its limits from the device model,
//! its view of namespace 1 refreshed by locks, container fences on that namespace, and a
//! stop that ends the containers before the process.

use std::path::Path;
use std::sync::Arc;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use crate::{file_name, Error, RUN_DIR};

/// Container limits from the device model: the CPU of its embedded cores, and reads of
/// `/data` at the rate the drive's flash delivers to its engine.
pub(crate) fn limits(model: Option<&insitu_model::DeviceModel>) -> insitu_isp::runtime::Limits {
    let cpus = model.and_then(|m| m.compute.as_ref()).map(|c| c.workers as f64 * c.cpu_share);
    let data_read_bps = model.and_then(insitu_model::DeviceModel::internal_read_mb_s).map(|mb_s| (mb_s * 1e6) as u64);
    insitu_isp::runtime::Limits { cpus, data_read_bps, ..Default::default() }
}

/// Blocks SIGTERM and SIGINT in this thread (and so in every thread it starts later);
/// returns the set for the thread that waits for them.
pub(crate) fn block_stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
    set
}

/// Starts the container service. SIGTERM and SIGINT then stop it before the process ends,
/// so no container outlives its target and the private namespace is unmounted cleanly.
/// With a KV store (`--kv-store`), its local API is mounted first
/// (`/run/insitu/kv-ADDR_PORT`, unmounted and removed on stop) and every container gets
/// it at `/kv`.
pub(crate) fn start(server: &crate::Target, mut cfg: insitu_isp::ServiceConfig, stop_signals: SigSet) -> Result<(), Error> {
    // The FUSE thread, like every other, leaves SIGTERM to the wait below.
    let kv = match server.kv_store() {
        Some(store) => {
            let dir = Path::new(RUN_DIR).join(format!("kv-{}", file_name(&server.local_addr())));
            let m = insitu_kvfs::KvMount::mount(store, &dir).map_err(|e| format!("the KV store's local API for containers: {e}"))?;
            cfg.kv_dir = Some(m.path().to_path_buf());
            Some(m)
        }
        None => None,
    };
    let listen = cfg.listen;
    let s = insitu_isp::Service::start(cfg).map_err(|e| format!("containers: {e}"))?;
    tracing::info!("Docker Engine API on tcp://{}", s.local_addr().unwrap_or(listen));
    // Namespace 1 is the containers' /data: a lock or release there refreshes their view.
    server.set_lock_listener(Arc::new(ViewRefresh(s.runtime().clone())));
    if let Some(t) = server.engine() {
        s.runtime().set_fence(Arc::new(ContainerFence(t)));
    }
    std::thread::spawn(move || {
        let sig = stop_signals.wait();
        tracing::info!("signal {}: stopping containers", sig.map_or("?", |s| s.as_str()));
        drop(s);
        // After the containers, which held it bound at /kv.
        drop(kv);
        // SAFETY: leave without running atexit handlers (the parent process may be Python).
        unsafe { libc::_exit(0) }
    });
    Ok(())
}

/// Fences on namespace 1 (the containers' `/data`) for the files containers write: the
/// same write fences as a host's LOCK, held for a container's run.
struct ContainerFence(Arc<insitu_engine::Engine>);

impl insitu_isp::runtime::BlockFence for ContainerFence {
    fn hold(&self, path: &str, extents: &[(u64, u64)]) -> Result<u64, String> {
        let req = insitu_engine::LockRequest { path: format!("{path} (container)"), extents: extents.to_vec() };
        self.0.lock(1, req).map_err(|e| e.message)
    }

    fn release(&self, id: u64) {
        if let Err(e) = self.0.unlock(1, id) {
            tracing::warn!("releasing a container's fence {id:#x}: {}", e.message);
        }
    }
}

/// Refreshes the containers' view of namespace 1 when a lock there changes.
struct ViewRefresh(Arc<insitu_isp::runtime::Runtime>);

impl insitu_engine::LockListener for ViewRefresh {
    fn locked(&self, nsid: u32, path: &str) {
        self.refresh(nsid, path);
    }

    fn unlocked(&self, nsid: u32, path: &str) {
        self.refresh(nsid, path);
    }
}

impl ViewRefresh {
    fn refresh(&self, nsid: u32, path: &str) {
        if nsid != 1 {
            return;
        }
        if let Some(v) = self.0.view() {
            if let Err(e) = v.refresh() {
                tracing::warn!("refreshing the view of namespace 1 after a lock on {path:?}: {e}");
            }
        }
    }
}
