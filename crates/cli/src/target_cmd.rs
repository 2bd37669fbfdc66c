// SPDX-License-Identifier: Apache-2.0
//! `insitu target start|stop|status|fsck`: the target is assembled and run by
//! `insitu-daemon`; this module turns options into its spec and prints what it did.

use crate::Failure;
use insitu_daemon::TargetSpec;
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;

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
