// SPDX-License-Identifier: Apache-2.0
//! A bounds-checked little-endian reader, and the decoder's error type.

/// Why a byte string is not a valid descriptor or result record.
///
/// Every variant names the field and the byte offset where decoding stopped, so a
/// hand-built descriptor can be fixed from the message alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("truncated: {field} at byte {offset} needs {need} bytes, only {have} left")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Byte offset of the field.
        offset: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left in the input.
        have: usize,
    },
    /// The magic number does not match.
    #[error("bad magic {found:02x?}: expected {expected:?} (is this an insitu {what}?)")]
    BadMagic {
        /// What kind of message was expected.
        what: &'static str,
        /// The expected magic, as text.
        expected: &'static str,
        /// The bytes found.
        found: [u8; 4],
    },
    /// The format version is not one this decoder reads.
    #[error("unsupported version {found} (this build reads version {supported})")]
    BadVersion {
        /// Version in the header.
        found: u16,
        /// Version this build supports.
        supported: u16,
    },
    /// A field holds a value the format forbids.
    #[error("invalid {field} at byte {offset}: {detail}")]
    BadField {
        /// The field.
        field: &'static str,
        /// Byte offset of the field.
        offset: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// A count exceeds its limit.
    #[error("too many {field}: {count} (limit {max})")]
    TooMany {
        /// What is being counted.
        field: &'static str,
        /// The count found.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// A value tag that is not defined.
    #[error("unknown value tag {tag} at byte {offset}")]
    UnknownTag {
        /// The tag byte.
        tag: u8,
        /// Its offset.
        offset: usize,
    },
    /// A string is not UTF-8.
    #[error("{field} at byte {offset} is not valid UTF-8")]
    BadUtf8 {
        /// The field.
        field: &'static str,
        /// Its offset.
        offset: usize,
    },
    /// The checksum in the header does not match the contents.
    #[error("checksum mismatch: header says {stated:#010x}, contents hash to {computed:#010x}")]
    BadChecksum {
        /// Checksum in the header.
        stated: u32,
        /// Checksum of the bytes received.
        computed: u32,
    },
    /// Bytes remain after the last field.
    #[error("{extra} unexpected trailing bytes after byte {offset}")]
    Trailing {
        /// Where the message should have ended.
        offset: usize,
        /// How many bytes follow.
        extra: usize,
    },
}

/// Reads little-endian fields from a byte slice, never past its end.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated { field, offset: self.pos, need: n, have: self.remaining() });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, field)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn magic(&mut self, expected: &'static [u8; 4], what: &'static str) -> Result<(), DecodeError> {
        let found = self.array::<4>("magic")?;
        if &found != expected {
            let expected = std::str::from_utf8(expected).unwrap_or("?");
            return Err(DecodeError::BadMagic { what, expected, found });
        }
        Ok(())
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { offset: self.pos, extra }),
        }
    }
}

/// Little-endian fields at fixed offsets of a buffer the caller has already checked is
/// long enough (a fixed-size header, an Identify structure): they panic past its end, as
/// slice indexing does. For input of unknown length use the checked decoders.
pub mod le {
    /// The `u16` at byte `o`.
    pub fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes([b[o], b[o + 1]])
    }

    /// The `u32` at byte `o`.
    pub fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }

    /// The `u64` at byte `o`.
    pub fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
    }
}
