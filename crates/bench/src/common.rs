// SPDX-License-Identifier: Apache-2.0
//! What every benchmark needs: the machine and command line it ran with, cold caches, CPU
//! use, medians and rates.

use crate::Error;
use insitu_host::pool::drop_cached_pages;
use insitu_image::human;
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The machine a benchmark ran on, recorded in every report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// Cores this process may use.
    pub cpus: usize,
    /// The CPU's model name from /proc/cpuinfo; empty where it names none.
    pub cpu_model: String,
    /// Physical memory, bytes.
    pub memory_bytes: u64,
    /// The kernel's release.
    pub kernel: String,
}

/// The machine the benchmark runs on: cores, CPU model, memory and kernel.
pub fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("").trim().to_string();
    let mem_kib: u64 = read("/proc/meminfo").lines().find(|l| l.starts_with("MemTotal")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    Machine { cpus: cores(), cpu_model: cpu, memory_bytes: mem_kib * 1024, kernel: read("/proc/sys/kernel/osrelease").trim().to_string() }
}

/// The `model` of the benchmarks that run at this machine's own speed.
pub(crate) const REAL_SPEED: &str = "none (real speed of this machine)";

/// The exact command line of this process, recorded in every report.
pub fn command() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Host cores this machine has.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// CPU time this process has used (all threads, user and system), seconds.
pub(crate) fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes one struct rusage, which lives on this stack frame.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Share of this machine's cores the process kept busy while `f` ran, with `f`'s result.
pub(crate) fn with_utilization<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let (cpu, t) = (process_cpu_s(), std::time::Instant::now());
    let out = f();
    let wall = t.elapsed().as_secs_f64().max(1e-9);
    (out, (process_cpu_s() - cpu) / (wall * cores() as f64))
}

/// A pass that kept this share of the cores busy was limited by the machine, not the model.
pub(crate) const BUSY: f64 = 0.85;

/// GB/s (10⁹ bytes per second).
pub(crate) fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e9 / secs.max(1e-9)
}

/// Median of `v` (sorted in place); NaN when empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `work(state, item)` for every item in `0..items` on `threads` threads, each with
/// its own `state()` and taking the next item from a shared counter, as a queue of
/// requests in flight is kept full. The first error stops every thread and is returned;
/// otherwise the seconds the whole took.
pub(crate) fn timed_workers<S>(
    threads: usize,
    items: u64,
    state: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, u64) -> Result<(), String> + Sync,
) -> Result<f64, Error> {
    let next = AtomicU64::new(0);
    let error = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut st = state();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= items {
                        return;
                    }
                    if let Err(e) = work(&mut st, i) {
                        *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        next.store(items, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e.into()),
        None => Ok(secs),
    }
}

/// Evicts every clean page cache page on the machine (needs root; best effort otherwise)
/// and the image's own pages.
pub(crate) fn drop_caches(image: &Path) {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    if let Ok(f) = File::open(image) {
        let _ = drop_cached_pages(&f);
    }
}

/// A benchmark's work directory: the one given, or a new one, `insitu-TAG-PID` under
/// /dev/shm ([`Work::new`]) or /var/tmp ([`Work::on_disk`]). The files made with
/// [`Work::file`] are removed on drop, and the directory too when it was made here.
pub(crate) struct Work {
    root: PathBuf,
    remove_root: bool,
    files: Vec<PathBuf>,
}

impl Work {
    /// Makes the work directory, by default in memory (/dev/shm where there is one), and
    /// checks it has room for `need` bytes.
    pub(crate) fn new(dir: Option<PathBuf>, tag: &str, need: u64) -> Result<Work, Error> {
        let base = if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/var/tmp" };
        Work::under(base, dir, tag, need)
    }

    /// Makes the work directory, by default on disk (/var/tmp: direct I/O works there), and
    /// checks it has room for `need` bytes.
    pub(crate) fn on_disk(dir: Option<PathBuf>, tag: &str, need: u64) -> Result<Work, Error> {
        Work::under("/var/tmp", dir, tag, need)
    }

    fn under(base: &str, dir: Option<PathBuf>, tag: &str, need: u64) -> Result<Work, Error> {
        let remove_root = dir.is_none();
        let root = dir.unwrap_or_else(|| PathBuf::from(format!("{base}/insitu-{tag}-{}", std::process::id())));
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create the work directory {}: {e}", root.display()))?;
        let work = Work { root, remove_root, files: Vec::new() };
        if let Some(free) = free_bytes(&work.root) {
            if free < need + need / 16 {
                return Err(format!(
                    "{} has {} free but the benchmark's files need {}: give --dir on a larger file system, or smaller data (e.g. --file-size 4M or --size 256M)",
                    work.root.display(),
                    human(free),
                    human(need)
                )
                .into());
            }
        }
        Ok(work)
    }

    /// A path for a new image in the directory, removed on drop.
    pub(crate) fn file(&mut self, name: &str) -> PathBuf {
        let p = self.root.join(name);
        self.files.push(p.clone());
        p
    }

    /// The directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        if self.remove_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn free_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes one struct statvfs, which lives on this stack frame; the path
    // is a valid NUL-terminated string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_rates() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert!(median(&mut []).is_nan());
        assert_eq!(gbps(2_000_000_000, 2.0), 1.0);
    }
}
