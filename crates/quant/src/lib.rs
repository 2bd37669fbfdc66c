// SPDX-License-Identifier: Apache-2.0
//! Products of a few f32 rows with a matrix kept in a GGUF block format.
//!
//! A decode step multiplies one row per sequence by every weight matrix of the model. A
//! model shipped as GGUF Q4_1 holds 20 bytes per 32 weights (Q8_0: 34); de-quantized to
//! f32 it holds 128, which a CPU streams from memory for every step. This crate reads the
//! blocks as stored and de-quantizes each in registers, once for up to eight rows, right
//! before the rows use it.
//!
//! Each weight is de-quantized exactly as the GGUF reference de-quantizer does it
//! (`d * q + m`, f16 scales widened to f32, no fused multiply-add), so [`BlockMatrix::
//! dequantize`] returns the same bits as loading the model as f32, and a product differs
//! from the f32 product only in the order its terms are summed.
//!
//! The kernel has a plain Rust body and, on x86-64, an AVX2 one chosen at run time; both do
//! the same operations lane by lane in the same order and give the same bits.
//!
//! A product runs on the calling thread. Spread over a pool of threads, in a decode step
//! whose micro-batches and embedded targets already keep a 2-CPU machine busy, it left the
//! step's time as it was (0.40-0.41 s against 0.40-0.43, 4 x 1,024 SparF over 4 targets)
//! and took 0.06-0.08 s more CPU a step.

mod gguf;

pub use gguf::{read_tensor_directory, tensor_directory, Directory, GgufError, TensorInfo};

/// Weights per block in both formats.
pub const BLOCK: usize = 32;

/// Input rows a kernel call carries at once: each de-quantized block is used by this many
/// rows while it is in registers.
const ROWS_AT_ONCE: usize = 8;

/// A GGUF block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 32 weights `d * q + m`: `d`, `m` f16, `q` 4-bit unsigned (low nibbles hold the first
    /// 16 weights, high nibbles the next 16); 20 bytes.
    Q4_1,
    /// 32 weights `d * q`: `d` f16, `q` 8-bit signed; 34 bytes.
    Q8_0,
}

impl Format {
    /// Bytes of one block of 32 weights.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
        }
    }

    /// The format of a GGUF type name (`"Q4_1"`, `"Q8_0"`, as gguf tools spell them).
    pub fn from_name(name: &str) -> Option<Format> {
        match name {
            "Q4_1" => Some(Format::Q4_1),
            "Q8_0" => Some(Format::Q8_0),
            _ => None,
        }
    }
}

/// What is wrong with a matrix or a product's operands.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A row's length is not a whole number of blocks.
    #[error("a row of {cols} weights is not a whole number of {BLOCK}-weight blocks")]
    RaggedRow {
        /// Weights per row.
        cols: usize,
    },
    /// The data does not hold `rows` rows of blocks.
    #[error("{format:?} data of {got} bytes for {rows} x {cols} weights: expected {expected}")]
    Size {
        /// The block format.
        format: Format,
        /// Output rows.
        rows: usize,
        /// Weights per row.
        cols: usize,
        /// Bytes given.
        got: usize,
        /// Bytes `rows x cols` weights take.
        expected: usize,
    },
    /// The input is not `n` rows of `cols` values.
    #[error("input of {got} values is not {n} rows of {cols}")]
    Input {
        /// Input rows asked for.
        n: usize,
        /// Values per row the matrix needs.
        cols: usize,
        /// Values given.
        got: usize,
    },
}

/// A `rows x cols` matrix stored as GGUF blocks, row after row (each row `cols / 32`
/// blocks), as a GGUF file stores a tensor of shape `[cols, rows]`.
#[derive(Clone, Debug)]
pub struct BlockMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl BlockMatrix {
    /// Takes `data` as `rows` rows of `cols` weights in `format`; checks only the sizes
    /// (every bit pattern of a block is a valid block).
    pub fn new(format: Format, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, Error> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(Error::RaggedRow { cols });
        }
        let expected = rows * cols / BLOCK * format.block_bytes();
        if data.len() != expected {
            return Err(Error::Size { format, rows, cols, got: data.len(), expected });
        }
        Ok(BlockMatrix { format, rows, cols, data })
    }

    /// The block format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Output rows (the length of a product's row).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row (the length of an input row).
    pub fn cols(&self) -> usize {
        self.cols
    }

    fn row_bytes(&self) -> usize {
        self.cols / BLOCK * self.format.block_bytes()
    }

    /// The matrix as f32, row after row, with the bits of the GGUF reference de-quantizer.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        let bb = self.format.block_bytes();
        for (block, w) in self.data.chunks_exact(bb).zip(out.chunks_exact_mut(BLOCK)) {
            w.copy_from_slice(&dequantize_block(self.format, block));
        }
        out
    }

    /// `out = x · Wᵀ` for the `n` rows of `x` (`n x cols` values, row after row): `out`
    /// gets `n x rows` values, row after row.
    pub fn matmul(&self, x: &[f32], n: usize) -> Result<Vec<f32>, Error> {
        if x.len() != n * self.cols {
            return Err(Error::Input { n, cols: self.cols, got: x.len() });
        }
        let mut out = vec![0.0f32; n * self.rows];
        if out.is_empty() || self.cols == 0 {
            return Ok(out);
        }
        let mut sums = vec![0.0f32; n];
        for (r, w) in self.data.chunks_exact(self.row_bytes()).enumerate() {
            dot_rows(self.format, w, x, self.cols, &mut sums);
            for (i, v) in sums.iter().enumerate() {
                out[i * self.rows + r] = *v;
            }
        }
        Ok(out)
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One block's 32 weights, as the GGUF reference computes them.
#[inline(always)]
fn dequantize_block(format: Format, b: &[u8]) -> [f32; BLOCK] {
    let mut w = [0.0f32; BLOCK];
    match format {
        Format::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let qs = &b[4..20];
            for j in 0..BLOCK / 2 {
                w[j] = f32::from(qs[j] & 0x0f) * d + m;
                w[j + BLOCK / 2] = f32::from(qs[j] >> 4) * d + m;
            }
        }
        Format::Q8_0 => {
            let d = f16_at(b, 0);
            for (w, q) in w.iter_mut().zip(&b[2..34]) {
                *w = f32::from(*q as i8) * d;
            }
        }
    }
    w
}

/// `out[i] = x_i · w` for every input row `x_i` of `x`, `w` one weight row's blocks.
fn dot_rows(format: Format, w: &[u8], x: &[f32], cols: usize, out: &mut [f32]) {
    for (x, out) in x.chunks(cols * ROWS_AT_ONCE).zip(out.chunks_mut(ROWS_AT_ONCE)) {
        let row = |i: usize| &x[i * cols..(i + 1) * cols];
        match out.len() {
            1 => out.copy_from_slice(&dot_block_rows::<1>(format, w, [row(0)])),
            2 => out.copy_from_slice(&dot_block_rows::<2>(format, w, [row(0), row(1)])),
            3 => out.copy_from_slice(&dot_block_rows::<3>(format, w, [row(0), row(1), row(2)])),
            4 => out.copy_from_slice(&dot_block_rows::<4>(format, w, [row(0), row(1), row(2), row(3)])),
            5 => out.copy_from_slice(&dot_block_rows::<5>(format, w, std::array::from_fn(row))),
            6 => out.copy_from_slice(&dot_block_rows::<6>(format, w, std::array::from_fn(row))),
            7 => out.copy_from_slice(&dot_block_rows::<7>(format, w, std::array::from_fn(row))),
            _ => out.copy_from_slice(&dot_block_rows::<8>(format, w, std::array::from_fn(row))),
        }
    }
}

/// Lanes of one accumulator: one AVX2 vector of f32.
const LANES: usize = 8;

/// Accumulators per input row, taking a block's 8-lane chunks in turn, so that the adds of
/// one row form two independent chains.
const CHAINS: usize = 2;

/// `[x_r · w]` for `R` input rows, `w` one weight row's blocks, each block de-quantized
/// once for all `R` rows. An AVX2 copy runs where the CPU has AVX2; it does the operations
/// of [`dot_block_rows_baseline`] lane by lane in the same order, so it gives the same bits.
fn dot_block_rows<const R: usize>(format: Format, w: &[u8], xs: [&[f32]; R]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        for x in xs {
            assert!(x.len() >= w.len() / format.block_bytes() * BLOCK, "an input row shorter than the weight row");
        }
        // SAFETY: the CPU has AVX2 and F16C, checked just above; every input row holds a value for
        // every weight of `w`, checked just above.
        return unsafe { avx2::dot_block_rows::<R>(format, w, xs) };
    }
    dot_block_rows_baseline::<R>(format, w, xs)
}

/// The sum of one row's accumulators: the chains lane by lane, then the lanes pairwise.
#[inline(always)]
fn reduce(chains: [[f32; LANES]; CHAINS]) -> f32 {
    let a: [f32; LANES] = std::array::from_fn(|l| chains[0][l] + chains[1][l]);
    let pairs = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (pairs[0] + pairs[2]) + (pairs[1] + pairs[3])
}

/// [`dot_block_rows`] in plain Rust.
fn dot_block_rows_baseline<const R: usize>(format: Format, w: &[u8], xs: [&[f32]; R]) -> [f32; R] {
    let mut acc = [[[0.0f32; LANES]; CHAINS]; R];
    for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
        let wq = dequantize_block(format, block);
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[b * BLOCK..(b + 1) * BLOCK];
            for c in 0..BLOCK / LANES {
                for l in 0..LANES {
                    acc[c % CHAINS][l] += wq[c * LANES + l] * x[c * LANES + l];
                }
            }
        }
    }
    acc.map(reduce)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{reduce, Format, BLOCK, CHAINS, LANES};
    use std::arch::x86_64::*;

    /// A block's 32 weights in four vectors, de-quantized as [`super::dequantize_block`]
    /// does (a multiply, then an add).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn weights(format: Format, b: &[u8]) -> [__m256; 4] {
        // SAFETY: the caller gives whole blocks (20 or 34 bytes) and has AVX2 and F16C; the
        // loads read 16 bytes at 4 (Q4_1) or 8-byte runs from 2 to 34 (Q8_0).
        unsafe {
            match format {
                Format::Q4_1 => {
                    // d and m widened together (F16C widens exactly, as `half` does).
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                    let (d, m) = (_mm256_broadcastss_ps(dm), _mm256_broadcastss_ps(_mm_movehdup_ps(dm)));
                    let v = _mm_loadu_si128(b.as_ptr().add(4).cast());
                    let mask = _mm_set1_epi8(0x0f);
                    let lo = _mm_and_si128(v, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                    let q = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
                    // Loops, not closures: a closure does not get the function's AVX2.
                    let mut w = [_mm256_setzero_ps(); 4];
                    for (w, q) in w.iter_mut().zip(q) {
                        *w = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), d), m);
                    }
                    w
                }
                Format::Q8_0 => {
                    let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([b[0], b[1]])))));
                    let mut w = [_mm256_setzero_ps(); 4];
                    for (c, w) in w.iter_mut().enumerate() {
                        let q = _mm_loadl_epi64(b.as_ptr().add(2 + 8 * c).cast());
                        *w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
                    }
                    w
                }
            }
        }
    }

    /// [`super::dot_block_rows`] with AVX2 vectors.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C, and every row of `xs` holds at least `BLOCK` values per block of `w`.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn dot_block_rows<const R: usize>(format: Format, w: &[u8], xs: [&[f32]; R]) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); CHAINS]; R];
        for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
            // SAFETY: AVX2 and the input rows' lengths are the caller's promise.
            unsafe {
                let wv = weights(format, block);
                for (acc, x) in acc.iter_mut().zip(xs) {
                    let x = x.as_ptr().add(b * BLOCK);
                    for (c, wc) in wv.iter().enumerate() {
                        let p = _mm256_mul_ps(*wc, _mm256_loadu_ps(x.add(c * LANES)));
                        acc[c % CHAINS] = _mm256_add_ps(acc[c % CHAINS], p);
                    }
                }
            }
        }
        let mut out = [0.0f32; R];
        for (o, chains) in out.iter_mut().zip(&acc) {
            let mut lanes = [[0.0f32; LANES]; CHAINS];
            for (l, v) in lanes.iter_mut().zip(chains) {
                // SAFETY: `l` holds the 8 f32 of one vector.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *v) };
            }
            *o = reduce(lanes);
        }
        out
    }
}

#[cfg(test)]
mod tests;
