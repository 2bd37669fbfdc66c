// SPDX-License-Identifier: Apache-2.0
//! `insitu target start|stop|status|fsck`: the target is assembled and run by
//! `insitu-daemon`; this module turns options into its spec and prints what it did.

use crate::Failure;
use insitu_daemon::TargetSpec;
use insitu_image::parse_size;
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The options of `insitu target start`: a [`TargetSpec`] as the command line gives it,
/// and whether to stay in the foreground.
#[derive(clap::Args, Debug)]
pub(crate) struct StartArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:4420")]
    listen: SocketAddr,
    /// Subsystem NQN.
    #[arg(long, default_value = "nqn.2024-01.io.insitu:target")]
    nqn: String,
    /// A sharable namespace: file or block device (repeatable).
    #[arg(long = "namespace", value_name = "PATH")]
    namespaces: Vec<PathBuf>,
    /// A private namespace, for code running on the target (repeatable).
    #[arg(long, value_name = "PATH")]
    private: Vec<PathBuf>,
    /// Admit only this host NQN (repeatable).
    #[arg(long = "allow-host", value_name = "HOSTNQN")]
    allow_hosts: Vec<String>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Emulate a device: flash, host link and offload CPU (see `insitu model list`).
    #[arg(long)]
    model: Option<String>,
    /// Stay in the foreground (logs to stderr).
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Serve the Docker Engine API here, so `docker -H tcp://ADDR:PORT run IMAGE ...`
    /// runs containers on the target. Needs a --private namespace: the last one holds
    /// the images and containers (formatted ext4 when blank); the first --namespace is
    /// their read-only /data.
    #[arg(long, value_name = "ADDR:PORT")]
    docker: Option<SocketAddr>,
    /// A Docker Hub mirror for the container service (repeatable, tried in the order
    /// given before Docker Hub), as dockerd's: `http[s]://HOST[:PORT]`. Pulls and
    /// builds of Docker Hub's images (`busybox`, `user/x`) ask it first; `docker search
    /// TERM` lists its catalog. Plain HTTP only on an insecure registry.
    #[arg(long = "registry-mirror", value_name = "URL", requires = "docker")]
    registry_mirrors: Vec<String>,
    /// A registry the container service may reach over plain HTTP (repeatable):
    /// `HOST[:PORT]`, or a CIDR its address falls in. Loopback (127.0.0.0/8, ::1/128)
    /// always is, as with dockerd; every other registry is HTTPS with a trusted
    /// certificate.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]|CIDR", requires = "docker")]
    insecure_registries: Vec<String>,
    /// Give the target this IP address, reachable only over its NVMe/TCP connection
    /// (Ether-oN): a TAP device bridged to the host that runs `insitu ethernet up`.
    #[arg(long, value_name = "ADDR/PREFIX")]
    ether: Option<String>,
    /// Serve a key-value store (NVMe Key Value command set) in the last SIZE bytes
    /// (e.g. 64M) of the first --private namespace, as one more namespace after the
    /// block ones; reach it with `insitu kv ... nvme-tcp://ADDR/NQN`. Give the same SIZE
    /// on every start over the same image. Needs --private.
    #[arg(long = "kv-store", value_name = "SIZE")]
    kv_store: Option<String>,
    /// Read host data from disk namespaces with direct I/O instead of through the page
    /// cache. By default the kernel reads ahead of streaming hosts and the data leaves
    /// with `sendfile`; direct reads keep the page cache out of it (for drives faster
    /// than the page cache, or to measure the drive itself). EXEC always reads directly.
    #[arg(long = "direct-reads")]
    direct_reads: bool,
}

impl TryFrom<StartArgs> for TargetSpec {
    type Error = Failure;

    fn try_from(a: StartArgs) -> Result<TargetSpec, Failure> {
        Ok(TargetSpec {
            kv_store: a.kv_store.map(|s| parse_size(&s).map_err(|e| format!("--kv-store: {e}"))).transpose()?,
            listen: a.listen,
            nqn: a.nqn,
            namespaces: a.namespaces,
            private: a.private,
            allow_hosts: a.allow_hosts,
            metrics: a.metrics,
            model: a.model,
            docker: a.docker,
            registry_mirrors: a.registry_mirrors,
            insecure_registries: a.insecure_registries,
            ether: a.ether,
            direct_reads: a.direct_reads,
        })
    }
}

impl From<insitu_daemon::Error> for Failure {
    fn from(e: insitu_daemon::Error) -> Failure {
        Failure { code: 2, message: e.0 }
    }
}

/// `insitu target start`: in this process with `foreground`, else as a daemon.
pub(crate) fn start(spec: TargetSpec, foreground: bool, json_out: bool) -> Result<i32, Failure> {
    if foreground {
        insitu_daemon::run_foreground(spec)?;
        return Ok(0);
    }
    let (nqn, count) = (spec.nqn.clone(), spec.namespaces.len());
    let started = insitu_daemon::start_daemon(spec)?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&started.record).unwrap_or_default());
    } else {
        println!("target {nqn} serving {count} on nvme-tcp://{} (pid {}, log {})", started.listen, started.pid, started.log.display());
    }
    Ok(0)
}

pub(crate) fn stop(listen: SocketAddr, json_out: bool) -> Result<i32, Failure> {
    let pid = insitu_daemon::stop(listen)?;
    if json_out {
        println!("{}", json!({"stopped": listen.to_string(), "pid": pid}));
    } else {
        println!("stopped the target on {listen} (pid {pid})");
    }
    Ok(0)
}

pub(crate) fn status(json_out: bool) -> Result<i32, Failure> {
    let list = insitu_daemon::records();
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"targets": list})).unwrap_or_default());
    } else if list.is_empty() {
        println!("no targets started by insitu");
    } else {
        for r in &list {
            println!(
                "{} {} pid {} {}",
                r["listen"].as_str().unwrap_or(""),
                r["nqn"].as_str().unwrap_or(""),
                r["pid"],
                if r["running"] == json!(true) { "running" } else { "NOT RUNNING" }
            );
        }
    }
    Ok(0)
}

/// `insitu target fsck`: checks the key-value store's file system; exit 1 with problems.
pub(crate) fn fsck(private: &Path, bytes: u64, json_out: bool) -> Result<i32, Failure> {
    let r = insitu_daemon::fsck_kv_store(private, bytes)?;
    if json_out {
        println!(
            "{}",
            json!({"clean": r.is_clean(), "generation": r.generation, "files": r.files, "blocks": r.blocks, "free_blocks": r.free_blocks, "problems": r.problems, "notes": r.notes})
        );
    } else {
        match r.generation {
            Some(g) => println!("{}: generation {g}, {} files, {} blocks, {} free", private.display(), r.files, r.blocks, r.free_blocks),
            None => println!("{}: no file system", private.display()),
        }
        for p in &r.problems {
            println!("  problem: {p}");
        }
        for n in &r.notes {
            println!("  note: {n}");
        }
        println!("{}", if r.is_clean() { "clean" } else { "NOT clean" });
    }
    Ok(if r.is_clean() { 0 } else { 1 })
}
