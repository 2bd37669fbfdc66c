// SPDX-License-Identifier: Apache-2.0
//! `insitu lock|unlock`: DockerSSD's inode lock between the host and containers.
//!
//! Locking a path of a file system attached with `insitu attach` syncs it (so the target
//! sees the host's latest data), sends its extents (FIEMAP) to the target in a LOCK
//! command, which refuses host writes to those blocks and refreshes the containers' view,
//! and bind-mounts the path read-only over itself, so host writers get EROFS at once.
//! Nothing is written to disk for a lock: a restart of either side drops it.

use crate::Failure;
use insitu_attach::Attachment;
use insitu_fabric::{opcode, Command, SGL_TRANSPORT_DATA_BLOCK};
use insitu_initiator::Session;
use insitu_target::LockRequest;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process;

const LOCK_DIR: &str = "/run/insitu/locks";

#[derive(Serialize, Deserialize)]
struct Held {
    path: PathBuf,
    relative: String,
    url: String,
    nsid: u32,
    id: u64,
    extents: usize,
}

fn record(path: &Path) -> PathBuf {
    let h: String = path.to_string_lossy().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)).to_string();
    Path::new(LOCK_DIR).join(format!("{h}.json"))
}

fn attachment_of(path: &Path) -> Result<Attachment, Failure> {
    insitu_attach::list()
        .into_iter()
        .filter(|a| path.starts_with(&a.dir))
        .max_by_key(|a| a.dir.as_os_str().len())
        .ok_or_else(|| format!("{} is not on a file system attached with `insitu attach URL DIR`", path.display()).into())
}

fn status_text(st: u16) -> String {
    let (sct, sc) = ((st >> 8) & 7, st & 0xff);
    insitu_wire::Status { sct: sct as u8, sc: sc as u8 }.to_string()
}

fn extents_of(path: &Path) -> Result<Vec<(u64, u64)>, Failure> {
    let mut files = vec![path.to_path_buf()];
    if path.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?.flatten() {
                let ft = e.file_type().map_err(|err| format!("{}: {err}", e_path(&e)))?;
                if ft.is_dir() {
                    stack.push(e.path());
                }
                if ft.is_dir() || ft.is_file() {
                    files.push(e.path());
                }
            }
        }
    }
    let mut out = Vec::new();
    for f in files {
        let file = std::fs::File::open(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", f.display()))?.len().max(1);
        let map = insitu_host::fiemap::fiemap(&file, len).map_err(|e| format!("FIEMAP of {}: {e}", f.display()))?;
        for x in map {
            let start = x.physical / 512 * 512;
            let end = (x.physical + x.length).div_ceil(512) * 512;
            if end > start {
                out.push((start, end - start));
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{} has no blocks on the device yet (empty, or inline in its inode): nothing to lock", path.display()).into());
    }
    Ok(out)
}

fn e_path(e: &std::fs::DirEntry) -> String {
    e.path().display().to_string()
}

fn run(cmd: &str, args: &[&str]) -> Result<(), Failure> {
    let out = process::Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()).into())
    }
}

/// `insitu lock PATH`.
pub(crate) fn lock(path: &Path, json_out: bool) -> Result<i32, Failure> {
    let path = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if record(&path).exists() {
        return Err(format!("{} is already locked (insitu unlock {} releases it)", path.display(), path.display()).into());
    }
    let att = attachment_of(&path)?;
    // The target must see the host's latest data before a container reads it.
    let f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: syncfs on a descriptor this function owns.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(format!("syncfs {}: {}", path.display(), std::io::Error::last_os_error()).into());
    }
    let relative = path.strip_prefix(&att.dir).unwrap_or(&path).to_string_lossy().into_owned();
    let extents = extents_of(&path)?;
    let req = LockRequest { path: if relative.is_empty() { ".".into() } else { relative.clone() }, extents };
    let payload = req.encode();
    let session = Session::connect(att.connect_options().map_err(|e| e.to_string())?).map_err(|e| format!("{}: {e}", att.url))?;
    let mut cmd = Command::zeroed();
    cmd.set_opcode(opcode::LOCK).set_nsid(att.nsid).set_sgl(0, payload.len() as u32, SGL_TRANSPORT_DATA_BLOCK);
    let (cqe, _) = session.submit(cmd, Some(&payload), 0).map_err(|e| format!("LOCK on {}: {e}", att.url))?;
    let _ = session.disconnect();
    if cqe.status & 0x7fff != 0 {
        return Err(format!("the target refused to lock {}: {}", path.display(), status_text(cqe.status)).into());
    }
    let id = u64::from(cqe.dw0) | (u64::from(cqe.dw1) << 32);
    let p = path.to_string_lossy().into_owned();
    let bound = run("mount", &["--bind", &p, &p]).and_then(|_| run("mount", &["-o", "remount,bind,ro", &p]));
    let held = Held { path: path.clone(), relative, url: att.url.clone(), nsid: att.nsid, id, extents: req.extents.len() };
    std::fs::create_dir_all(LOCK_DIR).map_err(|e| format!("{LOCK_DIR}: {e}"))?;
    std::fs::write(record(&path), serde_json::to_vec(&held).unwrap_or_default()).map_err(|e| format!("{LOCK_DIR}: {e}"))?;
    if let Err(e) = bound {
        let _ = unlock(&path, false);
        return Err(format!("cannot make {} read-only on the host: {}", path.display(), e.message).into());
    }
    if json_out {
        println!("{}", json!({"locked": path, "lock_id": id, "extents": held.extents, "url": att.url, "nsid": att.nsid}));
    } else {
        println!("locked {} (lock {id}, {} extents): host writes are refused until `insitu unlock`", path.display(), held.extents);
    }
    Ok(0)
}

/// `insitu unlock PATH`.
pub(crate) fn unlock(path: &Path, json_out: bool) -> Result<i32, Failure> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let rec = record(&path);
    let held: Held = std::fs::read(&rec)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| format!("{} is not locked (see `insitu lock --list`)", path.display()))?;
    let p = path.to_string_lossy().into_owned();
    let _ = run("umount", &[&p]);
    let att = attachment_of(&path)?;
    let session = Session::connect(att.connect_options().map_err(|e| e.to_string())?).map_err(|e| format!("{}: {e}", att.url))?;
    let mut cmd = Command::zeroed();
    cmd.set_opcode(opcode::UNLOCK).set_nsid(held.nsid).set_cdw(10, held.id as u32).set_cdw(11, (held.id >> 32) as u32);
    let r = session.submit(cmd, None, 0);
    let _ = session.disconnect();
    let _ = std::fs::remove_file(&rec);
    let (cqe, _) = r.map_err(|e| format!("UNLOCK on {}: {e}", att.url))?;
    // A target restarted meanwhile holds no lock: the host side is released all the same.
    let note = if cqe.status & 0x7fff != 0 { format!(" (the target no longer held it: {})", status_text(cqe.status)) } else { String::new() };
    if json_out {
        println!("{}", json!({"unlocked": path, "lock_id": held.id, "note": note}));
    } else {
        println!("unlocked {}{note}", path.display());
    }
    Ok(0)
}

/// `insitu lock --list`.
pub(crate) fn list(json_out: bool) -> Result<i32, Failure> {
    let mut all: Vec<Held> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(LOCK_DIR) {
        for e in rd.flatten() {
            if let Some(h) = std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice(&b).ok()) {
                all.push(h);
            }
        }
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"locks": all})).unwrap_or_default());
    } else if all.is_empty() {
        println!("no locks held");
    } else {
        for h in &all {
            println!("{} lock {} on {} ns {} ({} extents)", h.path.display(), h.id, h.url, h.nsid, h.extents);
        }
    }
    Ok(0)
}
