// SPDX-License-Identifier: Apache-2.0
//! `docker diff`: what a container changed of its image, read from its overlay's upper
//! directory: an entry there that a lower layer has is modified, one that none has is
//! added, and a whiteout (a 0/0 character device) is a deletion.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Runtime, RuntimeError};

/// How a path changed (the numbers are the API's `Kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Kind 0.
    Modified = 0,
    /// Kind 1.
    Added = 1,
    /// Kind 2.
    Deleted = 2,
}

/// The changes in `upper` over `layers` (lowest first), by path in the container.
pub fn changes(upper: &Path, layers: &[PathBuf]) -> Vec<(String, Change)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(upper.join(&rel)) else { continue };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let r = rel.join(e.file_name());
            let Ok(m) = e.path().symlink_metadata() else { continue };
            let shown = format!("/{}", r.display());
            if m.file_type().is_char_device() && m.rdev() == 0 {
                out.push((shown, Change::Deleted));
                continue;
            }
            let below = layers.iter().any(|l| l.join(&r).symlink_metadata().is_ok());
            out.push((shown, if below { Change::Modified } else { Change::Added }));
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    out.sort();
    out
}

impl Runtime {
    /// `GET /containers/{id}/changes`.
    pub fn changes(&self, key: &str) -> Result<Vec<(String, Change)>, RuntimeError> {
        let c = self.get(key)?;
        Ok(changes(&c.upper_dir(), &c.layers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_entries_are_added_modified_or_deleted() {
        let d = tempfile::tempdir().unwrap();
        let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
        std::fs::create_dir_all(lower.join("etc")).unwrap();
        std::fs::write(lower.join("etc/passwd"), "x").unwrap();
        std::fs::create_dir_all(upper.join("etc")).unwrap();
        std::fs::write(upper.join("etc/passwd"), "y").unwrap();
        std::fs::write(upper.join("new"), "n").unwrap();
        let c = changes(&upper, &[lower]);
        assert_eq!(c, vec![("/etc".into(), Change::Modified), ("/etc/passwd".into(), Change::Modified), ("/new".into(), Change::Added)]);
    }
}
