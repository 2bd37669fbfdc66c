// SPDX-License-Identifier: Apache-2.0
//! One container: what it was created with ([`CreateSpec`], recorded as [`Meta`]), where
//! it is in its life ([`RunState`]), and the bookkeeping of its runs: the log and the
//! clients attached to its output, its standard input and terminal, the exits `wait`
//! watches, and what the current run holds (writable files, published ports, a layer of
//! the sharable view). The [`Runtime`](super::Runtime) drives the transitions; this
//! module only records them.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};

use super::console::Pty;
use super::options::Options;
use super::ports::{self, NetworkMode, PortBinding, Published};
use super::view;
use super::RuntimeError;

/// What `docker create` asks for (the parts the runtime honours).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CreateSpec {
    /// The image, as the user named it.
    pub image: String,
    /// Command (replaces the image's).
    pub cmd: Option<Vec<String>>,
    /// Entrypoint (replaces the image's).
    pub entrypoint: Option<Vec<String>>,
    /// Environment additions, `NAME=value`.
    pub env: Vec<String>,
    /// Working directory.
    pub working_dir: Option<String>,
    /// Whether a terminal was asked for (`-t`).
    pub tty: bool,
    /// Whether standard input stays open (`-i`).
    pub open_stdin: bool,
    /// The terminal's first size, (rows, columns), with `tty` (`HostConfig.ConsoleSize`,
    /// which the CLI sends so that the first lines are laid out right before any resize).
    #[serde(default)]
    pub console_size: Option<(u16, u16)>,
    /// `-v` bindings: `SRC:DST[:ro|rw]`.
    pub binds: Vec<String>,
    /// `--cpus`.
    pub cpus: Option<f64>,
    /// `--memory`, bytes.
    pub memory: Option<i64>,
    /// `--rm`.
    pub auto_remove: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `--network`.
    #[serde(default)]
    pub network: NetworkMode,
    /// `NetworkingConfig.EndpointsConfig` by network name as given (with `--network
    /// NAME`, that network's at least): the user-defined ones are joined at create, the
    /// predefined ones' settings are shown by inspect.
    #[serde(default)]
    pub endpoints: BTreeMap<String, super::networks::EndpointConfig>,
    /// `-p`: the ports to publish.
    #[serde(default)]
    pub ports: Vec<PortBinding>,
    /// `ExposedPorts` (`--expose`, and those of `-p`).
    #[serde(default)]
    pub exposed: Vec<ports::PortKey>,
    /// The volumes made for `Config.Volumes` mount points not bound otherwise; removed
    /// with the container by `rm -v`, or when it was started with `--rm`.
    #[serde(default)]
    pub anonymous_volumes: Vec<String>,
    /// `HostConfig.Links`: the containers this one is linked to (see
    /// [`links`](super::links)).
    #[serde(default)]
    pub links: Vec<super::links::LegacyLink>,
    /// `HostConfig.VolumesFrom`: `CONTAINER[:ro|:rw]` whose volumes and binds this one
    /// binds too (resolved into `binds` at create).
    #[serde(default)]
    pub volumes_from: Vec<String>,
    /// `Config.Healthcheck`: the check run while the container runs.
    #[serde(default)]
    pub health: Option<super::health::HealthSpec>,
    /// The other options honoured (user, restart policy, finer limits, tmpfs, ...).
    #[serde(default)]
    pub options: Options,
    /// The request's `Config` fields as given, for `inspect` to answer back.
    #[serde(default)]
    pub config: serde_json::Value,
    /// The request's `HostConfig` as given, for `inspect` to answer back.
    #[serde(default)]
    pub host_config: serde_json::Value,
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Made, never started.
    Created,
    /// Its process runs.
    Running {
        /// When it started.
        started: SystemTime,
        /// The supervisor's pid on the target.
        pid: i32,
    },
    /// Its last process ended.
    Exited {
        /// Exit code (128 + signal when killed).
        code: i32,
        /// When that run started, if known.
        started: Option<SystemTime>,
        /// When it ended.
        finished: SystemTime,
    },
}

/// What `wait` watches.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExitEvent {
    /// How many runs have ended.
    pub exits: u64,
    /// The last exit code.
    pub code: i32,
    /// Whether the container is gone.
    pub removed: bool,
}

/// A container's record in the private namespace (`meta.json` in its directory), from
/// which a restarted target lists it again.
#[derive(Serialize, Deserialize)]
pub(super) struct Meta {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) image_id: String,
    /// Seconds since the epoch.
    pub(super) created: u64,
    pub(super) spec: CreateSpec,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<String>,
    pub(super) cwd: String,
    /// The entrypoint and command as the container runs them (the image's where the
    /// request gave none).
    #[serde(default)]
    pub(super) entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub(super) cmd: Option<Vec<String>>,
}

impl Meta {
    /// Writes the record into the container's directory `dir`, whole or not at all.
    pub(super) fn write(&self, dir: &std::path::Path) -> Result<(), super::RuntimeError> {
        let tmp = dir.join("meta.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(self).unwrap_or_default()).map_err(|e| super::RuntimeError::io(&tmp, e))?;
        std::fs::rename(&tmp, dir.join("meta.json")).map_err(|e| super::RuntimeError::io(dir, e))
    }
}

/// One container.
pub struct Container {
    /// 64 hex digits.
    pub id: String,
    /// Its name, without the leading `/` (`rename` changes it).
    name_cell: Mutex<String>,
    /// The image's id.
    pub image_id: String,
    /// What it was created with.
    pub spec: CreateSpec,
    /// The process's argv (entrypoint + command).
    pub args: Vec<String>,
    /// The process's environment.
    pub env: Vec<String>,
    /// The process's working directory.
    pub cwd: String,
    /// The entrypoint it runs (the request's, else the image's).
    pub entrypoint: Option<Vec<String>>,
    /// The command it runs (the request's, else the image's when the entrypoint is too).
    pub cmd: Option<Vec<String>>,
    /// Creation time.
    pub created: SystemTime,
    /// Its directory in the private namespace: record, log, exit code, runc bundle.
    pub(super) dir: PathBuf,
    /// The image's layers, lowest first (empty when the image is gone).
    pub(super) layers: Vec<PathBuf>,
    inner: Mutex<Inner>,
    /// Held while the root file system is mounted or unmounted, or used by `docker cp`.
    fs: Mutex<()>,
    pub(super) exits: watch::Sender<ExitEvent>,
}

/// A container's state that changes, under one lock.
pub(super) struct Inner {
    pub(super) state: RunState,
    /// Clients attached to the current run's output.
    subscribers: Vec<mpsc::UnboundedSender<(u8, Bytes)>>,
    stdin_tx: Option<mpsc::UnboundedSender<Bytes>>,
    stdin_rx: Option<mpsc::UnboundedReceiver<Bytes>>,
    /// The running process's terminal (TTY containers only).
    console: Option<Arc<Pty>>,
    pub(super) restarts: u32,
    /// Writable files of the sharable namespace the current run holds.
    pub(super) held: Vec<HeldFile>,
    /// The current run's published ports.
    pub(super) proxy: Option<ports::Proxy>,
    /// The layer of the sharable view the current run's `/data` copies.
    pub(super) view_pin: Option<view::ViewPin>,
    /// Whether a client stopped the current run (stop, kill, rm): the restart policy then
    /// leaves it stopped.
    pub(super) stopped_by_client: bool,
    /// Whether the current run is frozen (`pause`).
    pub(super) paused: bool,
    /// Whether the restart policy is about to start it again.
    pub(super) restarting: bool,
    /// Why the last start failed ("" when it did not).
    pub(super) error: String,
    /// What `update` changed of the `HostConfig` since create (kept in `updates.json`).
    pub(super) updates: serde_json::Map<String, serde_json::Value>,
    /// The ids of the container's execs.
    pub(super) execs: Vec<String>,
}

/// A writable file held by a run: its entry in
/// [`WritableFiles`](super::files::WritableFiles) and its fence.
pub(super) struct HeldFile {
    pub(super) ino: u64,
    pub(super) fence: Option<u64>,
}

impl Container {
    /// The container `m` records, with `layers` and its directory `dir`; it has not run.
    pub(super) fn new(m: Meta, layers: Vec<PathBuf>, dir: PathBuf) -> Arc<Container> {
        let updates = std::fs::read(dir.join("updates.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let (stdin_tx, stdin_rx) = if m.spec.open_stdin {
            let (t, r) = mpsc::unbounded_channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        Arc::new(Container {
            id: m.id,
            name_cell: Mutex::new(m.name),
            image_id: m.image_id,
            spec: m.spec,
            args: m.args,
            env: m.env,
            cwd: m.cwd,
            entrypoint: m.entrypoint,
            cmd: m.cmd,
            created: SystemTime::UNIX_EPOCH + Duration::from_secs(m.created),
            dir,
            layers,
            inner: Mutex::new(Inner {
                state: RunState::Created,
                subscribers: Vec::new(),
                stdin_tx,
                stdin_rx,
                console: None,
                restarts: 0,
                held: Vec::new(),
                proxy: None,
                view_pin: None,
                stopped_by_client: false,
                paused: false,
                restarting: false,
                error: String::new(),
                updates,
                execs: Vec::new(),
            }),
            fs: Mutex::new(()),
            exits: watch::channel(ExitEvent::default()).0,
        })
    }

    /// Its name, without the leading `/`.
    pub fn name(&self) -> String {
        self.name_cell.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Renames it and rewrites its record (the runtime checks the name is free).
    pub(super) fn set_name(&self, name: &str) -> Result<(), super::RuntimeError> {
        let old = std::mem::replace(&mut *self.name_cell.lock().unwrap_or_else(|e| e.into_inner()), name.to_string());
        let written = self.write_meta();
        if written.is_err() {
            *self.name_cell.lock().unwrap_or_else(|e| e.into_inner()) = old;
        }
        written
    }

    /// Writes the container's record (`meta.json`), whole or not at all.
    pub(super) fn write_meta(&self) -> Result<(), super::RuntimeError> {
        let m = Meta {
            id: self.id.clone(),
            name: self.name(),
            image_id: self.image_id.clone(),
            created: self.created.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs(),
            spec: self.spec.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
        };
        m.write(&self.dir)
    }

    /// The hold on the root file system's mount (see the field).
    pub(super) fn fs_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.fs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current state.
    pub fn state(&self) -> RunState {
        self.lock().state
    }

    /// The log file (records of lines, see [`super::log`]).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(super::log::LOG_FILE)
    }

    /// The container's writable layer (what it changed of its image).
    pub fn upper_dir(&self) -> PathBuf {
        self.dir.join("upper")
    }

    /// The log's records, its first `len` bytes only (see [`Container::follow_log`]).
    pub fn log_records(&self, len: u64) -> Vec<super::log::Record> {
        super::log::read(&self.dir, len)
    }

    /// A receiver of exit events, for `wait`.
    pub fn exits(&self) -> watch::Receiver<ExitEvent> {
        self.exits.subscribe()
    }

    /// Subscribes to the output of the current or next run: frames of (stream, bytes); the
    /// channel closes when that run ends. `None` when the container is not running and no
    /// run is about to start (a finished container has nothing more to say).
    pub fn subscribe(&self, even_if_stopped: bool) -> Option<mpsc::UnboundedReceiver<(u8, Bytes)>> {
        let mut g = self.lock();
        if !even_if_stopped && !matches!(g.state, RunState::Running { .. }) {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        g.subscribers.push(tx);
        Some(rx)
    }

    /// Takes the container's standard input (once: `docker run -i` / `attach --stdin`).
    /// Dropping the sender closes the process's standard input.
    pub fn take_stdin(&self) -> Option<mpsc::UnboundedSender<Bytes>> {
        self.lock().stdin_tx.take()
    }

    /// Sets the window size of the container's terminal (`docker run -t`, resize).
    ///
    /// Without a terminal there is nothing to resize and this does nothing, as with
    /// Docker; a TTY container that is not running is a conflict.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        if !self.spec.tty {
            return Ok(());
        }
        let console = self.lock().console.clone();
        let Some(pty) = console else {
            return Err(RuntimeError::Conflict(format!("cannot resize the terminal of container {}: it is not running", &self.id[..12])));
        };
        pty.resize(rows, cols).map_err(|e| RuntimeError::Setup(format!("resizing the terminal of container {}: {e}", &self.id[..12])))
    }

    /// Sets (at start) or clears the running process's terminal.
    pub(super) fn set_console(&self, pty: Option<Arc<Pty>>) {
        self.lock().console = pty;
    }

    /// Takes the receiving end of standard input, for the run that starts.
    pub(super) fn take_stdin_rx(&self) -> Option<mpsc::UnboundedReceiver<Bytes>> {
        self.lock().stdin_rx.take()
    }

    /// The state that changes; a poisoned lock is taken all the same.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new state (the runtime drives the transitions).
    pub(super) fn set_state(&self, s: RunState) {
        self.lock().state = s;
    }

    /// Appends a frame of the running process's output to the log and sends it to every
    /// attached client (those that went away are dropped).
    pub(super) fn output(&self, stream: u8, data: Bytes) {
        use std::io::Write;
        // Under the lock, so a follower sees each frame once: in the file or on its channel.
        let mut g = self.lock();
        if !self.log_discarded() {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()) {
                let _ = f.write_all(&super::log::encode(stream, &data, SystemTime::now()));
                if let Some(r) = self.log_rotation() {
                    let _ = r.enforce(&self.log_path());
                }
            }
        }
        g.subscribers.retain(|s| s.send((stream, data.clone())).is_ok());
    }

    /// The log's `max-size`/`max-file`, if given (checked at create).
    fn log_rotation(&self) -> Option<super::log::Rotation> {
        let c = self.spec.host_config.pointer("/LogConfig/Config").and_then(serde_json::Value::as_object)?;
        super::log::Rotation::parse(c).ok().flatten()
    }

    /// Whether the container's output is kept in no log (`--log-driver none`): attached
    /// clients still get it.
    pub fn log_discarded(&self) -> bool {
        self.spec.host_config.pointer("/LogConfig/Type").and_then(serde_json::Value::as_str) == Some("none")
    }

    /// For `logs --follow`: the log's length now and, if the container runs, a channel of
    /// what comes after it.
    pub fn follow_log(&self) -> (u64, Option<mpsc::UnboundedReceiver<(u8, Bytes)>>) {
        self.log_and_subscribe(false)
    }

    /// The log's length now and a channel of the output that comes after it: that of the
    /// current run or, with `even_if_stopped`, of the next one (`docker start -a` attaches
    /// before it starts the container).
    pub fn log_and_subscribe(&self, even_if_stopped: bool) -> (u64, Option<mpsc::UnboundedReceiver<(u8, Bytes)>>) {
        let mut g = self.lock();
        let len = std::fs::metadata(self.log_path()).map_or(0, |m| m.len());
        if !even_if_stopped && !matches!(g.state, RunState::Running { .. }) {
            return (len, None);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        g.subscribers.push(tx);
        (len, Some(rx))
    }

    /// Records the end of a run with `code`: the container is Exited, its clients'
    /// channels close, its terminal and view layer go, and `wait` sees one more exit.
    pub(super) fn exited(&self, code: i32) {
        let mut g = self.lock();
        let started = match g.state {
            RunState::Running { started, .. } => Some(started),
            _ => None,
        };
        g.state = RunState::Exited { code, started, finished: SystemTime::now() };
        g.subscribers.clear();
        g.console = None;
        g.view_pin = None;
        g.paused = false;
        // A restart gets a fresh standard input if the container keeps one open.
        if self.spec.open_stdin {
            let (tx, rx) = mpsc::unbounded_channel();
            g.stdin_tx = Some(tx);
            g.stdin_rx = Some(rx);
        }
        drop(g);
        self.exits.send_modify(|e| {
            e.exits += 1;
            e.code = code;
        });
    }

    /// Whether the current run is frozen (`pause`).
    pub fn paused(&self) -> bool {
        self.lock().paused
    }

    /// What `update` changed of the `HostConfig` since create.
    pub fn updates(&self) -> serde_json::Map<String, serde_json::Value> {
        self.lock().updates.clone()
    }

    /// The restart policy: as created, or as last updated.
    pub fn restart_policy(&self) -> super::options::RestartPolicy {
        self.restart_policy_locked(&self.lock())
    }

    /// [`Container::restart_policy`] with the lock held.
    pub(super) fn restart_policy_locked(&self, g: &Inner) -> super::options::RestartPolicy {
        match g.updates.get("RestartPolicy") {
            Some(p) => super::options::RestartPolicy {
                name: p.get("Name").and_then(|n| n.as_str()).filter(|n| *n != "no").unwrap_or("").to_string(),
                max_retries: p.get("MaximumRetryCount").and_then(|n| n.as_i64()).unwrap_or(0),
            },
            None => self.spec.options.restart.clone(),
        }
    }

    /// Records `changes` to the `HostConfig` (merged over earlier ones), on disk first.
    pub(super) fn record_updates(&self, changes: &serde_json::Map<String, serde_json::Value>) -> Result<(), super::RuntimeError> {
        let mut g = self.lock();
        let mut next = g.updates.clone();
        for (k, v) in changes {
            next.insert(k.clone(), v.clone());
        }
        let tmp = self.dir.join("updates.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&next).unwrap_or_default()).map_err(|e| super::RuntimeError::io(&tmp, e))?;
        std::fs::rename(&tmp, self.dir.join("updates.json")).map_err(|e| super::RuntimeError::io(&self.dir, e))?;
        g.updates = next;
        Ok(())
    }

    /// Why the last start failed ("" when it did not).
    pub fn error(&self) -> String {
        self.lock().error.clone()
    }

    /// Whether the restart policy is about to start it again.
    pub fn restarting(&self) -> bool {
        self.lock().restarting
    }

    /// The ids of the container's execs.
    pub fn exec_ids(&self) -> Vec<String> {
        self.lock().execs.clone()
    }

    /// How many times the container was restarted.
    pub fn restarts(&self) -> u32 {
        self.lock().restarts
    }

    /// Where the current run's ports are published (empty when it does not run).
    pub fn published(&self) -> Vec<Published> {
        self.lock().proxy.as_ref().map(|p| p.ports().to_vec()).unwrap_or_default()
    }

    /// Closes the published ports and their connections (at the end of a run).
    pub(crate) fn unpublish(&self) {
        let proxy = self.lock().proxy.take();
        drop(proxy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::STDOUT;

    fn container(dir: &std::path::Path, open_stdin: bool) -> Arc<Container> {
        let spec = CreateSpec { image: "img".into(), open_stdin, ..Default::default() };
        let m = Meta {
            id: "ab".repeat(32),
            name: "c".into(),
            image_id: "i".into(),
            created: 7,
            spec,
            args: vec!["true".into()],
            env: Vec::new(),
            cwd: "/".into(),
            entrypoint: None,
            cmd: None,
        };
        Container::new(m, Vec::new(), dir.to_path_buf())
    }

    #[test]
    fn a_new_container_is_created_and_has_nothing_to_say() {
        let dir = tempfile::tempdir().unwrap();
        let c = container(dir.path(), false);
        assert_eq!(c.state(), RunState::Created);
        assert_eq!(c.created, SystemTime::UNIX_EPOCH + Duration::from_secs(7));
        assert!(c.subscribe(false).is_none(), "not running: no output to follow");
        assert!(c.take_stdin().is_none(), "no -i, no standard input");
        let (len, follow) = c.follow_log();
        assert_eq!(len, 0);
        assert!(follow.is_none());
    }

    #[test]
    fn output_reaches_the_log_and_clients_and_an_exit_closes_them() {
        let dir = tempfile::tempdir().unwrap();
        let c = container(dir.path(), true);
        let mut rx = c.subscribe(true).unwrap();
        c.set_state(RunState::Running { started: SystemTime::now(), pid: 1 });
        c.output(STDOUT, Bytes::from_static(b"hi"));
        assert_eq!(rx.try_recv().unwrap(), (STDOUT, Bytes::from_static(b"hi")));
        assert_eq!(c.log_records(u64::MAX).iter().map(|r| (r.stream, r.line.clone())).collect::<Vec<_>>(), [(STDOUT, b"hi".to_vec())]);
        let stdin = c.take_stdin();
        assert!(stdin.is_some() && c.take_stdin().is_none(), "standard input is taken once");
        let exits = c.exits();
        c.exited(3);
        assert!(matches!(c.state(), RunState::Exited { code: 3, started: Some(_), .. }));
        assert!(rx.try_recv().is_err(), "the run's channel closes with it");
        assert_eq!((exits.borrow().exits, exits.borrow().code, exits.borrow().removed), (1, 3, false));
        assert!(c.take_stdin().is_some(), "a restart gets a fresh standard input");
    }
}
