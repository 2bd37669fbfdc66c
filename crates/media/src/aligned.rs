// SPDX-License-Identifier: Apache-2.0
//! Heap buffers aligned for O_DIRECT.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: enough for O_DIRECT on any Linux block device.
pub const DIRECT_ALIGN: usize = 4096;

/// A zero-initialised byte buffer whose start is aligned to [`DIRECT_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to a multiple of [`DIRECT_ALIGN`]).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(DIRECT_ALIGN);
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Capacity in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers hold at least one alignment unit.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, DIRECT_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}
