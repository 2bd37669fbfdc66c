// SPDX-License-Identifier: Apache-2.0
//! What `stats` and `top` read of a running container: its cgroup's counters (cgroup v1
//! controllers or the v2 unified hierarchy, wherever runc placed `/insitu/<id>`) and the
//! target's CPU time.

use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

/// One container's cgroup.
pub struct Cgroup {
    id: String,
    v2: bool,
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

impl Cgroup {
    /// The cgroup of container `id`.
    pub fn of(id: &str) -> Cgroup {
        let v2 = Path::new(ROOT).join("cgroup.controllers").exists();
        Cgroup { id: id.to_string(), v2 }
    }

    fn path(&self, controller: &str, file: &str) -> PathBuf {
        if self.v2 {
            Path::new(ROOT).join("insitu").join(&self.id).join(file)
        } else {
            Path::new(ROOT).join(controller).join("insitu").join(&self.id).join(file)
        }
    }

    /// The pids of every process in it.
    pub fn pids(&self) -> Vec<i32> {
        let p = self.path("pids", "cgroup.procs");
        std::fs::read_to_string(p).map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect()).unwrap_or_default()
    }

    /// CPU time used, nanoseconds: (total, user, system), and per CPU (v1 only).
    pub fn cpu(&self) -> (u64, u64, u64, Vec<u64>) {
        if self.v2 {
            let text = std::fs::read_to_string(self.path("", "cpu.stat")).unwrap_or_default();
            let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or(0) * 1000;
            return (get("usage_usec "), get("user_usec "), get("system_usec "), Vec::new());
        }
        let total = read_u64(&self.path("cpuacct", "cpuacct.usage")).unwrap_or(0);
        let per = std::fs::read_to_string(self.path("cpuacct", "cpuacct.usage_percpu"))
            .map(|t| t.split_whitespace().filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        // cpuacct.stat counts in USER_HZ (100 per second).
        let stat = std::fs::read_to_string(self.path("cpuacct", "cpuacct.stat")).unwrap_or_default();
        let get = |k: &str| stat.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or(0) * 10_000_000;
        (total, get("user "), get("system "), per)
    }

    /// Memory: (usage, max usage, limit, the `memory.stat` counters).
    pub fn memory(&self) -> (u64, u64, u64, Vec<(String, u64)>) {
        let (usage, max, limit, stat) = if self.v2 {
            ("memory.current", "memory.peak", "memory.max", "memory.stat")
        } else {
            ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes", "memory.stat")
        };
        let stats = std::fs::read_to_string(self.path("memory", stat))
            .map(|t| {
                t.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        Some((k.to_string(), v.trim().parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let limit = read_u64(&self.path("memory", limit)).unwrap_or(u64::MAX);
        (read_u64(&self.path("memory", usage)).unwrap_or(0), read_u64(&self.path("memory", max)).unwrap_or(0), limit, stats)
    }

    /// Processes: (current, limit; 0 when unlimited).
    pub fn pids_counts(&self) -> (u64, u64) {
        (read_u64(&self.path("pids", "pids.current")).unwrap_or(0), read_u64(&self.path("pids", "pids.max")).unwrap_or(0))
    }
}

/// The target's CPU time, nanoseconds (all CPUs, from `/proc/stat`), and its CPU count.
pub fn system_cpu() -> (u64, usize) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let total: u64 = text.lines().next().map(|l| l.split_whitespace().skip(1).filter_map(|x| x.parse::<u64>().ok()).sum()).unwrap_or(0);
    let cpus = text.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    // USER_HZ is 100.
    (total * 10_000_000, cpus.max(1))
}
