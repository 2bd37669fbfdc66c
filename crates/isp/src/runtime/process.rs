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
    mount_rootfs(&c.layers, &dir, &rootfs)?;
    let binds = rt.binds(&c.spec)?;
    let short = &c.id[..12];
    let cgroup = format!("/insitu/{}", c.id);
    let config = runtime_config(&SpecInput {
        rootfs: &rootfs,
        args: &c.args,
        env: &c.env,
        cwd: &c.cwd,
        hostname: short,
        binds: &binds,
        cpus: c.spec.cpus.or(rt.limits.cpus),
        memory: c.spec.memory.or(rt.limits.memory),
        pids: rt.limits.pids,
        cgroup: &cgroup,
        tty: c.spec.tty,
        data_read_bps: rt.limits.data_read_bps.zip(rt.view.as_ref().and_then(|v| v.device())).map(|(bps, (major, minor))| (major, minor, bps)),
    });
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(|e| RuntimeError::io(&cfg_path, e))?;
    // runc may still hold a dead container of this id (a crash between runs).
    let _ = Command::new("runc").arg("--root").arg(&rt.runc_root).args(["delete", "--force", &c.id]).output().await;

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
    c.set_state(RunState::Running { started: SystemTime::now(), pid: child.id().unwrap_or(0) as i32 });
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
        let _ = std::fs::write(c3.dir.join("exit-code"), code.to_string());
        let _ = Command::new("runc").arg("--root").arg(&rt3.runc_root).args(["delete", "--force", &c3.id]).output().await;
        let _ = unmount(&c3.dir.join("rootfs"));
        c3.exited(code);
        if c3.spec.auto_remove {
            let _ = rt3.remove(&c3.id, true).await;
        }
    });
    Ok(())
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

fn mount_rootfs(layers: &[std::path::PathBuf], dir: &Path, rootfs: &Path) -> Result<(), RuntimeError> {
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
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        dir.join("upper").display(),
        dir.join("work").display()
    );
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
    let out = Command::new("runc").arg("--root").arg(&rt.runc_root).args(["kill", id, sig]).output().await
        .map_err(|e| RuntimeError::Setup(format!("runc kill: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RuntimeError::BadRequest(format!("cannot send {signal} to container {}: {}", &id[..12.min(id.len())], String::from_utf8_lossy(&out.stderr).trim())))
    }
}
