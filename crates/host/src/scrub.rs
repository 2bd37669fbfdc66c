// SPDX-License-Identifier: Apache-2.0
//! Bitrot scrubbing: record a checksum of every file under a directory, then later verify
//! them all with offloaded checksums and list what changed or went missing.

use crate::{Mode, OasError, Offloader, Request, Stats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// A manifest: one digest per file, relative to the scrubbed directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// Format version, 1.
    pub version: u32,
    /// Checksum function used.
    pub function: String,
    /// Relative path → entry.
    pub files: BTreeMap<String, Entry>,
}

/// One file of a manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// Size in bytes when recorded.
    pub size: u64,
    /// Hex digest.
    pub digest: String,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScrubReport {
    /// Files checked against the manifest (or recorded, with `--create`).
    pub checked: usize,
    /// Files whose digest no longer matches.
    pub corrupted: Vec<String>,
    /// Files in the manifest that are gone.
    pub missing: Vec<String>,
    /// Files not in the manifest (reported, not an error).
    pub new: Vec<String>,
    /// Cost of the checksum pass.
    pub stats: Stats,
}

impl ScrubReport {
    /// True when nothing is corrupted or missing.
    pub fn clean(&self) -> bool {
        self.corrupted.is_empty() && self.missing.is_empty()
    }
}

/// Regular files under `dir`, sorted, skipping insitu's own `.insitu` directories and the
/// file `skip` (the manifest, if it lives inside).
pub fn walk(dir: &Path, skip: Option<&Path>) -> Result<Vec<PathBuf>, OasError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let skip = skip.and_then(|s| fs::canonicalize(s).ok());
    while let Some(d) = stack.pop() {
        let rd = fs::read_dir(&d).map_err(|e| OasError::Io { path: d.clone(), source: e })?;
        for entry in rd {
            let entry = entry.map_err(|e| OasError::Io { path: d.clone(), source: e })?;
            let ft = entry.file_type().map_err(|e| OasError::Io { path: entry.path(), source: e })?;
            let p = entry.path();
            if ft.is_dir() && entry.file_name() != ".insitu" && entry.file_name() != "lost+found" {
                stack.push(p);
            } else if ft.is_file() && skip.as_ref() != fs::canonicalize(&p).ok().as_ref() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn rel(dir: &Path, p: &Path) -> String {
    p.strip_prefix(dir).unwrap_or(p).display().to_string()
}

fn digests(off: &Offloader, function: &str, files: &[PathBuf], mode: Mode) -> Result<(Vec<String>, Stats), OasError> {
    if files.is_empty() {
        return Ok((Vec::new(), Stats::default()));
    }
    let req = Request { function: function.into(), args: vec![], paths: files.to_vec(), output: None, mode, force: false };
    let report = off.exec(&req)?;
    let values = report.results.iter().map(|r| r.fields.get("value").and_then(|v| v.as_str()).unwrap_or_default().to_owned()).collect();
    Ok((values, report.stats))
}

/// Records a manifest of every file under `dir` into `manifest` (written atomically).
pub fn create(off: &Offloader, dir: &Path, manifest: &Path, function: &str, mode: Mode) -> Result<ScrubReport, OasError> {
    let files = walk(dir, Some(manifest))?;
    let (values, stats) = digests(off, function, &files, mode)?;
    let mut m = Manifest { version: 1, function: function.into(), files: BTreeMap::new() };
    for (p, digest) in files.iter().zip(values) {
        let size = fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        m.files.insert(rel(dir, p), Entry { size, digest });
    }
    let tmp = manifest.with_extension("tmp");
    let text = serde_json::to_string_pretty(&m).map_err(|e| OasError::BadRequest(e.to_string()))?;
    fs::write(&tmp, text).and_then(|_| fs::rename(&tmp, manifest)).map_err(|e| OasError::Io { path: manifest.to_owned(), source: e })?;
    Ok(ScrubReport { checked: files.len(), stats, ..Default::default() })
}

/// Verifies every file of `manifest` under `dir`.
pub fn verify(off: &Offloader, dir: &Path, manifest: &Path, mode: Mode) -> Result<ScrubReport, OasError> {
    let text = fs::read_to_string(manifest).map_err(|e| OasError::Io { path: manifest.to_owned(), source: e })?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| OasError::BadRequest(format!("{}: not an insitu scrub manifest ({e}); create one with --create", manifest.display())))?;
    if m.version != 1 {
        return Err(OasError::BadRequest(format!("{}: manifest version {} is not supported", manifest.display(), m.version)));
    }
    let files = walk(dir, Some(manifest))?;
    let present: BTreeMap<String, &PathBuf> = files.iter().map(|p| (rel(dir, p), p)).collect();
    let known: Vec<PathBuf> = m.files.keys().filter_map(|k| present.get(k).map(|p| (*p).clone())).collect();
    let (values, stats) = digests(off, &m.function, &known, mode)?;
    let mut report = ScrubReport { checked: known.len(), stats, ..Default::default() };
    for (p, digest) in known.iter().zip(values) {
        let key = rel(dir, p);
        if m.files[&key].digest != digest {
            report.corrupted.push(key);
        }
    }
    report.missing = m.files.keys().filter(|k| !present.contains_key(*k)).cloned().collect();
    report.new = present.keys().filter(|k| !m.files.contains_key(*k)).cloned().collect();
    Ok(report)
}
