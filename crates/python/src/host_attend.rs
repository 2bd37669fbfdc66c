// SPDX-License-Identifier: Apache-2.0
//! Attention on the host over pages it read back, with the in-storage engine's kernels:
//! `insitu._native.attend_page_pairs` (dense, `insitu_kvcache::PagePairs`), and SparF's two
//! steps, `sparf_components` + `page_masses_from_runs` (`insitu_kvcache::DimRuns`) then
//! `attend_chosen_pages` (`PagePairs::chosen`).
//!
//! The FlexGen-style baseline reads a layer's pages into buffers and attends over them on
//! the host. In torch that costs a gather of every page into f32 rows and three products
//! of a few query rows each, several passes over every element; here each page is
//! widened once, as the engine does on a target, every (sequence, KV head) of a layer in
//! one call, and the GIL is released throughout.

use crate::kv::{bad, element_type, f32s};
use insitu_kvcache::{attend_groups, attend_partial, page_log_mass_reduced, reduce_queries, DimRuns, HeadPages, KvError, Layout, Method, PagePairs};
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
    let (layout, q) = layout_and_queries("attend_page_pairs", q, heads.len(), head_dim, group, dtype)?;
    let rows = group * head_dim;
    let mut parts = Vec::with_capacity(heads.len());
    for (buffer, offset, pairs, tail_k, tail_v) in &heads {
        // SAFETY: the caller neither resizes nor writes the bytearray during the call (its
        // promise, as for `Session.read_into`).
        let bytes = unsafe { span_of("attend_page_pairs", buffer, *offset, pairs.saturating_mul(2 * PAGE_BYTES))? };
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
    joined(py, "attend_page_pairs", answers)
}

/// The page layout of `dtype` elements and `head_dim`-element rows, and `q` (f32 bytes) as
/// values, checked to hold `group` rows of `head_dim` for each of `entries` entries
/// (`what`: the function, named in the error).
fn layout_and_queries(what: &str, q: &[u8], entries: usize, head_dim: usize, group: usize, dtype: &str) -> PyResult<(Layout, Vec<f32>)> {
    let layout = Layout::new(head_dim, element_type("dtype", dtype)?, PAGE_BYTES, 1).map_err(|e| bad(e.to_string()))?;
    let q = f32s("q", q)?;
    if group == 0 || q.len() != entries * group * head_dim {
        return Err(bad(format!("{what}: q holds {} values; {entries} entries need {group} rows of {head_dim} each", q.len())));
    }
    Ok((layout, q))
}

/// The bytes `[offset, offset + len)` of `buffer` (None: no bytes), checked to be inside it.
///
/// # Safety
/// The caller keeps the bytearray unresized and unwritten while the slice lives (the
/// promise every function here asks of Python, as `Session.read_into` does).
unsafe fn span_of<'b>(what: &str, buffer: &'b Option<Bound<'_, PyByteArray>>, offset: usize, len: usize) -> PyResult<&'b [u8]> {
    match buffer {
        _ if len == 0 => Ok(&[]),
        Some(b) => {
            if offset.checked_add(len).is_none_or(|end| end > b.len()) {
                return Err(bad(format!("{what}: {len} bytes at byte {offset} are not inside a buffer of {}", b.len())));
            }
            // SAFETY: inside the bytearray (checked above), fixed while borrowed (the
            // caller's promise).
            Ok(unsafe { std::slice::from_raw_parts(b.data().add(offset), len) })
        }
        None => Err(bad(format!("{what}: {len} bytes without a buffer"))),
    }
}

/// SparF's step 1 on the host for each (sequence, KV head) entry of `q` (f32 bytes,
/// `[entries][group][head_dim]`): the `r` components the entry's rows share, ascending, as
/// a target chooses them. The host reads those components' dimension runs for
/// [`page_masses_from_runs`].
#[pyfunction]
pub fn sparf_components(q: PyBackedBytes, group: usize, head_dim: usize, r: usize) -> PyResult<Vec<Vec<usize>>> {
    let q = f32s("q", &q)?;
    if group == 0 || head_dim == 0 || !q.len().is_multiple_of(group * head_dim) {
        return Err(bad(format!("sparf_components: {} query values are not whole entries of {group} rows of {head_dim}", q.len())));
    }
    let (dims, _, _) = reduce_queries(&q, group, head_dim, r);
    let r = r.clamp(1, head_dim);
    Ok(dims.chunks(r).map(<[usize]>::to_vec).collect())
}

/// One entry of [`page_masses_from_runs`]: the buffer holding its dimension runs (None
/// when none was read), the byte offset of the first, the bytes from one run to the next,
/// the tokens each run holds, the entry's tokens, and the later tokens' values of the
/// chosen components (f32 bytes, `[r][tokens - paged]`).
type RunsEntry<'py> = (Option<Bound<'py, PyByteArray>>, usize, usize, usize, usize, PyBackedBytes);

/// SparF's page log-masses on the host (`insitu_kvcache::page_log_mass_reduced`) for each
/// entry of `q` (as [`sparf_components`] takes it), from the dimension runs of the
/// components [`sparf_components`] chose for it (see [`RunsEntry`]; `dtype` elements). Returns
/// per entry `[group][token groups]` log-masses as f32 bytes, what
/// `choose_split_pages` takes. The bytearrays must not be resized or written meanwhile.
#[pyfunction]
#[pyo3(signature = (q, entries, head_dim, group, scale, r, dtype="f16"))]
#[allow(clippy::too_many_arguments)]
pub fn page_masses_from_runs<'py>(
    py: Python<'py>,
    q: PyBackedBytes,
    entries: Vec<RunsEntry<'py>>,
    head_dim: usize,
    group: usize,
    scale: f32,
    r: usize,
    dtype: &str,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let (layout, q) = layout_and_queries("page_masses_from_runs", &q, entries.len(), head_dim, group, dtype)?;
    let (dims, reduced, l1) = reduce_queries(&q, group, head_dim, r);
    let r = r.clamp(1, head_dim);
    let mut parts = Vec::with_capacity(entries.len());
    for (buffer, offset, stride, paged, tokens, tail) in &entries {
        let len = if *paged == 0 { 0 } else { (r - 1).saturating_mul(*stride).saturating_add(paged.saturating_mul(layout.dtype.size())) };
        // SAFETY: the caller's promise (see the function's docs).
        let runs = unsafe { span_of("page_masses_from_runs", buffer, *offset, len)? };
        parts.push((runs, *stride, *paged, *tokens, f32s("tail", tail)?));
    }
    let answers: Vec<Result<Vec<f32>, KvError>> = py.allow_threads(|| {
        parts
            .par_iter()
            .enumerate()
            .map(|(i, (runs, stride, paged, tokens, tail))| {
                if *tokens == 0 {
                    return Ok(Vec::new());
                }
                let dims = &dims[i * r..(i + 1) * r];
                let head = DimRuns::new(layout, *tokens, dims, runs, *stride, *paged, tail)?;
                let (masses, _) = page_log_mass_reduced(&head, &reduced[i * group * r..(i + 1) * group * r], dims, &l1[i * group..(i + 1) * group], scale)?;
                Ok(masses.into_iter().map(|m| m as f32).collect())
            })
            .collect()
    });
    answers
        .into_iter()
        .map(|a| {
            let m = a.map_err(|e| bad(format!("page_masses_from_runs: {e}")))?;
            Ok(PyBytes::new(py, &m.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()))
        })
        .collect()
}

/// One entry of [`attend_chosen_pages`]: the buffer holding the page pairs read (None when
/// none was), the byte offset of the first, the token groups chosen (ascending; those below
/// `paged` have their pairs in the buffer, in that order), the groups on pages, and the
/// tail's K and V rows after them (f32 bytes).
type ChosenEntry<'py> = (Option<Bound<'py, PyByteArray>>, usize, Vec<usize>, usize, PyBackedBytes, PyBackedBytes);

/// SparF's step 2 on the host: for each entry (see [`ChosenEntry`]), exact attention of its
/// `group` rows of `q` (f32 bytes, `[entries][group][head_dim]`) over every token of its
/// chosen groups. Returns the outputs (f32 bytes, the shape of `q`) and each row's
/// log-sum-exp (f64 bytes, −inf for an entry with no group), one part of a split-K
/// attention. The bytearrays must not be resized or written meanwhile.
#[pyfunction]
#[pyo3(signature = (q, entries, head_dim, group, scale, dtype="f16"))]
pub fn attend_chosen_pages<'py>(
    py: Python<'py>,
    q: PyBackedBytes,
    entries: Vec<ChosenEntry<'py>>,
    head_dim: usize,
    group: usize,
    scale: f32,
    dtype: &str,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let (layout, q) = layout_and_queries("attend_chosen_pages", &q, entries.len(), head_dim, group, dtype)?;
    let rows = group * head_dim;
    let mut parts = Vec::with_capacity(entries.len());
    for (buffer, offset, groups, paged, tail_k, tail_v) in &entries {
        let read = groups.iter().take_while(|&&g| g < *paged).count();
        // SAFETY: the caller's promise (see the function's docs).
        let pairs = unsafe { span_of("attend_chosen_pages", buffer, *offset, read * 2 * PAGE_BYTES)? };
        parts.push((pairs, groups.as_slice(), read, *paged, f32s("tail_k", tail_k)?, f32s("tail_v", tail_v)?));
    }
    let answers: Vec<Result<Part, KvError>> = py.allow_threads(|| {
        parts
            .par_iter()
            .zip(q.par_chunks(rows))
            .map(|((pairs, groups, read, paged, tk, tv), q)| {
                let (mut out, mut lse) = (vec![0f32; rows], vec![f64::NEG_INFINITY; group]);
                if !groups.is_empty() {
                    let head = PagePairs::chosen(layout, pairs, &groups[..*read], *paged, tk, tv)?;
                    attend_groups(&head, q, scale, groups, &mut out, &mut lse)?;
                }
                Ok((out, lse))
            })
            .collect()
    });
    joined(py, "attend_chosen_pages", answers)
}

/// Each entry's outputs (f32) and log-sum-exps (f64), concatenated as little-endian bytes;
/// the first entry's error, named after the function `what`, if any failed.
fn joined<'py>(py: Python<'py>, what: &str, answers: Vec<Result<Part, KvError>>) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for a in answers {
        let (o, l) = a.map_err(|e| bad(format!("{what}: {e}")))?;
        out.extend(o.iter().flat_map(|x| x.to_le_bytes()));
        lse.extend(l.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok((PyBytes::new(py, &out), PyBytes::new(py, &lse)))
}
