// SPDX-License-Identifier: Apache-2.0
//! `insitu._native.attend_page_pairs`: dense attention on the host over pages it read back,
//! with the in-storage engine's kernels (`insitu_kvcache::PagePairs`).
//!
//! The FlexGen-style baseline reads a layer's pages into buffers and attends over them on
//! the host. In torch that costs a gather of every page into f32 rows and three products
//! of a few query rows each, several passes over every element; here each page is
//! widened once, as the engine does on a target, and the GIL is released throughout.

use crate::kv::{bad, element_type, f32s};
use insitu_kvcache::{attend_partial, HeadPages, KvError, Layout, Method, PagePairs};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyByteArray, PyBytes};
use rayon::prelude::*;

/// One (sequence, KV head) as Python hands it over: the `bytearray` holding its page pairs
/// (or None), the byte offset of its first pair there, its whole pairs, and its tail's K
/// and V rows (f32 bytes).
type Entry<'py> = (Option<Bound<'py, PyByteArray>>, usize, usize, PyBackedBytes, PyBackedBytes);

/// One entry's outputs and its rows' log-sum-exps.
type Part = (Vec<f32>, Vec<f64>);

/// The pages' size: FlexGen's blocks are written in 4 KiB pages, as a target's.
const PAGE_BYTES: usize = 4096;

/// Dense attention over each entry of `heads` (see [`Entry`]) of the `group` query rows of
/// `q` (f32 bytes, `[len(heads)][group][head_dim]`) with `scale`: the page pairs are 4 KiB
/// pages of `dtype` elements, each `[K page][V page]` of the same tokens. The bytearrays
/// must not be resized or written while the call runs.
/// Returns the outputs (f32 bytes, the shape of `q`) and each row's log-sum-exp (f64
/// bytes, `[len(heads)][group]`, −inf for an entry with no token), as one part of a
/// split-K attention (the host merges the parts).
#[pyfunction]
#[pyo3(signature = (q, heads, head_dim, group, scale, dtype="f16"))]
pub fn attend_page_pairs<'py>(
    py: Python<'py>,
    q: &[u8],
    heads: Vec<Entry<'py>>,
    head_dim: usize,
    group: usize,
    scale: f32,
    dtype: &str,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let layout = Layout::new(head_dim, element_type("dtype", dtype)?, PAGE_BYTES, 1).map_err(|e| bad(e.to_string()))?;
    let q = f32s("q", q)?;
    let rows = group * head_dim;
    if group == 0 || q.len() != heads.len() * rows {
        return Err(bad(format!("attend_page_pairs: q holds {} values; {} heads need {group} rows of {head_dim} each", q.len(), heads.len())));
    }
    let mut parts = Vec::with_capacity(heads.len());
    for (buffer, offset, pairs, tail_k, tail_v) in &heads {
        let span = 2 * PAGE_BYTES * pairs;
        let bytes: &[u8] = match buffer {
            Some(b) if *pairs > 0 => {
                if offset.checked_add(span).is_none_or(|end| end > b.len()) {
                    return Err(bad(format!("attend_page_pairs: {pairs} page pairs at byte {offset} are not inside a buffer of {}", b.len())));
                }
                // SAFETY: the bytearray holds the span (checked above) and is borrowed for
                // this call; the caller neither resizes nor writes it during the call (its
                // promise, as for `Session.read_into`), so the bytes stay valid and fixed.
                unsafe { std::slice::from_raw_parts(b.data().add(*offset), span) }
            }
            _ if *pairs > 0 => return Err(bad("attend_page_pairs: page pairs without a buffer")),
            _ => &[],
        };
        parts.push((bytes, f32s("tail_k", tail_k)?, f32s("tail_v", tail_v)?));
    }
    let answers: Vec<Result<Part, KvError>> = py.allow_threads(|| {
        parts
            .par_iter()
            .zip(q.par_chunks(rows))
            .map(|((pairs, tk, tv), q)| {
                let head = PagePairs::new(layout, pairs, tk, tv)?;
                let (mut out, mut lse) = (vec![0f32; rows], vec![f64::NEG_INFINITY; group]);
                if head.tokens() > 0 {
                    attend_partial(&head, q, scale, Method::Dense, &mut out, &mut lse)?;
                }
                Ok((out, lse))
            })
            .collect()
    });
    let (mut out, mut lse) = (Vec::with_capacity(4 * q.len()), Vec::with_capacity(8 * heads.len() * group));
    for a in answers {
        let (o, l) = a.map_err(|e| bad(format!("attend_page_pairs: {e}")))?;
        out.extend(o.iter().flat_map(|x| x.to_le_bytes()));
        lse.extend(l.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok((PyBytes::new(py, &out), PyBytes::new(py, &lse)))
}
