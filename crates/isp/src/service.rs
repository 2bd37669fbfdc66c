// SPDX-License-Identifier: Apache-2.0
//! The container service of one target: its private namespace mounted where only the
//! target sees it, the image store and the containers kept there, the view of the
//! sharable namespace, and the API server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::api::DockerServer;
use crate::image::{ImageStore, RegistryConfig};
use crate::runtime::{Limits, Runtime, SharableView};

/// How to start the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where the Docker API listens.
    pub listen: SocketAddr,
    /// The private namespace (image file or block device); formatted ext4 when blank.
    pub private: PathBuf,
    /// The sharable namespace containers see at `/data`, if any.
    pub sharable: Option<PathBuf>,
    /// Runtime state (mount points, runc's state), on a tmpfs: `/run/insitu/isp-PORT`.
    pub state_dir: PathBuf,
    /// Default container limits.
    pub limits: Limits,
    /// The target's KV store as a directory (the `insitu-kvfs` mount the caller keeps
    /// mounted while the service runs), bound read-write at `/kv` in every container;
    /// `None`: the target has no KV store, and containers get no `/kv`.
    pub kv_dir: Option<PathBuf>,
    /// Insecure registries and Docker Hub mirrors for pulls, pushes, searches and builds.
    pub registries: RegistryConfig,
}

/// A running container service; stopping it stops its containers and unmounts.
pub struct Service {
    server: Option<DockerServer>,
    mount: PathBuf,
    runtime: Arc<Runtime>,
}

impl Service {
    /// Mounts the private namespace and starts serving.
    pub fn start(cfg: ServiceConfig) -> Result<Service, String> {
        let mount = cfg.state_dir.join("private");
        std::fs::create_dir_all(&mount).map_err(|e| format!("{}: {e}", mount.display()))?;
        prepare_private(&cfg.private)?;
        if !crate::runtime::is_mounted(&mount) {
            run("mount", &["-o", "loop", &cfg.private.to_string_lossy(), &mount.to_string_lossy()])
                .map_err(|e| format!("cannot mount the private namespace {}: {e}", cfg.private.display()))?;
        }
        // Only the target's own root may enter it.
        let _ = std::fs::set_permissions(&mount, std::os::unix::fs::PermissionsExt::from_mode(0o700));
        let images = Arc::new(ImageStore::open(&mount.join("images")).map_err(|e| e.to_string())?.with_registries(cfg.registries));
        let view = match &cfg.sharable {
            Some(p) => {
                let v = Arc::new(SharableView::new(Some(p), &cfg.state_dir.join("view")).map_err(|e| e.to_string())?);
                v.refresh().map_err(|e| format!("the sharable namespace {}: {e}", p.display()))?;
                Some(v)
            }
            None => None,
        };
        let runtime = Runtime::open(&mount.join("containers"), &cfg.state_dir.join("runc"), images, view, cfg.kv_dir, cfg.limits).map_err(|e| e.to_string())?;
        // Ports are published where the API listens: whoever reaches the API reaches them.
        runtime.set_publish_ip(cfg.listen.ip());
        let server = DockerServer::spawn(cfg.listen, runtime.clone()).map_err(|e| format!("the Docker API on {}: {e}", cfg.listen))?;
        Ok(Service { server: Some(server), mount, runtime })
    }

    /// Where the API listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(DockerServer::local_addr)
    }

    /// The runtime (to refresh the sharable view when a lock changes).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Formats a blank private namespace with ext4; refuses one that holds something else.
fn prepare_private(path: &Path) -> Result<(), String> {
    let ty = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(path)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    match ty.as_str() {
        "ext4" => Ok(()),
        "" => {
            let mut head = vec![0u8; 1 << 16];
            let n = std::fs::File::open(path).and_then(|mut f| std::io::Read::read(&mut f, &mut head)).map_err(|e| format!("{}: {e}", path.display()))?;
            if head[..n].iter().any(|&b| b != 0) {
                return Err(format!(
                    "the private namespace {} holds data that is not a file system (a KV cache?): give containers a private namespace of their own (a second --private)",
                    path.display()
                ));
            }
            run("mkfs.ext4", &["-q", "-F", "-L", "insitu-private", &path.to_string_lossy()])
        }
        other => Err(format!("the private namespace {} holds a {other} file system; containers need ext4 or a blank image", path.display())),
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}
