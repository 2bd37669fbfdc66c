// SPDX-License-Identifier: Apache-2.0
//! [`PacedDevice`]: a [`BlockDevice`] whose transfers take as long as a drive model says.
//!
//! A target started with a device model paces its namespaces' media; the file system that
//! holds its key-value store lies in the same private namespace, so its blocks must cost
//! what the modelled drive would charge too, or the service would look faster than the
//! drive it emulates. The pacing is shared with the namespace's media, so both book the
//! same flash dies.

use insitu_accelfs::BlockDevice;
use insitu_media::{Pacing, ReadPurpose};
use std::io;
use std::sync::Arc;

/// `inner`, each transfer taking the longer of its real time and the model's. `base` is
/// where byte 0 of `inner` sits on the modelled drive (the store's offset in the private
/// namespace), so that the model maps the same pages as the namespace's own reads.
pub struct PacedDevice<D> {
    inner: D,
    pacing: Arc<dyn Pacing>,
    base: u64,
}

impl<D: BlockDevice> PacedDevice<D> {
    /// `inner` paced by `pacing`, placed at `base` on the modelled drive.
    pub fn new(inner: D, pacing: Arc<dyn Pacing>, base: u64) -> PacedDevice<D> {
        PacedDevice { inner, pacing, base }
    }
}

impl<D: BlockDevice> std::fmt::Debug for PacedDevice<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacedDevice").field("inner", &self.inner).field("base", &self.base).finish()
    }
}

impl<D: BlockDevice> BlockDevice for PacedDevice<D> {
    /// Reads are for code on the target (the service, kernels, containers): they cross
    /// the drive's engine link, if the model has one, not the host link.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let done = self.pacing.on_read(self.base + offset, buf.len() as u64, ReadPurpose::Offload);
        self.inner.read_at(buf, offset)?;
        self.pacing.wait_until(done);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let done = self.pacing.on_write(self.base + offset, buf.len() as u64);
        self.inner.write_at(buf, offset)?;
        self.pacing.wait_until(done);
        Ok(())
    }

    /// Waits, like the drive's flush, until the writes its cache acknowledged are durable.
    fn sync(&self) -> io::Result<()> {
        insitu_media::paced_flush(Some(&*self.pacing), || self.inner.sync())
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn describe(&self) -> String {
        format!("{} (paced by a drive model)", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_accelfs::{Fs, MemDevice};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// Records what it was told and charges a fixed time per transfer.
    #[derive(Default)]
    struct Recorder {
        reads: Mutex<Vec<(u64, u64, ReadPurpose)>>,
        writes: AtomicU64,
        flushes: AtomicU64,
    }

    impl Pacing for Recorder {
        fn on_read(&self, offset: u64, len: u64, purpose: ReadPurpose) -> Instant {
            self.reads.lock().unwrap().push((offset, len, purpose));
            Instant::now() + Duration::from_millis(2)
        }
        fn on_write(&self, _offset: u64, len: u64) -> Instant {
            self.writes.fetch_add(len, Ordering::Relaxed);
            Instant::now() + Duration::from_millis(2)
        }
        fn on_flush(&self) -> Instant {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            Instant::now() + Duration::from_millis(3)
        }
    }

    #[test]
    fn transfers_are_booked_at_their_place_on_the_drive_and_waited_for() {
        let rec = Arc::new(Recorder::default());
        let dev = PacedDevice::new(MemDevice::new(1 << 20), rec.clone(), 1 << 30);
        let t = Instant::now();
        dev.write_at(&[7u8; 4096], 8192).unwrap();
        let mut buf = [0u8; 4096];
        dev.read_at(&mut buf, 8192).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(4), "each transfer waits for the model");
        let t = Instant::now();
        dev.sync().unwrap();
        assert!(t.elapsed() >= Duration::from_millis(3), "a sync waits for the model's flush");
        assert_eq!(rec.flushes.load(Ordering::Relaxed), 1);
        assert_eq!(buf, [7u8; 4096]);
        assert_eq!(rec.writes.load(Ordering::Relaxed), 4096);
        assert_eq!(*rec.reads.lock().unwrap(), vec![((1 << 30) + 8192, 4096, ReadPurpose::Offload)]);
    }

    #[test]
    fn a_file_system_works_unchanged_on_a_paced_device() {
        let rec = Arc::new(Recorder::default());
        let fs = Fs::format(PacedDevice::new(MemDevice::new(4 << 20), rec.clone(), 0), 1 << 20).unwrap();
        let f = fs.create("x").unwrap();
        f.write_at(b"paced", 0).unwrap();
        f.sync().unwrap();
        let mut out = [0u8; 5];
        fs.open_file("x").unwrap().read_at(&mut out, 0).unwrap();
        assert_eq!(&out, b"paced");
        assert!(rec.writes.load(Ordering::Relaxed) > 0, "the file system's writes reach the model");
    }
}
