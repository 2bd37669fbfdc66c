// SPDX-License-Identifier: Apache-2.0
//! The tensor directory of a GGUF file: each tensor's name, shape, type and where its
//! bytes lie, read from the file's header without its metadata values being kept.
//!
//! A GGUF file is a header (magic `GGUF`, version 2 or 3, the tensor and metadata counts),
//! the metadata (typed key-value pairs, among them `general.alignment`), the tensor
//! directory, and the tensors' data from the next multiple of the alignment on. Every count
//! and length is checked against what the file can hold before anything is allocated for
//! it, so a damaged or hostile header is an [`GgufError`], never a huge allocation.

use std::io::{BufReader, Read};
use std::path::Path;

/// What a GGUF file's header says of its tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directory {
    /// `general.architecture` (`llama`), where the metadata has it.
    pub architecture: Option<String>,
    /// The tensors, in the file's order.
    pub tensors: Vec<TensorInfo>,
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dimensions, innermost first, as GGUF lists them (a `rows x cols` matrix is
    /// `[cols, rows]`).
    pub dims: Vec<u64>,
    /// Its GGML type id (0 F32, 1 F16, 3 Q4_1, 8 Q8_0, ...).
    pub ggml_type: u32,
    /// Where its data starts, in bytes from the start of the file.
    pub offset: u64,
}

impl TensorInfo {
    /// The block format of its type, where it has one this crate multiplies.
    pub fn format(&self) -> Option<crate::Format> {
        match self.ggml_type {
            3 => Some(crate::Format::Q4_1),
            8 => Some(crate::Format::Q8_0),
            _ => None,
        }
    }

    /// The length of its data in bytes, where it is whole blocks of a [`format`](Self::format)
    /// (its innermost dimension a multiple of [`crate::BLOCK`]).
    pub fn block_bytes(&self) -> Option<u64> {
        let format = self.format()?;
        let inner = *self.dims.first()?;
        if inner % crate::BLOCK as u64 != 0 {
            return None;
        }
        let elements = self.dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d))?;
        (elements / crate::BLOCK as u64).checked_mul(format.block_bytes() as u64)
    }
}

/// Why a GGUF header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Reading the file failed.
    #[error("reading a GGUF file: {0}")]
    Io(#[from] std::io::Error),
    /// The file is not GGUF, or not a version this reader knows.
    #[error("not a GGUF file of version 2 or 3: {0}")]
    NotGguf(String),
    /// The header is damaged: a count or length larger than the file, an unknown value type.
    #[error("damaged GGUF header: {0}")]
    Damaged(String),
}

fn damaged(m: impl Into<String>) -> GgufError {
    GgufError::Damaged(m.into())
}

/// Arrays nested deeper than this are taken for damage (GGUF files nest none).
const MAX_DEPTH: u32 = 4;

struct Header<R> {
    r: R,
    /// Bytes the file holds past what has been read: no length may exceed it.
    left: u64,
    read: u64,
}

impl<R: Read> Header<R> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, GgufError> {
        if n > self.left {
            return Err(damaged(format!("{n} bytes asked for at byte {}, {} left in the file", self.read, self.left)));
        }
        let mut b = vec![0; n as usize];
        self.r.read_exact(&mut b)?;
        self.left -= n;
        self.read += n;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), GgufError> {
        if n > self.left {
            return Err(damaged(format!("{n} bytes to skip at byte {}, {} left in the file", self.read, self.left)));
        }
        let copied = std::io::copy(&mut self.r.by_ref().take(n), &mut std::io::sink())?;
        if copied != n {
            return Err(damaged("the file ends inside its header"));
        }
        self.left -= n;
        self.read += n;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()?;
        String::from_utf8(self.bytes(n)?).map_err(|_| damaged(format!("a string that is not UTF-8 before byte {}", self.read)))
    }

    /// Skips a metadata value of type `t`; returns it where it is a u32 (the alignment's type).
    fn value(&mut self, t: u32, depth: u32) -> Result<Option<u64>, GgufError> {
        match t {
            0 | 1 | 7 => self.skip(1)?,
            2 | 3 => self.skip(2)?,
            4 => return Ok(Some(u64::from(self.u32()?))),
            5 | 6 => self.skip(4)?,
            10..=12 => self.skip(8)?,
            8 => {
                let n = self.u64()?;
                self.skip(n)?;
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(damaged("arrays nested too deep"));
                }
                let (item, n) = (self.u32()?, self.u64()?);
                let fixed = match item {
                    0 | 1 | 7 => Some(1),
                    2 | 3 => Some(2),
                    4..=6 => Some(4),
                    10..=12 => Some(8),
                    _ => None,
                };
                match fixed {
                    Some(size) => self.skip(n.checked_mul(size).ok_or_else(|| damaged("an array larger than any file"))?)?,
                    None => {
                        if n > self.left {
                            return Err(damaged(format!("an array of {n} items with {} bytes left", self.left)));
                        }
                        for _ in 0..n {
                            self.value(item, depth + 1)?;
                        }
                    }
                }
            }
            t => return Err(damaged(format!("unknown metadata value type {t}"))),
        }
        Ok(None)
    }
}

/// The tensor directory of the GGUF file at `path`.
pub fn read_tensor_directory(path: &Path) -> Result<Directory, GgufError> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    tensor_directory(BufReader::new(f), len)
}

/// The tensor directory of a GGUF file of `len` bytes read from `r`.
pub fn tensor_directory(r: impl Read, len: u64) -> Result<Directory, GgufError> {
    let mut h = Header { r, left: len, read: 0 };
    let magic = h.bytes(4).map_err(|_| GgufError::NotGguf("shorter than its magic".into()))?;
    if magic != b"GGUF" {
        return Err(GgufError::NotGguf(format!("magic {magic:02x?}")));
    }
    let version = h.u32()?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::NotGguf(format!("version {version}")));
    }
    let (tensors, kvs) = (h.u64()?, h.u64()?);
    // Every pair and tensor takes more than 8 bytes: counts beyond that are damage.
    if tensors > h.left / 8 || kvs > h.left / 8 {
        return Err(damaged(format!("{tensors} tensors and {kvs} metadata pairs in a file of {len} bytes")));
    }
    let (mut alignment, mut architecture) = (32, None);
    for _ in 0..kvs {
        let key = h.string()?;
        let t = h.u32()?;
        if key == "general.architecture" && t == 8 {
            architecture = Some(h.string()?);
            continue;
        }
        let v = h.value(t, 0)?;
        if key == "general.alignment" {
            alignment = v.filter(|a| a.is_power_of_two()).ok_or_else(|| damaged("general.alignment is not a power of two u32"))?;
        }
    }
    let mut out = Vec::with_capacity(tensors.min(4096) as usize);
    for _ in 0..tensors {
        let name = h.string()?;
        let n_dims = h.u32()?;
        if n_dims > 8 {
            return Err(damaged(format!("tensor {name}: {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| h.u64()).collect::<Result<Vec<_>, _>>()?;
        let (ggml_type, offset) = (h.u32()?, h.u64()?);
        out.push(TensorInfo { name, dims, ggml_type, offset });
    }
    let data = h.read.div_ceil(alignment) * alignment;
    for t in &mut out {
        t.offset = data.checked_add(t.offset).filter(|o| *o <= len).ok_or_else(|| damaged(format!("tensor {} starts past the file's end", t.name)))?;
    }
    Ok(Directory { architecture, tensors: out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    /// A GGUF file with a string array, an alignment and two tensors.
    fn sample(alignment: u32) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "bc");
        string(&mut b, "general.alignment");
        b.extend(4u32.to_le_bytes());
        b.extend(alignment.to_le_bytes());
        string(&mut b, "x.f");
        b.extend(6u32.to_le_bytes());
        b.extend(1.5f32.to_le_bytes());
        for (name, dims, t, off) in [("w", vec![64u64, 2], 3u32, 0u64), ("e", vec![32, 1], 8, 96)] {
            string(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        b.resize(b.len().div_ceil(alignment as usize) * alignment as usize + 96 + 34, 0);
        b
    }

    #[test]
    fn the_directory_of_a_file_names_each_tensor_and_where_its_data_starts() {
        for alignment in [32, 64] {
            let b = sample(alignment);
            let d = tensor_directory(&b[..], b.len() as u64).unwrap();
            assert_eq!(d.architecture.as_deref(), Some("llama"));
            let dir = d.tensors;
            let data = (b.len() - 96 - 34) as u64;
            assert_eq!(data % u64::from(alignment), 0);
            assert_eq!(dir[0], TensorInfo { name: "w".into(), dims: vec![64, 2], ggml_type: 3, offset: data });
            assert_eq!(dir[1].offset, data + 96);
            assert_eq!((dir[0].format(), dir[1].format()), (Some(crate::Format::Q4_1), Some(crate::Format::Q8_0)));
            assert_eq!((dir[0].block_bytes(), dir[1].block_bytes()), (Some(80), Some(34)));
        }
    }

    #[test]
    fn what_is_not_gguf_says_so() {
        let e = tensor_directory(&b"GGML\x03\0\0\0"[..], 8).unwrap_err();
        assert!(matches!(e, GgufError::NotGguf(_)), "{e}");
        let mut b = sample(32);
        b[4] = 9;
        assert!(tensor_directory(&b[..], b.len() as u64).unwrap_err().to_string().contains("version 9"));
    }

    proptest! {
        /// Any damage to a header is an error or a directory, never a panic or a huge
        /// allocation.
        #[test]
        fn a_damaged_header_is_an_error(at in 0usize..200, byte in any::<u8>(), cut in 0usize..400) {
            let mut b = sample(32);
            let at = at % b.len();
            b[at] = byte;
            b.truncate(cut.max(1).min(b.len()));
            let _ = tensor_directory(&b[..], b.len() as u64);
        }

        #[test]
        fn random_bytes_are_an_error(b in prop::collection::vec(any::<u8>(), 0..300)) {
            let mut g = b"GGUF\x03\0\0\0".to_vec();
            g.extend(&b);
            prop_assert!(tensor_directory(&b[..], b.len() as u64).is_err());
            let _ = tensor_directory(&g[..], g.len() as u64);
        }
    }
}
