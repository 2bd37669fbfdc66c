// SPDX-License-Identifier: Apache-2.0
//! `insitu target start|stop|status`: run the NVMe/TCP target in the foreground or as a
//! daemon, with a pid file per listen address under `/run/insitu/`.

use crate::Failure;
use insitu_nvmf::{NamespaceSpec, Server, SubsystemConfig, TargetConfig};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RUN_DIR: &str = "/run/insitu";

fn pid_file(listen: &SocketAddr) -> PathBuf {
    Path::new(RUN_DIR).join(format!("target-{}.json", listen.to_string().replace([':', '[', ']'], "_")))
}

/// What `insitu target start` was asked for.
pub(crate) struct StartArgs {
    pub(crate) listen: SocketAddr,
    pub(crate) nqn: String,
    pub(crate) namespaces: Vec<PathBuf>,
    pub(crate) private: Vec<PathBuf>,
    pub(crate) allow_hosts: Vec<String>,
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) model: Option<String>,
    pub(crate) foreground: bool,
    pub(crate) docker: Option<SocketAddr>,
    /// `--ether ADDR/PREFIX`: an Ether-oN interface with this address.
    pub(crate) ether: Option<String>,
    /// `--kv-store SIZE`: bytes of the first private namespace for the key-value store.
    pub(crate) kv_store: Option<u64>,
    /// `--direct-reads`: host reads of disks with direct I/O, not through the page cache.
    pub(crate) direct_reads: bool,
}

pub(crate) fn start(a: StartArgs, json_out: bool) -> Result<i32, Failure> {
    if a.namespaces.is_empty() {
        return Err("give at least one --namespace PATH (a file or block device)".to_string().into());
    }
    // Absolute paths: the record must mean the same from any working directory.
    let absolute = |p: &PathBuf| std::fs::canonicalize(p).map_err(|e| format!("namespace {}: {e}", p.display()));
    let a = StartArgs {
        namespaces: a.namespaces.iter().map(absolute).collect::<Result<_, _>>()?,
        private: a.private.iter().map(absolute).collect::<Result<_, _>>()?,
        ..a
    };
    let mut namespaces: Vec<NamespaceSpec> = a.namespaces.iter().map(NamespaceSpec::sharable).collect();
    // With --docker the last private namespace holds a file system of the container
    // service; the fabric (and its KV cache) keeps the others.
    let fabric_private = if a.docker.is_some() {
        if a.private.is_empty() {
            return Err("--docker needs a private namespace for images and containers: add --private IMG (a blank image is formatted)".to_string().into());
        }
        &a.private[..a.private.len() - 1]
    } else {
        &a.private[..]
    };
    if a.kv_store.is_some() && fabric_private.is_empty() {
        let why = if a.private.is_empty() { "" } else { " (with --docker the last --private namespace holds the containers, so give one more)" };
        return Err(format!("--kv-store keeps the key-value store in the first private namespace: add --private IMG (a file or block device larger than the store){why}").into());
    }
    if a.kv_store == Some(0) {
        return Err("--kv-store 0: give the store's size, e.g. --kv-store 64M".to_string().into());
    }
    namespaces.extend(fabric_private.iter().map(NamespaceSpec::private));
    let model = a.model.as_deref().map(insitu_model::parse).transpose().map_err(|e| e.to_string())?;
    let containers = a.docker.map(|listen| insitu_isp::ServiceConfig {
        listen,
        private: a.private.last().cloned().unwrap_or_default(),
        sharable: a.namespaces.first().cloned(),
        state_dir: Path::new(RUN_DIR).join(format!("isp-{}", listen.to_string().replace([':', '[', ']'], "_"))),
        limits: container_limits(model.as_ref()),
        // Set by start_containers once the KV store's directory is mounted.
        kv_dir: None,
    });
    let cfg = TargetConfig {
        model,
        listen: a.listen,
        subsystems: vec![SubsystemConfig { nqn: a.nqn.clone(), namespaces, allow_hosts: a.allow_hosts.clone() }],
        kv_store: a.kv_store,
        direct_reads: a.direct_reads,
        ..TargetConfig::default()
    };
    let record = json!({
        "ether": a.ether,
        "listen": a.listen.to_string(), "nqn": a.nqn, "namespaces": a.namespaces, "private": a.private,
        "allow_hosts": a.allow_hosts, "metrics": a.metrics.map(|m| m.to_string()), "model": a.model,
        "docker": a.docker.map(|d| d.to_string()), "kv_store": a.kv_store, "direct_reads": a.direct_reads,
    });
    let serving = Serving { cfg, ether: a.ether.clone(), metrics: a.metrics, containers };
    if a.foreground {
        ignore_sigpipe();
        let server = serving.assemble()?;
        eprintln!("insitu-target: serving {} on nvme-tcp://{}", a.nqn, server.local_addr());
        server.run().map_err(|e| e.to_string())?;
        return Ok(0);
    }
    std::fs::create_dir_all(RUN_DIR).map_err(|e| format!("{RUN_DIR}: {e}"))?;
    // The daemon forks before the target exists: fork(2) copies only the calling thread,
    // so every thread the target starts (queue workers, the attention engine's pool, the
    // container service) must be started in the process that serves. The child reports
    // over a pipe whether it came up, and the parent waits for that.
    let (mut ready_rx, ready_tx) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: fork(2) in the command-line process, which has started no threads of its
    // own (the target is assembled in the child).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()).into());
    }
    if pid == 0 {
        drop(ready_rx);
        daemon_child(serving, ready_tx);
    }
    drop(ready_tx);
    let mut report = String::new();
    let _ = ready_rx.read_to_string(&mut report);
    let listen: SocketAddr = match report.strip_prefix("ready ").and_then(|a| a.trim().parse().ok()) {
        Some(addr) => addr,
        None => {
            let mut status = 0;
            // SAFETY: reaps the child that failed, with a local out-parameter.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let why = report.strip_prefix("error ").unwrap_or("the daemon exited before it served; run with --foreground to see why");
            return Err(why.trim().to_string().into());
        }
    };
    let log = log_file(&listen);
    let mut rec = record;
    rec["listen"] = json!(listen.to_string());
    rec["pid"] = json!(pid);
    rec["log"] = json!(log);
    std::fs::write(pid_file(&listen), rec.to_string()).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for addr in std::iter::once(listen).chain(a.docker) {
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline || !alive(pid) {
                return Err(format!("the target did not come up on {addr}; see {}", log.display()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rec).unwrap_or_default());
    } else {
        println!("target {} serving {} on nvme-tcp://{listen} (pid {pid}, log {})", a.nqn, a.namespaces.len(), log.display());
    }
    Ok(0)
}

fn log_file(listen: &SocketAddr) -> PathBuf {
    Path::new(RUN_DIR).join(format!("target-{}.log", listen.to_string().replace([':', '[', ']'], "_")))
}

/// A vanished peer must end only its own connection: with SIGPIPE's default action a
/// send to a client that has gone away (`sendfile` takes no `MSG_NOSIGNAL`) would end the
/// whole target. Sends then fail with `EPIPE`, which the connection treats as its end.
fn ignore_sigpipe() {
    // SAFETY: sets the disposition of one signal; no memory is passed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Everything a serving target is made of, assembled in the process that serves it.
struct Serving {
    cfg: TargetConfig,
    ether: Option<String>,
    metrics: Option<SocketAddr>,
    containers: Option<insitu_isp::ServiceConfig>,
}

impl Serving {
    /// Binds the target and starts its services: Ether-oN, metrics and containers.
    fn assemble(self) -> Result<Server, Failure> {
        self.assemble_then(|_| {})
    }

    /// As [`Serving::assemble`], calling `bound` between binding the target and starting
    /// its services (the daemon moves its output to the log there).
    fn assemble_then(self, bound: impl FnOnce(&Server)) -> Result<Server, Failure> {
        let listen = self.cfg.listen;
        // Before the target starts any thread: with containers, SIGTERM and SIGINT are
        // taken by one thread that stops them first, so every other thread must block both.
        let stop_signals = self.containers.is_some().then(block_stop_signals);
        let server = Server::bind(self.cfg).map_err(|e| format!("cannot start the target on {listen}: {e}"))?;
        bound(&server);
        if let Some(tap) = crate::ethernet_cmd::target_tap(self.ether.as_deref())? {
            server.attach_ether(tap).map_err(|e| format!("--ether: {e}"))?;
        }
        if let Some(m) = self.metrics {
            serve_metrics(m, server.metrics())?;
        }
        if let (Some(cfg), Some(set)) = (self.containers, stop_signals) {
            start_containers(&server, cfg, set)?;
        }
        Ok(server)
    }
}

/// Blocks SIGTERM and SIGINT in this thread (and so in every thread it starts later);
/// returns the set for `sigwait`.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset operations on a local set, then the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Container limits from the device model: the CPU of its embedded cores, and reads of
/// `/data` at the rate the drive's flash delivers to its engine.
fn container_limits(model: Option<&insitu_model::DeviceModel>) -> insitu_isp::runtime::Limits {
    let cpus = model.and_then(|m| m.compute.as_ref()).map(|c| c.workers as f64 * c.cpu_share);
    let data_read_bps = model.and_then(insitu_model::DeviceModel::internal_read_mb_s).map(|mb_s| (mb_s * 1e6) as u64);
    insitu_isp::runtime::Limits { cpus, data_read_bps, ..Default::default() }
}

/// Starts the container service (`--docker`). SIGTERM and SIGINT then stop
/// it before the process ends, so no container outlives its target and the private
/// namespace is unmounted cleanly. With a KV store (`--kv-store`), its local API is mounted
/// first (`/run/insitu/kv-ADDR_PORT`, unmounted and removed on stop) and every container
/// gets it at `/kv`.
fn start_containers(server: &Server, mut cfg: insitu_isp::ServiceConfig, set: libc::sigset_t) -> Result<(), Failure> {
    // The FUSE thread, like every other, leaves SIGTERM to the sigwait below.
    let kv = match server.kv_store() {
        Some(store) => {
            let dir = Path::new(RUN_DIR).join(format!("kv-{}", server.local_addr().to_string().replace([':', '[', ']'], "_")));
            let m = insitu_kvfs::KvMount::mount(store, &dir).map_err(|e| format!("the KV store's local API for containers: {e}"))?;
            cfg.kv_dir = Some(m.path().to_path_buf());
            Some(m)
        }
        None => None,
    };
    let listen = cfg.listen;
    let s = insitu_isp::Service::start(cfg).map_err(|e| format!("containers: {e}"))?;
    eprintln!("insitu-target: Docker Engine API on tcp://{}", s.local_addr().unwrap_or(listen));
    // Namespace 1 is the containers' /data: a lock or release there refreshes their view.
    server.set_lock_listener(std::sync::Arc::new(ViewRefresh(s.runtime().clone())));
    if let Some(t) = server.target() {
        s.runtime().set_fence(std::sync::Arc::new(ContainerFence(t)));
    }
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: sigwait on the set built above, with a local out-parameter.
        unsafe { libc::sigwait(&set, &mut sig) };
        eprintln!("insitu-target: signal {sig}: stopping containers");
        drop(s);
        // After the containers, which held it bound at /kv.
        drop(kv);
        // SAFETY: leave without running atexit handlers, as the daemon does.
        unsafe { libc::_exit(0) }
    });
    Ok(())
}

/// Fences on namespace 1 (the containers' `/data`) for the files containers write: the
/// same write fences as a host's LOCK, held for a container's run.
struct ContainerFence(std::sync::Arc<insitu_engine::Engine>);

impl insitu_isp::runtime::BlockFence for ContainerFence {
    fn hold(&self, path: &str, extents: &[(u64, u64)]) -> Result<u64, String> {
        let req = insitu_engine::LockRequest { path: format!("{path} (container)"), extents: extents.to_vec() };
        self.0.lock(1, req).map_err(|e| e.message)
    }

    fn release(&self, id: u64) {
        if let Err(e) = self.0.unlock(1, id) {
            eprintln!("insitu-target: releasing a container's fence {id:#x}: {}", e.message);
        }
    }
}

/// Refreshes the containers' view of namespace 1 when a lock there changes.
struct ViewRefresh(std::sync::Arc<insitu_isp::runtime::Runtime>);

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
                eprintln!("insitu-target: refreshing the view of namespace 1 after a lock on {path:?}: {e}");
            }
        }
    }
}

fn daemon_child(serving: Serving, mut ready: std::io::PipeWriter) -> ! {
    // SAFETY: setsid has no memory arguments.
    unsafe { libc::setsid() };
    ignore_sigpipe();
    let to_log = |server: &Server| {
        let log = log_file(&server.local_addr());
        if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto the standard descriptors of this (child) process.
            unsafe {
                libc::dup2(f.as_raw_fd(), 1);
                libc::dup2(f.as_raw_fd(), 2);
            }
        }
    };
    let server = match serving.assemble_then(to_log) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("insitu-target: {}", e.message);
            let _ = write!(ready, "error {}", e.message);
            // SAFETY: leave without running the parent's atexit handlers (it may be Python).
            unsafe { libc::_exit(1) }
        }
    };
    let listen = server.local_addr();
    eprintln!("insitu-target: serving on nvme-tcp://{listen}");
    let _ = write!(ready, "ready {listen}");
    drop(ready);
    let code = i32::from(server.run().is_err());
    // SAFETY: as above.
    unsafe { libc::_exit(code) }
}

fn alive(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid/kill with no memory arguments but a local out-parameter.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 || (libc::kill(pid, 0) == 0 && libc::waitpid(pid, &mut status, libc::WNOHANG) <= 0) }
}

/// Serves `GET /metrics` in the Prometheus text format on `addr`.
fn serve_metrics(addr: SocketAddr, metrics: std::sync::Arc<insitu_nvmf::Metrics>) -> Result<(), Failure> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("metrics on {addr}: {e}"))?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer_http(stream, &metrics);
        }
    });
    Ok(())
}

/// Reads one request head (at most 8 KiB) and answers it: only `GET /metrics` exists.
fn answer_http(mut s: TcpStream, metrics: &insitu_nvmf::Metrics) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (code, body) = match route(&head) {
        Some(()) => ("200 OK", metrics.render()),
        None => ("404 Not Found", "only GET /metrics is served\n".to_string()),
    };
    write!(s, "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

/// Whether a request head asks for the metrics.
pub(crate) fn route(head: &[u8]) -> Option<()> {
    let line = head.split(|b| *b == b'\n').next()?;
    let mut parts = line.split(|b| *b == b' ');
    let (method, path) = (parts.next()?, parts.next()?);
    (method == b"GET" && (path == b"/metrics" || path.starts_with(b"/metrics?"))).then_some(())
}

pub(crate) fn stop(listen: SocketAddr, json_out: bool) -> Result<i32, Failure> {
    let file = pid_file(&listen);
    let rec: serde_json::Value = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("no target started by insitu listens on {listen} (no {})", file.display()))?;
    let pid = rec["pid"].as_i64().unwrap_or(0) as i32;
    if pid > 0 {
        // SAFETY: kill(2) with no memory arguments.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: as above.
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let _ = std::fs::remove_file(&file);
    if json_out {
        println!("{}", json!({"stopped": listen.to_string(), "pid": pid}));
    } else {
        println!("stopped the target on {listen} (pid {pid})");
    }
    Ok(0)
}

pub(crate) fn status(json_out: bool) -> Result<i32, Failure> {
    let mut list = Vec::new();
    if let Ok(rd) = std::fs::read_dir(RUN_DIR) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("target-") && name.ends_with(".json")) {
                continue;
            }
            if let Some(mut rec) = std::fs::read_to_string(e.path()).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()) {
                let pid = rec["pid"].as_i64().unwrap_or(0) as i32;
                // SAFETY: kill(2) with signal 0 only checks existence.
                rec["running"] = json!(pid > 0 && unsafe { libc::kill(pid, 0) } == 0);
                list.push(rec);
            }
        }
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"targets": list})).unwrap_or_default());
    } else if list.is_empty() {
        println!("no targets started by insitu");
    } else {
        for r in &list {
            println!("{} {} pid {} {}", r["listen"].as_str().unwrap_or(""), r["nqn"].as_str().unwrap_or(""), r["pid"], if r["running"] == json!(true) { "running" } else { "NOT RUNNING" });
        }
    }
    Ok(0)
}

/// `insitu target fsck`: checks the key-value store's file system; exit 1 with problems.
pub(crate) fn fsck(private: &Path, bytes: u64, json_out: bool) -> Result<i32, Failure> {
    let r = insitu_nvmf::fsck_kv_store(private, bytes)?;
    if json_out {
        println!("{}", json!({"clean": r.is_clean(), "generation": r.generation, "files": r.files, "blocks": r.blocks, "free_blocks": r.free_blocks, "problems": r.problems, "notes": r.notes}));
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

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn only_get_metrics_is_routed() {
        assert!(route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").is_some());
        assert!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").is_some());
        assert!(route(b"POST /metrics HTTP/1.1\r\n\r\n").is_none());
        assert!(route(b"GET /admin HTTP/1.1\r\n\r\n").is_none());
        assert!(route(b"").is_none());
        assert!(route(b"\xff\xfe").is_none());
    }
}
