// SPDX-License-Identifier: Apache-2.0
//! The one place an insitu target is assembled and run as a service.
//!
//! A [`TargetSpec`] says what a target serves: its namespaces, private namespaces (the KV
//! cache, the key-value store, the containers' images), the device model, the container
//! service, Ether-oN and metrics. [`start`] checks it, assembles the target in the process
//! that will serve it (so every thread the target starts lives there), and runs it in the
//! foreground or as a daemon with a record under `/run/insitu/` that [`stop`] and
//! [`records`] read. [`Target::bind`] builds one from a [`TargetConfig`] in any process
//! (tests and benchmarks serve it on a thread). The transport (`insitu-nvmf`) and the
//! services stay libraries: this crate wires them and registers the handler of every
//! vendor command (`handlers`), as an SPDK application wires its libraries and modules.
//!
//! A serving target ignores SIGPIPE (a peer that vanished ends only its own connection)
//! and logs through `tracing` to its log file, `/run/insitu/target-ADDR.log`.

mod assemble;
mod config;
mod containers;
mod daemonize;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handlers;
mod metrics;
mod target;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use assemble::Assembled;
pub use config::{NamespaceSpec, SubsystemConfig, TargetConfig};
pub use handlers::kv_store::{fsck_kv_store, KV_STORE_FILE};
pub use insitu_engine::Visibility;
pub use insitu_nvmf::{Metrics, ServerHandle};
pub use target::Target;

/// Where daemons keep their records and logs.
pub const RUN_DIR: &str = "/run/insitu";

/// What a target serves and how it runs (`insitu target start`'s options).
#[derive(Debug, Clone)]
pub struct TargetSpec {
    /// The NVMe/TCP listen address.
    pub listen: SocketAddr,
    /// The subsystem's NQN.
    pub nqn: String,
    /// Sharable namespaces (files or block devices), NSID 1 onwards.
    pub namespaces: Vec<PathBuf>,
    /// Private namespaces: the KV cache and key-value store in the first, the containers'
    /// images in the last with `docker`.
    pub private: Vec<PathBuf>,
    /// Host NQNs admitted (all when empty).
    pub allow_hosts: Vec<String>,
    /// Where to serve Prometheus metrics (`GET /metrics`).
    pub metrics: Option<SocketAddr>,
    /// The device model to emulate (`insitu model list`).
    pub model: Option<String>,
    /// Where to serve the Docker Engine API (the container service).
    pub docker: Option<SocketAddr>,
    /// Docker Hub mirrors of the container service (`http[s]://HOST[:PORT]`), tried in
    /// order before Docker Hub.
    pub registry_mirrors: Vec<String>,
    /// Registries the container service may reach over plain HTTP (`HOST[:PORT]` or a
    /// CIDR), besides loopback.
    pub insecure_registries: Vec<String>,
    /// An Ether-oN interface with this address (`ADDR/PREFIX`).
    pub ether: Option<String>,
    /// Bytes of the first private namespace for the key-value store.
    pub kv_store: Option<u64>,
    /// Host reads of disks with direct I/O, not through the page cache.
    pub direct_reads: bool,
}

/// Why a target could not start or stop; the message says what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

impl From<String> for Error {
    fn from(m: String) -> Error {
        Error(m)
    }
}

/// A daemon that came up: its record (as `insitu target start --json` prints it).
#[derive(Debug, Clone)]
pub struct Started {
    /// The address it serves.
    pub listen: SocketAddr,
    /// Its process.
    pub pid: i32,
    /// Its log file.
    pub log: PathBuf,
    /// The record written under [`RUN_DIR`].
    pub record: Value,
}

/// An address as a file name (`127.0.0.1_4420`), for the files kept per target.
pub(crate) fn file_name(addr: &SocketAddr) -> String {
    addr.to_string().replace([':', '[', ']'], "_")
}

/// The record file of the target listening on `listen`.
pub fn record_file(listen: &SocketAddr) -> PathBuf {
    Path::new(RUN_DIR).join(format!("target-{}.json", file_name(listen)))
}

/// The log file of the target listening on `listen`.
pub fn log_file(listen: &SocketAddr) -> PathBuf {
    Path::new(RUN_DIR).join(format!("target-{}.log", file_name(listen)))
}

/// A target served on a background thread of this process: the embedded default of the
/// LLM tools and of tests. It ends with [`Embedded::shutdown`] or when dropped.
pub struct Embedded {
    handle: insitu_nvmf::ServerHandle,
}

impl Embedded {
    /// The address it serves.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// Stops accepting, closes every connection and waits for the accept loop to end.
    pub fn shutdown(self) {
        self.handle.shutdown();
    }
}

/// Assembles the target of `spec` in this process and serves it on a background thread.
pub fn start_embedded(spec: TargetSpec) -> Result<Embedded, Error> {
    let target = assemble::Plan::new(spec)?.assemble(|_| {})?;
    Ok(Embedded { handle: target.server.spawn() })
}

/// Runs the target of `spec` in this process until it ends (`--foreground`).
pub fn run_foreground(spec: TargetSpec) -> Result<(), Error> {
    let plan = assemble::Plan::new(spec)?;
    ignore_sigpipe();
    init_logging();
    let nqn = plan.spec.nqn.clone();
    let target = plan.assemble(|_| {})?;
    tracing::info!("serving {nqn} on nvme-tcp://{}", target.server.local_addr());
    target.server.run().map_err(|e| Error(e.to_string()))
}

/// Starts the target of `spec` as a daemon and waits until it serves (and its Docker API
/// answers, with `docker`); writes its record under [`RUN_DIR`].
pub fn start_daemon(spec: TargetSpec) -> Result<Started, Error> {
    let plan = assemble::Plan::new(spec)?;
    std::fs::create_dir_all(RUN_DIR).map_err(|e| format!("{RUN_DIR}: {e}"))?;
    let docker = plan.spec.docker;
    let record = plan.record();
    let (pid, listen) = daemonize::spawn(plan)?;
    let log = log_file(&listen);
    let mut rec = record;
    rec["listen"] = json!(listen.to_string());
    rec["pid"] = json!(pid);
    rec["log"] = json!(log);
    std::fs::write(record_file(&listen), rec.to_string()).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for addr in std::iter::once(listen).chain(docker) {
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline || !daemonize::alive(pid) {
                return Err(format!("the target did not come up on {addr}; see {}", log.display()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(Started { listen, pid, log, record: rec })
}

/// Stops the daemon listening on `listen` (SIGTERM, then up to 10 s for it to end) and
/// removes its record; returns its pid.
pub fn stop(listen: SocketAddr) -> Result<i32, Error> {
    let file = record_file(&listen);
    let rec: Value = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("no target started by insitu listens on {listen} (no {})", file.display()))?;
    let pid = rec["pid"].as_i64().unwrap_or(0) as i32;
    if pid > 0 {
        daemonize::terminate(pid, Duration::from_secs(10));
    }
    let _ = std::fs::remove_file(&file);
    Ok(pid)
}

/// The records of every target started by insitu, each with `running`.
pub fn records() -> Vec<Value> {
    let mut list = Vec::new();
    if let Ok(rd) = std::fs::read_dir(RUN_DIR) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("target-") && name.ends_with(".json")) {
                continue;
            }
            if let Some(mut rec) = std::fs::read_to_string(e.path()).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok()) {
                let pid = rec["pid"].as_i64().unwrap_or(0) as i32;
                rec["running"] = json!(pid > 0 && daemonize::alive(pid));
                list.push(rec);
            }
        }
    }
    list
}

/// A vanished peer must end only its own connection: with SIGPIPE's default action a send
/// to a client that has gone away (`sendfile` takes no `MSG_NOSIGNAL`) would end the whole
/// target. Sends then fail with `EPIPE`, which the connection treats as its end.
fn ignore_sigpipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler code; it only changes the signal's disposition.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// Log lines to standard error (the daemon's log file), in the form the transport's own
/// lines have: `insitu-target: MESSAGE` (warnings and errors say so after the colon).
fn init_logging() {
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).event_format(LogLine).try_init();
}

/// The format of [`init_logging`].
struct LogLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for LogLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            _ => "",
        };
        write!(w, "insitu-target: {level}")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// The embedded default's targets: an engine per local image, served in the calling
/// process (give it to `insitu_host::Offloader::with_local_targets`).
pub struct LocalEngines;

struct LocalEngine(insitu_engine::Engine);

impl insitu_host::local::LocalTarget for LocalEngine {
    fn exec(&self, descriptor: &[u8]) -> Result<insitu_host::local::LocalOutcome, insitu_proto::CommandError> {
        let o = self.0.exec(1, descriptor)?;
        Ok(insitu_host::local::LocalOutcome { result: o.result, media_read_bytes: o.media_read_bytes })
    }
}

impl insitu_host::local::LocalTargets for LocalEngines {
    fn open(
        &self,
        image: &Path,
        registry: std::sync::Arc<insitu_offload::Registry>,
        model: Option<&insitu_model::DeviceModel>,
    ) -> Result<std::sync::Arc<dyn insitu_host::local::LocalTarget>, insitu_host::OasError> {
        use insitu_host::OasError;
        let io = |source: std::io::Error| OasError::Io { path: image.to_path_buf(), source };
        let bad = |e: insitu_model::ModelError| OasError::BadRequest(format!("{}: {e}", insitu_host::model_sidecar(image).display()));
        let mut engine = insitu_engine::Engine::new().with_registry(registry);
        let mut cfg = insitu_engine::NamespaceConfig::default();
        if let Some(model) = model {
            let size = std::fs::metadata(image).map_err(io)?.len();
            cfg.pacing = Some(std::sync::Arc::new(model.pacer(size).map_err(bad)?));
            if let Some(budget) = model.compute_budget().map_err(bad)? {
                engine = engine.with_compute_budget(std::sync::Arc::new(budget));
            }
        }
        engine.add_namespace(image, cfg).map_err(|e| io(std::io::Error::other(e)))?;
        Ok(std::sync::Arc::new(LocalEngine(engine)))
    }
}
