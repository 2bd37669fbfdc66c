// SPDX-License-Identifier: Apache-2.0
//! A process as a daemon: the one place insitu forks a service (a target, an Ether-oN
//! bridge, an attachment's file system) away from the command that starts it.
//!
//! [`spawn`] forks. The child starts a session of its own (a terminal's hang-up does not
//! reach it) and runs the given function, which sets the service up in the child, so every
//! thread it starts lives where it serves (`fork` copies only the calling thread), then
//! reports over a pipe with [`Ready`]: [`Ready::ok`] once it serves, [`Ready::fail`] with
//! the reason otherwise. The parent waits for that report ([`Spawned::wait`]) or goes on at
//! once. [`to_log`] sends the child's output to its log file.
#![deny(missing_docs)]

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{dup2, fork, setsid, ForkResult, Pid};

/// The child's side of the report.
pub struct Ready(std::io::PipeWriter);

impl Ready {
    /// The service is up; `detail` reaches the parent (an address, a URL).
    pub fn ok(mut self, detail: &str) {
        let _ = write!(self.0, "ready {detail}");
    }

    /// The service could not start, because of `why`.
    pub fn fail(mut self, why: &str) {
        let _ = write!(self.0, "error {why}");
    }
}

/// A forked daemon, seen from the process that started it.
pub struct Spawned {
    /// Its process ID.
    pub pid: i32,
    report: std::io::PipeReader,
}

impl Spawned {
    /// Waits for the daemon's report: what it gave [`Ready::ok`], or the reason it failed
    /// (what it gave [`Ready::fail`], or `silent` when it exited without a word), once it
    /// has been reaped.
    pub fn wait(mut self, silent: &str) -> Result<String, String> {
        let mut report = String::new();
        let _ = self.report.read_to_string(&mut report);
        match report.strip_prefix("ready ") {
            Some(detail) => Ok(detail.trim().to_string()),
            None => {
                let _ = waitpid(Pid::from_raw(self.pid), None);
                let why = report.strip_prefix("error ").map(str::trim).filter(|w| !w.is_empty()).unwrap_or(silent);
                Err(why.to_string())
            }
        }
    }
}

/// Forks a daemon that runs `service` in a session of its own and exits with the code it
/// returns (without running the parent's exit handlers: the parent may be Python).
///
/// Call it before this process starts any thread the service needs: only the calling
/// thread exists in the child.
pub fn spawn(service: impl FnOnce(Ready) -> i32) -> Result<Spawned, String> {
    let (report, ready) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the child runs only `service`, which sets itself up from scratch; the caller
    // forks before starting threads the child would need.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(report);
            let _ = setsid();
            let code = service(Ready(ready));
            // SAFETY: _exit ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => Ok(Spawned { pid: child.as_raw(), report }),
    }
}

/// Appends this process's standard output and error to `log` (created when missing).
pub fn to_log(log: &Path) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    dup2(f.as_raw_fd(), 1)?;
    dup2(f.as_raw_fd(), 2)?;
    Ok(())
}

/// Whether process `pid` is still running; a child of this process that has exited is
/// reaped here.
pub fn alive(pid: i32) -> bool {
    match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => true,
        Ok(_) => false,
        // Not our child: ask whether it exists.
        Err(_) => kill(Pid::from_raw(pid), None).is_ok(),
    }
}

/// Waits up to `patience` for `pid` to end; true if it did.
pub fn wait_gone(pid: i32, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Asks `pid` to stop (SIGTERM) and waits up to `patience`; true if it ended.
pub fn terminate(pid: i32, patience: Duration) -> bool {
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    wait_gone(pid, patience)
}

/// Ends `pid` at once (SIGKILL), reaping it if it is a child of this process.
pub fn force(pid: i32) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    wait_gone(pid, Duration::from_secs(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_hears_ready_or_why_not() {
        let up = spawn(|r| {
            r.ok("127.0.0.1:4420");
            0
        })
        .unwrap();
        assert_eq!(up.wait("silent"), Ok("127.0.0.1:4420".to_string()));
        let failed = spawn(|r| {
            r.fail("no such image");
            1
        })
        .unwrap();
        assert_eq!(failed.wait("silent"), Err("no such image".to_string()));
        let silent = spawn(|_| 3).unwrap();
        assert_eq!(silent.wait("it exited"), Err("it exited".to_string()));
    }

    #[test]
    fn a_daemon_that_ignores_nothing_is_terminated_and_reaped() {
        let d = spawn(|r| {
            r.ok("");
            std::thread::sleep(Duration::from_secs(60));
            0
        })
        .unwrap();
        let pid = d.pid;
        assert_eq!(d.wait("silent"), Ok(String::new()));
        assert!(alive(pid));
        assert!(!wait_gone(pid, Duration::from_millis(50)));
        assert!(terminate(pid, Duration::from_secs(5)));
        assert!(!alive(pid));
    }

    #[test]
    fn output_goes_to_the_log() {
        let dir = std::env::temp_dir().join(format!("insitu-detach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("d.log");
        let d = spawn(|r| {
            if to_log(&log).is_err() {
                return 2;
            }
            // Not println!: the test harness captures that, above the descriptors.
            let _ = std::io::stdout().write_all(b"hello from the daemon\n");
            let _ = std::io::stdout().flush();
            r.ok("");
            0
        })
        .unwrap();
        assert_eq!(d.wait("silent"), Ok(String::new()));
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(text, "hello from the daemon\n");
    }
}
