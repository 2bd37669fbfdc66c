// SPDX-License-Identifier: Apache-2.0
//! One run of a container: the overlayfs root, the runc bundle, `runc run` as the
//! container's supervisor, and the pumps that carry its output to the log and to attached
//! clients and its input from them.
//!
//! The log is a sequence of Docker's multiplexed-stream frames (a stream byte, three zero
//! bytes, a big-endian length, the bytes), so `docker logs` replays it as is.

use bytes::Bytes;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::console::{self, ConsoleSocket};
use super::spec::{runtime_config, SpecInput};
use super::{Container, RunState, Runtime, RuntimeError};

/// Stream numbers of the multiplexed framing.
pub const STDOUT: u8 = 1;
/// Standard error's stream number.
pub const STDERR: u8 = 2;

/// One multiplexed frame.
pub fn frame(stream: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&[stream, 0, 0, 0]);
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Mounts the root file system and starts `runc run`; returns once the process exists.
pub(super) async fn start(rt: &Arc<Runtime>, c: &Arc<Container>) -> Result<(), RuntimeError> {
    let dir = c.dir.clone();
    let rootfs = dir.join("rootfs");
    {
        let _g = c.fs_lock();
        mount_rootfs(&c.layers, &dir, &rootfs)?;
    }
    let mut binds = rt.mounts(c)?;
    let net = rt.network_up(c).inspect_err(|_| {
        let _ = unmount(&rootfs);
    })?;
    let netns = net.netns;
    let link_env = net.env;
    for (file, at) in [(net.hosts, "/etc/hosts"), (net.resolv, "/etc/resolv.conf")] {
        if let Some(f) = file {
            binds.push((f.to_string_lossy().into_owned(), at.into(), false));
        }
    }
    if c.spec.options.init {
        binds.push((super::options::INIT_BINARY.into(), super::options::INIT_PATH.into(), true));
    }
    let short = &c.id[..12];
    let cgroup = format!("/insitu/{}", c.id);
    let user = super::options::resolve_user(&rootfs, c.spec.options.user.as_deref(), &c.spec.options.group_add).map_err(|e| {
        let _ = unmount(&rootfs);
        RuntimeError::BadRequest(format!("container {short}: {e}"))
    })?;
    // A variable given without `=VALUE` is unset, as Docker treats it.
    let env: Vec<String> = c.env.iter().filter(|e| e.contains('=')).cloned().chain(link_env).collect();
    let mut config = runtime_config(&SpecInput {
        rootfs: &rootfs,
        args: &c.args,
        env: &env,
        cwd: &c.cwd,
        hostname: short,
        binds: &binds,
        cpus: c.spec.cpus.or(rt.limits.cpus),
        memory: c.spec.memory.or(rt.limits.memory),
        pids: rt.limits.pids,
        cgroup: &cgroup,
        tty: c.spec.tty,
        console_size: c.spec.console_size,
        host_network: c.spec.network == super::NetworkMode::Host,
        netns: netns.as_deref(),
        data_read_bps: rt.limits.data_read_bps.zip(rt.view.as_ref().and_then(|v| v.device())).map(|(bps, (major, minor))| (major, minor, bps)),
    });
    c.spec.options.apply(&mut config, &user);
    super::update::apply(&c.updates(), &mut config);
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(|e| RuntimeError::io(&cfg_path, e))?;
    // runc may still hold a dead container of this id (a crash between runs).
    let _ = Command::new("runc").arg("--root").arg(&rt.runc_root).args(["delete", "--force", &c.id]).output().await;

    if c.spec.tty {
        return start_with_terminal(rt, c, &dir).await;
    }

    let stdin_rx = c.take_stdin_rx();
    let mut child = Command::new("runc")
        .arg("--root")
        .arg(&rt.runc_root)
        .args(["run", "--bundle"])
        .arg(&dir)
        .arg(&c.id)
        .stdin(if stdin_rx.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| RuntimeError::Setup(format!("runc: {e} (is runc installed?)")))?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    if let (Some(mut rx), Some(mut stdin)) = (stdin_rx, child.stdin.take()) {
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if stdin.write_all(&b).await.is_err() {
                    break;
                }
            }
            let _ = stdin.shutdown().await;
        });
    }
    // `start` answers once the container's process runs: runc has written its state and
    // removed the FIFO its init waits on before it executes the process. What a client
    // does next (exec, pause, a look at its cgroup, a signal, which would otherwise kill
    // runc's init and end the run with runc's own error) then finds it. A process that
    // ends at once ends the wait too.
    let state = rt.runc_root.join(&c.id).join("state.json");
    let fifo = rt.runc_root.join(&c.id).join("exec.fifo");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (!state.exists() || fifo.exists()) && matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    c.set_state(RunState::Running { started: SystemTime::now(), pid: child.id().unwrap_or(0) as i32 });
    rt.network_announce(&c.id);
    let (c1, c2, c3, rt3) = (c.clone(), c.clone(), c.clone(), rt.clone());
    let p1 = tokio::spawn(async move { pump(out, STDOUT, &c1).await });
    let p2 = tokio::spawn(async move { pump(err, STDERR, &c2).await });
    tokio::spawn(async move {
        let _ = p1.await;
        let _ = p2.await;
        let code = match child.wait().await {
            Ok(s) => s.code().unwrap_or_else(|| {
                use std::os::unix::process::ExitStatusExt;
                128 + s.signal().unwrap_or(9)
            }),
            Err(_) => 255,
        };
        finish(&rt3, &c3, code).await;
    });
    Ok(())
}

/// Starts a TTY container: `runc run --detach` with a console socket (see [`console`]).
/// The terminal's master carries the output (one stream, raw, as docker's terminals do)
/// and the input; the process, the target's child once runc exits, is waited for by pid.
async fn start_with_terminal(rt: &Arc<Runtime>, c: &Arc<Container>, dir: &Path) -> Result<(), RuntimeError> {
    let short = &c.id[..12];
    console::become_subreaper()
        .map_err(|e| RuntimeError::Setup(format!("container {short} asks for a terminal, which needs the target to be a child subreaper: {e}")))?;
    // In runc's state directory (a short path: a unix socket's is at most 107 bytes).
    let sock_path = rt.runc_root.join(format!("{short}.console"));
    let sock = ConsoleSocket::bind(&sock_path).map_err(|e| RuntimeError::io(&sock_path, e))?;
    let pid_path = rt.runc_root.join(format!("{short}.pid"));
    let _ = std::fs::remove_file(&pid_path);
    let mut runc = Command::new("runc");
    runc.arg("--root").arg(&rt.runc_root).args(["run", "--detach", "--console-socket"]).arg(sock.path());
    runc.arg("--pid-file").arg(&pid_path).arg("--bundle").arg(dir).arg(&c.id).kill_on_drop(false);
    let (pty, pid) = sock.launch(&mut runc, &pid_path, "runc run").await?;
    let _ = std::fs::remove_file(&pid_path);
    let (pty, pid) = match (pty, pid) {
        (Ok(p), Some(pid)) => (Arc::new(p), pid),
        (pty, _) => {
            // The process may run without a terminal we hold: stop it rather than leave it.
            let _ = Command::new("runc").arg("--root").arg(&rt.runc_root).args(["delete", "--force", &c.id]).output().await;
            let why = pty.err().map_or_else(|| format!("no pid in {}", pid_path.display()), |e| e.to_string());
            return Err(RuntimeError::Setup(format!("container {short}: runc started it but its terminal was not received: {why}")));
        }
    };
    if let Some((rows, cols)) = c.spec.console_size {
        let _ = pty.resize(rows, cols);
    }
    c.set_console(Some(pty.clone()));
    if let Some(mut rx) = c.take_stdin_rx() {
        let input = pty.clone();
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if input.write_all(&b).await.is_err() {
                    break;
                }
            }
            // A terminal has no end of input to give: the client's closing its standard
            // input leaves the terminal open (the user types ^D to end input, as on any
            // terminal), as with docker.
        });
    }
    c.set_state(RunState::Running { started: SystemTime::now(), pid });
    rt.network_announce(&c.id);
    let (c1, c2, rt2) = (c.clone(), c.clone(), rt.clone());
    let output = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match pty.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => c1.output(STDOUT, Bytes::copy_from_slice(&buf[..n])),
            }
        }
    });
    tokio::spawn(async move {
        let code = tokio::task::spawn_blocking(move || console::wait_exit(pid)).await.ok().and_then(Result::ok).unwrap_or(255);
        // The terminal reads as ended once the container's last process is gone (the pid
        // namespace ends with its first process); the bound is for a kernel that lags.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), output).await;
        finish(&rt2, &c2, code).await;
    });
    Ok(())
}

/// After a run: the exit code kept, runc's record and the root file system gone, waiters
/// told, and the container removed if it was started with `--rm`.
async fn finish(rt: &Arc<Runtime>, c: &Arc<Container>, code: i32) {
    let _ = std::fs::write(c.dir.join("exit-code"), code.to_string());
    let _ = Command::new("runc").arg("--root").arg(&rt.runc_root).args(["delete", "--force", &c.id]).output().await;
    {
        let _g = c.fs_lock();
        let _ = unmount(&c.dir.join("rootfs"));
    }
    // Before waiters hear of the exit: once `docker wait` returns, the host may take its
    // files back.
    rt.release_files(c);
    c.unpublish();
    rt.network_down(&c.id);
    let again = {
        let g = c.lock();
        let policy = c.restart_policy_locked(&g);
        !g.stopped_by_client && policy.restarts_after(code, g.restarts)
    };
    c.exited(code);
    rt.container_event(c, "die", &[("exitCode", code.to_string())]);
    if c.spec.auto_remove {
        if rt.remove(&c.id, true).await.is_ok() {
            rt.remove_anonymous_volumes(c);
        }
    } else if again {
        supervise(rt, c);
    }
}

/// Starts a container again after its run ended, as its restart policy asks, after a
/// pause that doubles with each restart (from 100 ms, at most a minute), as Docker's
/// supervisor does; a client that starts, stops or removes it meanwhile wins.
fn supervise(rt: &Arc<Runtime>, c: &Arc<Container>) {
    let (rt, c) = (rt.clone(), c.clone());
    let restarts = {
        let mut g = c.lock();
        g.restarting = true;
        g.restarts
    };
    let delay = std::time::Duration::from_millis(100u64.saturating_mul(1 << restarts.min(10)).min(60_000));
    let exits = c.exits.borrow().exits;
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let unchanged = c.exits.borrow().exits == exits && !c.exits.borrow().removed;
        let go = {
            let mut g = c.lock();
            let go = g.restarting && unchanged && matches!(g.state, RunState::Exited { .. }) && !g.stopped_by_client;
            // Still restarting until `start` has it running (it clears the flag).
            if go {
                g.restarts += 1;
            } else {
                g.restarting = false;
            }
            go
        };
        if go && rt.start(&c.id).await.is_err() {
            c.lock().restarting = false;
        }
    });
}

async fn pump(mut r: impl tokio::io::AsyncRead + Unpin, stream: u8, c: &Container) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => c.output(stream, Bytes::copy_from_slice(&buf[..n])),
        }
    }
}

pub(super) fn mount_rootfs(layers: &[std::path::PathBuf], dir: &Path, rootfs: &Path) -> Result<(), RuntimeError> {
    for d in ["upper", "work", "rootfs"] {
        let p = dir.join(d);
        std::fs::create_dir_all(&p).map_err(|e| RuntimeError::io(&p, e))?;
    }
    if super::view::is_mount_point(rootfs) {
        return Ok(());
    }
    // overlayfs wants the top layer first.
    let lower: Vec<String> = if layers.is_empty() {
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).map_err(|e| RuntimeError::io(&empty, e))?;
        vec![empty.to_string_lossy().into_owned()]
    } else {
        layers.iter().rev().map(|p| p.to_string_lossy().into_owned()).collect()
    };
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.join(":"), dir.join("upper").display(), dir.join("work").display());
    let out = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(rootfs)
        .output()
        .map_err(|e| RuntimeError::Setup(format!("mount: {e}")))?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!("overlay root file system: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

/// Unmounts a container's root file system if mounted.
pub(super) fn unmount(rootfs: &Path) -> Result<(), RuntimeError> {
    if super::view::is_mount_point(rootfs) {
        let out = std::process::Command::new("umount").arg("-l").arg(rootfs).output().map_err(|e| RuntimeError::Setup(format!("umount: {e}")))?;
        if !out.status.success() {
            return Err(RuntimeError::Setup(format!("umount {}: {}", rootfs.display(), String::from_utf8_lossy(&out.stderr).trim())));
        }
    }
    Ok(())
}

/// Sends `signal` (a name like `TERM` or `SIGKILL`, or a number) to a running container.
pub(super) async fn signal(rt: &Runtime, id: &str, signal: &str) -> Result<(), RuntimeError> {
    let sig = signal.trim_start_matches("SIG");
    let out = Command::new("runc")
        .arg("--root")
        .arg(&rt.runc_root)
        .args(["kill", id, sig])
        .output()
        .await
        .map_err(|e| RuntimeError::Setup(format!("runc kill: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RuntimeError::BadRequest(format!("cannot send {signal} to container {}: {}", &id[..12.min(id.len())], String::from_utf8_lossy(&out.stderr).trim())))
    }
}
