// SPDX-License-Identifier: Apache-2.0
//! `insitu lock|unlock`: DockerSSD's inode lock between the host and containers; the work
//! is done by `insitu_host::lock`, this module parses and prints.

use crate::Failure;
use insitu_host::lock::{self as locks, LockHandle};
use serde_json::json;
use std::path::Path;

fn handle_json(h: &LockHandle) -> serde_json::Value {
    serde_json::to_value(h).unwrap_or_default()
}

/// `insitu lock PATH`.
pub(crate) fn lock(path: &Path, json_out: bool) -> Result<i32, Failure> {
    let h = locks::lock(path).map_err(|e| e.to_string())?;
    if json_out {
        let mut doc = handle_json(&h);
        doc["locked"] = json!(h.path);
        println!("{doc}");
    } else {
        println!(
            "locked {} (lock {:#x}, {} extents, {} bytes on {}): the host cannot modify it until `insitu unlock {}`",
            h.path.display(),
            h.id,
            h.extents,
            h.bytes,
            h.url,
            h.path.display()
        );
    }
    Ok(0)
}

/// `insitu unlock PATH`.
pub(crate) fn unlock(path: &Path, json_out: bool) -> Result<i32, Failure> {
    let u = locks::unlock(path).map_err(|e| e.to_string())?;
    let note = u.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
    if json_out {
        let mut doc = serde_json::to_value(&u).unwrap_or_default();
        doc["unlocked"] = json!(u.lock.path);
        doc["lock_id"] = json!(u.lock.id);
        println!("{doc}");
    } else {
        println!("unlocked {}{note}", u.lock.path.display());
    }
    Ok(0)
}

/// `insitu lock --list`.
pub(crate) fn list(json_out: bool) -> Result<i32, Failure> {
    let all = locks::held();
    if json_out {
        let docs: Vec<_> = all.iter().map(handle_json).collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "locks": docs })).unwrap_or_default());
    } else if all.is_empty() {
        println!("no locks held");
    } else {
        for h in &all {
            println!("{}  lock {:#x}  {} extents, {} bytes  {} (namespace {})", h.path.display(), h.id, h.extents, h.bytes, h.url, h.nsid);
        }
    }
    Ok(0)
}

/// A failed `insitu detach DIR` names the locks that keep DIR busy.
pub(crate) fn detach_hint(dir: &Path, error: String) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let held: Vec<String> = locks::held().into_iter().filter(|h| h.mount == dir).map(|h| h.path.display().to_string()).collect();
    if held.is_empty() {
        error
    } else {
        format!("{error}; locks hold it busy: release them first with `insitu unlock` ({})", held.join(", "))
    }
}
