// SPDX-License-Identifier: Apache-2.0
//! Namespaces: byte ranges of a backing store with a logical block size and a visibility.

use insitu_media::{Backing, BufferPool, Pacing, DIRECT_ALIGN};
use std::sync::Arc;

/// Who may address a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Listed to and readable by admitted hosts.
    Sharable,
    /// Used only by code running on the target; every host command on it is refused.
    Private,
}

/// How to carve a namespace out of a backing store.
#[derive(Clone)]
pub struct NamespaceConfig {
    /// Logical block size for Read/Write: 512 or 4096. Default 512.
    pub lba_size: u32,
    /// Byte offset of the namespace within the store (a multiple of 512). Default 0.
    pub offset: u64,
    /// Size in bytes (a multiple of `lba_size`); `None` means up to the end of the store,
    /// rounded down to whole blocks. Default `None`.
    pub size: Option<u64>,
    /// Sharable or private. Default sharable.
    pub visibility: Visibility,
    /// A device timing model the media obeys (a flash model, say). Default none: the
    /// machine's real speed.
    pub pacing: Option<Arc<dyn Pacing>>,
    /// Buffers (each [`crate::CHUNK`] plus alignment slack) the namespace's pool keeps
    /// between commands; 0 frees each buffer after use, as if there were no pool. Default
    /// 16, about 32 MiB: enough for a few concurrent EXECs to find theirs ready.
    pub idle_buffers: usize,
    /// Host reads of a disk go through the kernel's page cache: read ahead by the kernel
    /// and sent with `sendfile` by transports that can (see
    /// [`insitu_media::Backing::with_cached_reads`]). `false` reads them with direct I/O
    /// into the namespace's buffers, as EXEC always reads. Default `true`: on this
    /// project's machines it serves a streaming host 1.35 times as fast (`docs/data-path.md`).
    pub cached_reads: bool,
}

impl std::fmt::Debug for NamespaceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceConfig")
            .field("lba_size", &self.lba_size)
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("visibility", &self.visibility)
            .field("paced", &self.pacing.is_some())
            .field("idle_buffers", &self.idle_buffers)
            .field("cached_reads", &self.cached_reads)
            .finish()
    }
}

impl Default for NamespaceConfig {
    fn default() -> Self {
        NamespaceConfig { lba_size: 512, offset: 0, size: None, visibility: Visibility::Sharable, pacing: None, idle_buffers: 16, cached_reads: true }
    }
}

/// One namespace of a target.
pub struct Namespace {
    pub(crate) media: Arc<Backing>,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) lba_size: u32,
    pub(crate) visibility: Visibility,
    /// Buffers for EXEC streams and block reads, reused from command to command.
    pub(crate) pool: BufferPool,
    /// io_uring read-ahead engines of finished EXECs, kept for the next ones (a ring and
    /// its registered buffers cost milliseconds to set up).
    pub(crate) scanners: std::sync::Mutex<Vec<insitu_media::UringScanner>>,
}

impl Namespace {
    pub(crate) fn new(media: Arc<Backing>, cfg: &NamespaceConfig) -> Result<Namespace, String> {
        if cfg.lba_size != 512 && cfg.lba_size != 4096 {
            return Err(format!("logical block size {} is not supported: use 512 or 4096", cfg.lba_size));
        }
        if !cfg.offset.is_multiple_of(512) {
            return Err(format!("namespace offset {} is not a multiple of 512", cfg.offset));
        }
        let avail = media
            .len()
            .checked_sub(cfg.offset)
            .ok_or_else(|| format!("namespace offset {} is beyond the end of {} ({} bytes)", cfg.offset, media.path().display(), media.len()))?;
        let lba = u64::from(cfg.lba_size);
        let size = match cfg.size {
            Some(s) if s > avail => return Err(format!("namespace size {s} exceeds the {avail} bytes available in {}", media.path().display())),
            Some(s) if s % lba != 0 => return Err(format!("namespace size {s} is not a multiple of the block size {lba}")),
            Some(s) => s,
            None => avail / lba * lba,
        };
        if size == 0 {
            return Err(format!("{} is too small for one {lba}-byte block", media.path().display()));
        }
        // A window read needs up to one alignment unit of slack at each end.
        let pool = BufferPool::new(crate::CHUNK + 2 * DIRECT_ALIGN, cfg.idle_buffers);
        Ok(Namespace { media, offset: cfg.offset, size, lba_size: cfg.lba_size, visibility: cfg.visibility, pool, scanners: Default::default() })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Logical block size in bytes.
    pub fn lba_size(&self) -> u32 {
        self.lba_size
    }

    /// Sharable or private.
    pub fn visibility(&self) -> Visibility {
        self.visibility
    }

    /// The backing store.
    pub fn media(&self) -> &Backing {
        &self.media
    }

    /// The namespace's buffer pool (EXEC streams and block reads take their buffers there).
    pub fn buffer_pool(&self) -> &BufferPool {
        &self.pool
    }
}
