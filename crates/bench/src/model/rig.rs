// SPDX-License-Identifier: Apache-2.0
//! The emulated drives: namespace images in a work directory (in memory by default), objects
//! laid out inside them as extents, and one embedded [`Engine`] per image whose media is
//! paced by its own flash model and whose kernels are metered by its own CPU budget.

use super::emu::{DriveCore, DriveView};
use super::meter::{self, Meter};
use crate::dataset::Rng;
use crate::Error;
use insitu_engine::{Engine, NamespaceConfig, Nsid};
use insitu_image::human;
use insitu_media::Pacing;
use insitu_model::DeviceModel;
use insitu_proto::{Extent, VirtualObject, SECTOR};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The namespace hosts read through (the drive's host link).
pub(crate) const HOST_NS: Nsid = 1;
/// The namespace EXEC runs on (the drive's engine path); the same image.
pub(crate) const ENGINE_NS: Nsid = 2;
/// Objects start on 4 KiB boundaries, as a file system would place them.
const ALIGN: u64 = 4096;

/// Places objects one after another in an image, each in `extents` runs with `gap` bytes of
/// other data between them.
#[derive(Debug, Default)]
pub(crate) struct Placer {
    next: u64,
}

impl Placer {
    /// Places an object of `len` bytes in `extents` runs (at least one) of whole sectors.
    pub(crate) fn place(&mut self, len: u64, extents: u32, gap: u64) -> VirtualObject {
        let sectors = len.div_ceil(SECTOR).max(1);
        let runs = u64::from(extents.max(1)).min(sectors);
        let mut out = Vec::new();
        let mut done = 0;
        for i in 0..runs {
            let n = sectors * (i + 1) / runs - done;
            if i > 0 {
                self.next += gap.next_multiple_of(ALIGN);
            }
            // Extents hold at most u32::MAX sectors; split longer runs (they stay contiguous).
            let mut left = n;
            let mut at = self.next / SECTOR;
            while left > 0 {
                let take = left.min(u64::from(u32::MAX) / 8 * 8);
                out.push(Extent::data(at, take as u32));
                at += take;
                left -= take;
            }
            self.next += (n * SECTOR).next_multiple_of(ALIGN);
            done += n;
        }
        VirtualObject { offset: 0, length: len, extents: out }
    }

    /// Bytes placed so far (the image size needed).
    pub(crate) fn used(&self) -> u64 {
        self.next.next_multiple_of(ALIGN)
    }
}

/// Writes an image of `len` bytes at `path`, its bytes given by `fill(offset, buf)` for
/// consecutive pieces.
pub(crate) fn write_image(path: &Path, len: u64, mut fill: impl FnMut(u64, &mut [u8])) -> Result<(), Error> {
    let err = |e: std::io::Error| format!("cannot write the image {}: {e} (is there {} free?)", path.display(), human(len));
    let f = File::create(path).map_err(err)?;
    f.set_len(len).map_err(err)?;
    let mut buf = vec![0u8; 4 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        fill(at, &mut buf[..n]);
        f.write_all_at(&buf[..n], at).map_err(err)?;
        at += n as u64;
    }
    Ok(())
}

/// Writes `bytes` into the image at the object's extents.
pub(crate) fn write_object(path: &Path, obj: &VirtualObject, bytes: &[u8]) -> Result<(), Error> {
    let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut at = 0usize;
    for e in &obj.extents {
        if at >= bytes.len() {
            break;
        }
        let n = (e.bytes() as usize).min(bytes.len() - at);
        f.write_all_at(&bytes[at..at + n], e.start_sector * SECTOR).map_err(|e| format!("{}: {e}", path.display()))?;
        at += n;
    }
    Ok(())
}

/// Reads an object's bytes straight from the image (for checking results; not paced).
pub(crate) fn read_object(path: &Path, obj: &VirtualObject, len: u64) -> Result<Vec<u8>, Error> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = vec![0u8; len as usize];
    let mut at = 0usize;
    for e in &obj.extents {
        if at >= out.len() {
            break;
        }
        let n = (e.bytes() as usize).min(out.len() - at);
        f.read_exact_at(&mut out[at..at + n], e.start_sector * SECTOR).map_err(|e| format!("{}: {e}", path.display()))?;
        at += n;
    }
    Ok(out)
}

/// Random bytes for the piece at `offset` of an image seeded `seed`: the same seed and
/// pieces always give the same image, a different seed a different one.
pub(crate) fn random_fill(seed: u64) -> impl FnMut(u64, &mut [u8]) {
    move |offset, buf| {
        let mut rng = Rng::new(seed ^ offset.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.fill(buf);
    }
}

/// One emulated drive: a target with a host view and an engine view of one image.
pub(crate) struct Drive {
    /// The embedded target.
    pub(crate) target: Engine,
    /// Pacing of host reads (none without a flash model).
    pub(crate) host: Option<Arc<DriveView>>,
    /// Pacing of the engine's reads.
    pub(crate) engine: Option<Arc<DriveView>>,
    /// The kernels' CPU meter and budget.
    pub(crate) meter: Arc<Meter>,
    /// The image.
    pub(crate) image: PathBuf,
}

impl Drive {
    /// A target over `image`, emulating `model` (none: real speed).
    pub(crate) fn open(image: &Path, model: Option<&DeviceModel>) -> Result<Drive, Error> {
        let bytes = std::fs::metadata(image).map_err(|e| format!("{}: {e}", image.display()))?.len();
        let core = match model {
            Some(m) => DriveCore::new(m, bytes)?,
            None => None,
        };
        let view = |link: Option<insitu_model::LinkConfig>| core.clone().map(|c| DriveView::new(c, link).map(Arc::new)).transpose();
        let host = view(model.and_then(|m| m.link.clone()))?;
        let engine = view(model.and_then(|m| m.engine_link.clone()))?;
        let meter = Meter::new(model.and_then(|m| m.compute.as_ref()))?;
        let mut target = Engine::new().with_registry(Arc::new(meter::registry(&meter)));
        for view in [&host, &engine] {
            let pacing = view.clone().map(|v| v as Arc<dyn Pacing>);
            target.add_namespace(image, NamespaceConfig { pacing, ..NamespaceConfig::default() }).map_err(|e| format!("{}: {e}", image.display()))?;
        }
        Ok(Drive { target, host, engine, meter, image: image.to_owned() })
    }

    /// Time callers waited for this drive's flash model, ns (both views).
    pub(crate) fn media_waited_ns(&self) -> u64 {
        let w = |v: &Option<Arc<DriveView>>| v.as_ref().map_or(0, |v| v.stats.waited_ns.load(std::sync::atomic::Ordering::Relaxed));
        w(&self.host) + w(&self.engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_objects_do_not_overlap_and_cover_their_length() {
        let mut p = Placer::default();
        let a = p.place(10_000, 1, 0);
        let b = p.place(4 << 20, 3, 65536);
        let c = p.place(1, 4, 4096);
        assert_eq!(a.extents.len(), 1);
        assert_eq!(b.extents.len(), 3);
        assert_eq!(c.extents.len(), 1, "one sector cannot be split");
        let mut spans: Vec<(u64, u64)> = [&a, &b, &c].iter().flat_map(|o| o.extents.iter().map(|e| (e.start_sector * SECTOR, e.bytes()))).collect();
        for o in [&a, &b, &c] {
            assert!(o.extent_bytes() >= o.length && o.extent_bytes() - o.length < SECTOR);
        }
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0 + 1 && w[0].0 % ALIGN == 0));
        assert!(b.extents.windows(2).all(|w| w[1].start_sector * SECTOR >= (w[0].start_sector + u64::from(w[0].sectors)) * SECTOR + 65536));
        assert!(p.used() >= spans.last().map(|s| s.0 + s.1).unwrap());
    }

    #[test]
    fn random_images_depend_only_on_seed_and_offset() {
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        let mut f = random_fill(7);
        f(4096, &mut a);
        let mut g = random_fill(7);
        g(4096, &mut b[..32]);
        assert_eq!(&a[..32], &b[..32]);
        let mut h = random_fill(8);
        h(4096, &mut b);
        assert_ne!(a, b);
    }
}
