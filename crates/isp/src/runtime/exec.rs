// SPDX-License-Identifier: Apache-2.0
//! `docker exec`: another process in a running container, made by `runc exec`, so it
//! joins the container's namespaces and cgroup under the container's own seccomp
//! profile, capabilities and no-new-privileges (its process description is the
//! container's, with the exec's command, environment, directory, user and terminal).
//!
//! Without a terminal `runc exec` stays the process's parent and its exit status is the
//! process's; its standard streams are piped. With one, runc hands the terminal over the
//! console socket and leaves (`--detach`); the target, a child subreaper, reaps the
//! process by pid as it does a TTY container's first process.

use bytes::Bytes;
use serde_json::{json, Value};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

use super::console::{self, ConsoleSocket, Pty};
use super::options::resolve_user;
use super::{Container, RunState, Runtime, RuntimeError, STDERR, STDOUT};

/// What `POST /containers/{id}/exec` asks for.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// argv.
    pub cmd: Vec<String>,
    /// Environment added to the container's, `NAME=value`.
    pub env: Vec<String>,
    /// Working directory (the container's when `None`).
    pub working_dir: Option<String>,
    /// `user[:group]` (the container's when `None`).
    pub user: Option<String>,
    /// Whether the process gets a terminal.
    pub tty: bool,
    /// Whether the client's input reaches the process.
    pub attach_stdin: bool,
    /// Whether standard output goes to the client.
    pub attach_stdout: bool,
    /// Whether standard error goes to the client.
    pub attach_stderr: bool,
    /// The terminal's first size, (rows, columns).
    pub console_size: Option<(u16, u16)>,
    /// The detach sequence, as given (checked by the API).
    pub detach_keys: String,
}

/// Where an exec is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    /// Made, not started.
    Created,
    /// Its process runs.
    Running {
        /// Its pid on the target (runc's, without a terminal).
        pid: i32,
    },
    /// Its process ended.
    Exited {
        /// Its exit code.
        code: i32,
    },
}

/// One exec of a container.
pub struct Exec {
    /// 64 hex digits.
    pub id: String,
    /// The container's id.
    pub container_id: String,
    /// What was asked for.
    pub spec: ExecSpec,
    state: watch::Sender<ExecState>,
    pty: Mutex<Option<Arc<Pty>>>,
}

/// The streams of a started exec: its output as (stream, bytes) until it ends, and its
/// input when asked for (dropped, it closes the process's standard input; a terminal's
/// input stays open until the process ends, as on any terminal).
pub struct ExecIo {
    /// Output frames; the channel closes when the process has ended.
    pub output: mpsc::UnboundedReceiver<(u8, Bytes)>,
    /// Input for the process.
    pub input: Option<mpsc::UnboundedSender<Bytes>>,
}

impl Exec {
    /// The current state.
    pub fn state(&self) -> ExecState {
        *self.state.borrow()
    }

    /// A receiver of the state, to wait for the end.
    pub fn watch(&self) -> watch::Receiver<ExecState> {
        self.state.subscribe()
    }

    /// Sets the window size of the exec's terminal.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        if !self.spec.tty {
            return Ok(());
        }
        let pty = self.pty.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match pty {
            Some(p) => p.resize(rows, cols).map_err(|e| RuntimeError::Setup(format!("resizing the terminal of exec {}: {e}", &self.id[..12]))),
            None => Err(RuntimeError::Conflict(format!("exec {} is not running", &self.id[..12]))),
        }
    }
}

/// The exit code of an exec whose runc ended with `code` and standard error `err_tail`:
/// when runc could not start the process, 127 for a command not found and 126 for one
/// that cannot be run, as Docker's shells and daemon answer.
fn start_failure_code(code: i32, err_tail: &[u8]) -> i32 {
    let text = String::from_utf8_lossy(err_tail);
    if code != 255 || !text.contains("unable to start container process") {
        return code;
    }
    if text.contains("executable file not found") || text.contains("no such file or directory") {
        127
    } else {
        126
    }
}

impl Runtime {
    /// `docker exec` (create): records an exec of a running container.
    pub fn exec_create(&self, key: &str, spec: ExecSpec) -> Result<Arc<Exec>, RuntimeError> {
        let c = self.get(key)?;
        if !matches!(c.state(), RunState::Running { .. }) {
            return Err(RuntimeError::Conflict(format!("container {} is not running", &c.id[..12])));
        }
        if c.paused() {
            return Err(RuntimeError::Conflict(format!("container {} is paused, unpause the container before exec", &c.id[..12])));
        }
        if spec.cmd.is_empty() {
            return Err(RuntimeError::BadRequest("No exec command specified".into()));
        }
        let id = super::random_id();
        let e = Arc::new(Exec { id: id.clone(), container_id: c.id.clone(), spec, state: watch::channel(ExecState::Created).0, pty: Mutex::new(None) });
        c.lock().execs.push(id.clone());
        self.container_event(&c, &format!("exec_create: {}", e.spec.cmd.join(" ")), &[("execID", id.clone())]);
        let mut all = self.execs.lock().unwrap_or_else(|e| e.into_inner());
        // Execs of removed containers go with them; the rest are kept for inspect.
        all.retain(|_, x| self.get(&x.container_id).is_ok());
        all.insert(id, e.clone());
        Ok(e)
    }

    /// An exec by id or unique id prefix.
    pub fn exec_get(&self, key: &str) -> Result<Arc<Exec>, RuntimeError> {
        let all = self.execs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = all.get(key) {
            return Ok(e.clone());
        }
        let hits: Vec<_> = if key.len() >= 4 { all.values().filter(|e| e.id.starts_with(key)).collect() } else { Vec::new() };
        match hits.as_slice() {
            [one] => Ok((*one).clone()),
            _ => Err(RuntimeError::NotFound(format!("exec instance {key}"))),
        }
    }

    /// Starts an exec's process; its streams come back.
    pub async fn exec_start(&self, e: &Arc<Exec>) -> Result<ExecIo, RuntimeError> {
        if e.state() != ExecState::Created {
            return Err(RuntimeError::Conflict(format!("exec {} has already been started", &e.id[..12])));
        }
        let c = self.get(&e.container_id)?;
        if !matches!(c.state(), RunState::Running { .. }) {
            return Err(RuntimeError::Conflict(format!("container {} is not running", &c.id[..12])));
        }
        let dir = self.runc_root.join(format!("exec-{}", &e.id[..16]));
        std::fs::create_dir_all(&dir).map_err(|err| RuntimeError::io(&dir, err))?;
        let started = self.spawn_exec(&c, e, &dir).await;
        if started.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            self.container_event(&c, &format!("exec_start: {}", e.spec.cmd.join(" ")), &[("execID", e.id.clone())]);
        }
        started
    }

    async fn spawn_exec(&self, c: &Container, e: &Arc<Exec>, dir: &std::path::Path) -> Result<ExecIo, RuntimeError> {
        let process = exec_process(c, &e.spec)?;
        let proc_path = dir.join("process.json");
        std::fs::write(&proc_path, serde_json::to_vec(&process).unwrap_or_default()).map_err(|err| RuntimeError::io(&proc_path, err))?;
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(&self.runc_root).arg("exec").arg("--process").arg(&proc_path);
        if e.spec.tty {
            return self.spawn_exec_tty(c, e, dir, cmd, out_tx, out_rx).await;
        }
        let mut child = cmd
            .arg(&c.id)
            .stdin(if e.spec.attach_stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false)
            .spawn()
            .map_err(|err| RuntimeError::Setup(format!("runc exec: {err}")))?;
        let input = child.stdin.take().map(|mut stdin| {
            let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
            tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if stdin.write_all(&b).await.is_err() {
                        break;
                    }
                }
                let _ = stdin.shutdown().await;
            });
            tx
        });
        // runc's own error, when it cannot start the process, ends standard error.
        let err_tail = Arc::new(Mutex::new(Vec::new()));
        let pumps: Vec<_> = [
            (child.stdout.take().map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>), STDOUT),
            (child.stderr.take().map(|o| Box::new(o) as _), STDERR),
        ]
        .into_iter()
        .filter_map(|(r, s)| r.map(|r| (r, s)))
        .map(|(mut r, s)| {
            let tx = out_tx.clone();
            let err_tail = err_tail.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match r.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s == STDERR {
                                let mut t = err_tail.lock().unwrap_or_else(|e| e.into_inner());
                                t.extend_from_slice(&buf[..n]);
                                let cut = t.len().saturating_sub(1024);
                                t.drain(..cut);
                            }
                            let _ = tx.send((s, Bytes::copy_from_slice(&buf[..n])));
                        }
                    }
                }
            })
        })
        .collect();
        drop(out_tx);
        e.state.send_replace(ExecState::Running { pid: child.id().unwrap_or(0) as i32 });
        let (e2, dir) = (e.clone(), dir.to_path_buf());
        tokio::spawn(async move {
            for p in pumps {
                let _ = p.await;
            }
            let code = match child.wait().await {
                Ok(s) => s.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + s.signal().unwrap_or(9)
                }),
                Err(_) => 126,
            };
            let code = start_failure_code(code, &err_tail.lock().unwrap_or_else(|e| e.into_inner()));
            let _ = std::fs::remove_dir_all(&dir);
            e2.state.send_replace(ExecState::Exited { code });
        });
        Ok(ExecIo { output: out_rx, input })
    }

    async fn spawn_exec_tty(
        &self,
        c: &Container,
        e: &Arc<Exec>,
        dir: &std::path::Path,
        mut cmd: Command,
        out_tx: mpsc::UnboundedSender<(u8, Bytes)>,
        out_rx: mpsc::UnboundedReceiver<(u8, Bytes)>,
    ) -> Result<ExecIo, RuntimeError> {
        console::become_subreaper().map_err(|err| RuntimeError::Setup(format!("an exec with a terminal needs the target to be a child subreaper: {err}")))?;
        // A short path: a unix socket's is at most 107 bytes.
        let sock_path = self.runc_root.join(format!("x{}.console", &e.id[..12]));
        let sock = ConsoleSocket::bind(&sock_path).map_err(|err| RuntimeError::io(&sock_path, err))?;
        let pid_path = dir.join("pid");
        cmd.args(["--tty", "--detach", "--console-socket"]).arg(sock.path()).arg("--pid-file").arg(&pid_path).arg(&c.id);
        let (pty, pid) = sock.launch(&mut cmd, &pid_path, "runc exec").await?;
        let (pty, pid) = match (pty, pid) {
            (Ok(p), Some(pid)) => (Arc::new(p), pid),
            (pty, _) => {
                if let Some(pid) = pid {
                    // SAFETY: kill(2) on a pid runc reported; no memory is touched.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let why = pty.err().map_or_else(|| "no pid".to_string(), |err| err.to_string());
                return Err(RuntimeError::Setup(format!("exec {}: its terminal was not received: {why}", &e.id[..12])));
            }
        };
        if let Some((rows, cols)) = e.spec.console_size {
            let _ = pty.resize(rows, cols);
        }
        *e.pty.lock().unwrap_or_else(|err| err.into_inner()) = Some(pty.clone());
        let input = e.spec.attach_stdin.then(|| {
            let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
            let w = pty.clone();
            tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if w.write_all(&b).await.is_err() {
                        break;
                    }
                }
            });
            tx
        });
        e.state.send_replace(ExecState::Running { pid });
        let reader = pty.clone();
        let output = tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let _ = out_tx.send((STDOUT, Bytes::copy_from_slice(&buf[..n])));
                    }
                }
            }
        });
        let (e2, dir) = (e.clone(), dir.to_path_buf());
        tokio::spawn(async move {
            let code = tokio::task::spawn_blocking(move || console::wait_exit(pid)).await.ok().and_then(Result::ok).unwrap_or(126);
            // The terminal reads as ended once no process holds it; the bound is for a
            // child of the exec that keeps it open.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), output).await;
            *e2.pty.lock().unwrap_or_else(|err| err.into_inner()) = None;
            let _ = std::fs::remove_dir_all(&dir);
            e2.state.send_replace(ExecState::Exited { code });
        });
        Ok(ExecIo { output: out_rx, input })
    }
}

/// The exec's process description: the container's (capabilities, rlimits, no new
/// privileges) with the exec's command, environment, directory, user and terminal.
fn exec_process(c: &Container, spec: &ExecSpec) -> Result<Value, RuntimeError> {
    let cfg_path = c.dir.join("config.json");
    let cfg: Value = std::fs::read(&cfg_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| RuntimeError::Setup(format!("container {}: its runtime configuration is unreadable", &c.id[..12])))?;
    let mut p = cfg["process"].clone();
    let mut env: Vec<String> = c.env.iter().filter(|e| e.contains('=')).cloned().collect();
    for kv in spec.env.iter().filter(|e| e.contains('=')) {
        let key = kv.split('=').next().unwrap_or("");
        env.retain(|x| x.split('=').next() != Some(key));
        env.push(kv.clone());
    }
    if spec.tty && !env.iter().any(|e| e.starts_with("TERM=")) {
        env.push("TERM=xterm".into());
    }
    p["args"] = json!(spec.cmd);
    p["env"] = json!(env);
    p["terminal"] = json!(spec.tty);
    if let Some(obj) = p.as_object_mut() {
        obj.remove("consoleSize");
    }
    if let Some(w) = spec.working_dir.as_deref().filter(|w| !w.is_empty()) {
        if !w.starts_with('/') {
            return Err(RuntimeError::BadRequest(format!("the working directory {w:?} is invalid: it needs to be an absolute path")));
        }
        p["cwd"] = json!(w);
    }
    if let Some(u) = spec.user.as_deref().filter(|u| !u.is_empty()) {
        let user = resolve_user(&c.dir.join("rootfs"), Some(u), &c.spec.options.group_add).map_err(RuntimeError::BadRequest)?;
        p["user"] = json!({"uid": user.uid, "gid": user.gid});
        if !user.additional.is_empty() {
            p["user"]["additionalGids"] = json!(user.additional);
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runcs_start_failures_become_127_and_126() {
        let f = |code, err: &str| super::start_failure_code(code, err.as_bytes());
        let msg = "runc exec failed: unable to start container process: exec: \"x\": executable file not found in $PATH";
        assert_eq!(f(255, msg), 127);
        assert_eq!(f(255, "unable to start container process: exec: \"/etc\": permission denied"), 126);
        assert_eq!(f(255, "the program's own complaint"), 255);
        assert_eq!(f(1, msg), 1);
    }
}
