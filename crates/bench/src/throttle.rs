// SPDX-License-Identifier: Apache-2.0
//! A drive model for the kernel's own I/O path: the block layer's throttle (cgroup v1
//! `blkio.throttle.*`, cgroup v2 `io.max`) on one block device, for the calling thread.
//!
//! insitu's own stacks obey a drive model by booking every transfer on it
//! ([`insitu_model::Pacer`]); I/O that a kernel file system issues on a loop device
//! cannot be booked from user space. The kernel's throttle caps its rate and operations per
//! second at the model's, which is the part of a drive model that a rate limiter can
//! express. It cannot add the model's per-request latency, so where the model's flash is
//! slower per request than this machine's disk, the throttled path is favoured: a
//! conservative baseline for a comparison against it.
//!
//! One cost the throttle cannot charge at all is the drive's flush: a durable commit waits
//! until the drive has programmed what its write-back cache holds, and a store that commits
//! every change pays that on every commit. [`FlushPaced`] charges it from user space: it
//! books the engine's file writes on the drive model as they are made (not waiting, as a
//! page cache would not) and makes each `fsync` last at least as long as the model's flush.
//! The kernel's own journal writes are not booked, which again favours the baseline.

use insitu_model::FlashConfig;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The rates a throttle of the kernel's block layer enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Bytes read per second.
    pub read_bps: u64,
    /// Bytes written per second.
    pub write_bps: u64,
    /// Reads per second.
    pub read_iops: u64,
    /// Writes per second.
    pub write_iops: u64,
}

impl Limits {
    /// The flash model's pipelined rates: sequential bandwidth, and one page per die per
    /// array operation and transfer.
    pub(crate) fn of(flash: &FlashConfig) -> Limits {
        let per_die = |array_us: f64| f64::from(flash.dies()) * 1e6 / (array_us + flash.page_transfer_us());
        Limits {
            read_bps: (flash.seq_read_mb_s() * 1e6) as u64,
            write_bps: (flash.seq_write_mb_s() * 1e6) as u64,
            read_iops: per_die(flash.read_us).max(1.0) as u64,
            write_iops: per_die(flash.program_us).max(1.0) as u64,
        }
    }
}

/// A redb storage backend whose syncs take as long as the drive model's flush (see the
/// module docs); everything else is `inner`'s.
pub(crate) struct FlushPaced<B> {
    inner: B,
    pacing: std::sync::Arc<insitu_model::Pacer>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for FlushPaced<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushPaced").field("inner", &self.inner).finish()
    }
}

impl<B: redb::StorageBackend> FlushPaced<B> {
    pub(crate) fn new(inner: B, pacing: std::sync::Arc<insitu_model::Pacer>) -> FlushPaced<B> {
        FlushPaced { inner, pacing }
    }
}

impl<B: redb::StorageBackend> redb::StorageBackend for FlushPaced<B> {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        insitu_media::paced_flush(Some(&*self.pacing), || self.inner.sync_data())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        use insitu_media::Pacing;
        // Booked, not waited for: the page cache takes the write at once.
        let _ = self.pacing.on_write(offset, data.len() as u64);
        self.inner.write(offset, data)
    }
}

/// The block device (major, minor) a path's file system lives on.
pub(crate) fn device_of(path: &Path) -> Result<(u32, u32), String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.dev();
    Ok((libc::major(dev), libc::minor(dev)))
}

/// The calling thread's I/O on one device, throttled until this is dropped.
#[derive(Debug)]
pub(crate) struct Throttle {
    dir: PathBuf,
    /// The `tasks` or `cgroup.procs` file of the cgroup to go back to, and what to write.
    back: (PathBuf, String),
}

fn write(path: &Path, what: &str) -> Result<(), String> {
    std::fs::write(path, what).map_err(|e| format!("writing {what:?} to {}: {e}", path.display()))
}

/// The thread's cgroup path for `controller` (v1), or its unified path (`None`).
fn own_cgroup(controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/thread-self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

impl Throttle {
    /// Moves the calling thread (cgroup v1) or process (v2) into a new cgroup that throttles
    /// `dev` to `limits`. Fails, changing nothing, where neither hierarchy offers the
    /// throttle or this process may not use it.
    pub(crate) fn apply(dev: (u32, u32), limits: Limits) -> Result<Throttle, String> {
        let (maj, min) = dev;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let name = format!("insitu-bench-{}-{tid}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        if v1.join("blkio.throttle.read_bps_device").exists() {
            let own = own_cgroup(Some("blkio")).ok_or("no blkio line in /proc/thread-self/cgroup")?;
            let parent = v1.join(own.trim_start_matches('/'));
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let t = Throttle { dir: dir.clone(), back: (parent.join("tasks"), tid.to_string()) };
            for (file, v) in [
                ("read_bps_device", limits.read_bps),
                ("write_bps_device", limits.write_bps),
                ("read_iops_device", limits.read_iops),
                ("write_iops_device", limits.write_iops),
            ] {
                write(&dir.join(format!("blkio.throttle.{file}")), &format!("{maj}:{min} {v}"))?;
            }
            write(&dir.join("tasks"), &t.back.1)?;
            return Ok(t);
        }
        let v2 = Path::new("/sys/fs/cgroup");
        let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "io") {
            return Err("neither cgroup v1's blkio throttle nor cgroup v2's io controller is available".into());
        }
        let own = own_cgroup(None).ok_or("no cgroup v2 line in /proc/thread-self/cgroup")?;
        let parent = v2.join(own.trim_start_matches('/'));
        // v2 enables io for children only where the parent holds no process itself.
        write(&parent.join("cgroup.subtree_control"), "+io")?;
        let dir = parent.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let t = Throttle { dir: dir.clone(), back: (parent.join("cgroup.procs"), std::process::id().to_string()) };
        let l = limits;
        write(&dir.join("io.max"), &format!("{maj}:{min} rbps={} wbps={} riops={} wiops={}", l.read_bps, l.write_bps, l.read_iops, l.write_iops))?;
        write(&dir.join("cgroup.procs"), &t.back.1)?;
        Ok(t)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = write(&self.back.0, &self.back.1);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_flash_model() {
        let f = FlashConfig::default();
        let l = Limits::of(&f);
        assert_eq!(l.read_bps, (f.seq_read_mb_s() * 1e6) as u64);
        assert!(l.write_bps < l.read_bps, "programs are slower than reads");
        // 32 dies, 45 µs sense plus a 32 KiB page at 1400 MB/s: about 468,000 reads/s.
        assert!((460_000..475_000).contains(&l.read_iops), "{}", l.read_iops);
        let slow = FlashConfig { read_us: 1000.0, ..f };
        assert!(Limits::of(&slow).read_iops < l.read_iops / 10);
    }

    #[test]
    fn a_sync_lasts_as_long_as_the_model_s_flush() {
        // One die, 1 ms per 4 KiB program: ten page writes leave ~10 ms for the flush.
        let cfg = FlashConfig { channels: 1, dies_per_channel: 1, page_bytes: 4096, program_us: 1000.0, channel_mb_s: 4096.0, ..FlashConfig::default() };
        let pacer = std::sync::Arc::new(insitu_model::Pacer::new(Some(insitu_model::Flash::new(cfg, 1 << 20).unwrap()), None));
        let b = FlushPaced::new(redb::backends::InMemoryBackend::new(), pacer);
        redb::StorageBackend::set_len(&b, 40960).unwrap();
        let t = std::time::Instant::now();
        for i in 0..10 {
            redb::StorageBackend::write(&b, i * 4096, &[1u8; 4096]).unwrap();
        }
        assert!(t.elapsed() < std::time::Duration::from_millis(5), "writes are not waited for");
        redb::StorageBackend::sync_data(&b).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(10), "{:?}", t.elapsed());
        let mut out = [0u8; 4096];
        redb::StorageBackend::read(&b, 4096, &mut out).unwrap();
        assert_eq!(out, [1u8; 4096]);
    }

    #[test]
    fn the_device_of_a_path_is_its_file_system_s() {
        use std::os::unix::fs::MetadataExt;
        let (maj, min) = device_of(Path::new("/")).unwrap();
        let dev = std::fs::metadata("/").unwrap().dev();
        assert_eq!(libc::makedev(maj, min), dev);
        assert!(device_of(Path::new("/no/such/path")).unwrap_err().contains("/no/such/path"));
    }
}
