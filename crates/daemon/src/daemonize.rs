// SPDX-License-Identifier: Apache-2.0
//! A target as a daemon: forked before it is assembled (fork copies only the calling
//! thread, so every thread the target starts must start in the process that serves), in a
//! session of its own, its output in its log. The child reports over a pipe whether it
//! came up, and the parent waits for that.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{dup2, fork, setsid, ForkResult, Pid};

use crate::assemble::Plan;
use crate::{init_logging, log_file, Error};

/// Forks a daemon that assembles and serves `plan`; returns its pid and address once it
/// serves, or the error it reported.
pub(crate) fn spawn(plan: Plan) -> Result<(i32, SocketAddr), Error> {
    let (mut ready_rx, ready_tx) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the command-line process has started no thread of its own: the target is
    // assembled in the child.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(ready_rx);
            child(plan, ready_tx)
        }
        ForkResult::Parent { child } => {
            drop(ready_tx);
            let mut report = String::new();
            let _ = ready_rx.read_to_string(&mut report);
            match report.strip_prefix("ready ").and_then(|a| a.trim().parse().ok()) {
                Some(addr) => Ok((child.as_raw(), addr)),
                None => {
                    let _ = waitpid(child, None);
                    let why = report.strip_prefix("error ").unwrap_or("the daemon exited before it served; run with --foreground to see why");
                    Err(why.trim().to_string().into())
                }
            }
        }
    }
}

fn child(plan: Plan, mut ready: std::io::PipeWriter) -> ! {
    let _ = setsid();
    crate::ignore_sigpipe();
    let to_log = |server: &crate::Target| {
        if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(log_file(&server.local_addr())) {
            let _ = dup2(f.as_raw_fd(), 1);
            let _ = dup2(f.as_raw_fd(), 2);
        }
        init_logging();
    };
    let target = match plan.assemble(to_log) {
        Ok(t) => t,
        Err(e) => {
            // In the log when it got that far (the parent reports it to the user too).
            tracing::error!("{e}");
            let _ = write!(ready, "error {e}");
            // SAFETY: leave without running the parent's atexit handlers (it may be Python).
            unsafe { libc::_exit(1) }
        }
    };
    let listen = target.server.local_addr();
    tracing::info!("serving on nvme-tcp://{listen}");
    let _ = write!(ready, "ready {listen}");
    drop(ready);
    let code = i32::from(target.server.run().is_err());
    // SAFETY: as above.
    unsafe { libc::_exit(code) }
}

/// Whether the daemon `pid` (a child of this process or not) is still running.
pub(crate) fn alive(pid: i32) -> bool {
    match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => true,
        Ok(_) => false,
        // Not our child: ask whether it exists.
        Err(_) => exists(pid),
    }
}

/// Whether a process `pid` exists.
pub(crate) fn exists(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

/// Sends SIGTERM to `pid` and waits up to `patience` for it to end.
pub(crate) fn terminate(pid: i32, patience: Duration) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + patience;
    while exists(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}
