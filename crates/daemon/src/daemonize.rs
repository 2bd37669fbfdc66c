// SPDX-License-Identifier: Apache-2.0
//! A target as a daemon (`insitu_detach`): forked before it is assembled (fork copies only
//! the calling thread, so every thread the target starts must start in the process that
//! serves), its output in its log once it knows its address. It reports whether it came
//! up, and the parent waits for that.

use std::net::SocketAddr;
use std::time::Duration;

use crate::assemble::Plan;
use crate::{init_logging, log_file, Error};

/// Forks a daemon that assembles and serves `plan`; returns its pid and address once it
/// serves, or the error it reported.
pub(crate) fn spawn(plan: Plan) -> Result<(i32, SocketAddr), Error> {
    // The command-line process has started no thread of its own: the target is assembled
    // in the child.
    let d = insitu_detach::spawn(|ready| serve(plan, ready))?;
    let pid = d.pid;
    let addr = d.wait("the daemon exited before it served; run with --foreground to see why")?;
    let addr = addr.parse().map_err(|e| format!("the daemon reported {addr:?}: {e}"))?;
    Ok((pid, addr))
}

/// The daemon: assembles the target, moves its output to the target's log, reports, and
/// serves; returns the exit code.
fn serve(plan: Plan, ready: insitu_detach::Ready) -> i32 {
    crate::ignore_sigpipe();
    let to_log = |server: &crate::Target| {
        let _ = insitu_detach::to_log(&log_file(&server.local_addr()));
        init_logging();
    };
    let target = match plan.assemble(to_log) {
        Ok(t) => t,
        Err(e) => {
            // In the log when it got that far (the parent reports it to the user too).
            tracing::error!("{e}");
            ready.fail(&e.to_string());
            return 1;
        }
    };
    let listen = target.server.local_addr();
    tracing::info!("serving on nvme-tcp://{listen}");
    ready.ok(&listen.to_string());
    i32::from(target.server.run().is_err())
}

/// Whether the daemon `pid` (a child of this process or not) is still running.
pub(crate) fn alive(pid: i32) -> bool {
    insitu_detach::alive(pid)
}

/// Sends SIGTERM to `pid` and waits up to `patience` for it to end.
pub(crate) fn terminate(pid: i32, patience: Duration) {
    insitu_detach::terminate(pid, patience);
}
