// SPDX-License-Identifier: Apache-2.0
//! `insitu._native.sparf_split`: SparF over a batch whose sequences are split over targets
//! by tokens, both exchange rounds, the page choice between them and the merge in one call.
//!
//! Python could drive the two rounds (it did), but between them the host holds the GIL
//! for a few milliseconds per layer (decoding every target's scores, choosing, building
//! the second requests, merging), which is a large share of a step on a few cores and
//! keeps another micro-batch's host work waiting. Here the GIL is released for the whole.

use crate::kv::{bad, element_type, f32s, run_all, Answer, KvTarget, PreparedAttend};
use crate::StorageIOError;
use insitu_kvcache::split::{choose_pages, merge, FixedPages, Part, TargetScores};
use insitu_proto::attention::Attend;
use insitu_proto::attention::{AttendOptions, AttendResult, AttendStats, Method, PageScores, RESULT_HEADER_LEN};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

/// What a target's answer cost: (its index in the targets given, media bytes, the
/// nanoseconds it waited on the modelled drive).
type Cost = (usize, u64, u64);

fn cost(j: usize, s: &AttendStats) -> Cost {
    (j, s.media_bytes, s.drive_wait_ns)
}

/// SparF over a token split, for one layer of a decode step: every target scores its pages
/// (appending the step's token of the sequences whose page it owns, `owners[b]` being
/// that target's index in `targets`), the pages are chosen over the whole sequence as one
/// target holding them all chooses them (`insitu_kvcache::split::choose_pages`, with each
/// sequence's fixed pages: `sinks[b]`, the target holding its first page, and
/// `local_from[b][j]`, target `j`'s first page holding one of its last tokens), every
/// target attends over the pages kept on it, and the parts are merged exactly.
///
/// `q` is `[len(seqs)][kv_heads][group][head_dim]` f32 bytes, `new_k` and `new_v`
/// `[len(seqs)][kv_heads][head_dim]`; `held[j][b]` the tokens of sequence `b` on target
/// `j` (the step's token counted) in pages of `tokens_per_page`; `r` the components the
/// page scores read and `budget` the pages kept besides the fixed ones. Returns the merged
/// outputs (f32 bytes, the shape of `q`) and, per round, what each target's answer cost:
/// `(index, media_bytes, drive_wait_ns)`.
#[pyfunction]
#[pyo3(signature = (targets, layer, seqs, q, group, scale, r, budget, sinks, local_from, held, tokens_per_page, new_k, new_v, owners, vectors="f32"))]
#[allow(clippy::too_many_arguments)] // one layer's whole exchange, as Python hands it over
pub fn sparf_split<'py>(
    py: Python<'py>,
    targets: Vec<Py<KvTarget>>,
    layer: usize,
    seqs: Vec<u64>,
    q: &[u8],
    group: usize,
    scale: f32,
    r: usize,
    budget: usize,
    sinks: Vec<Option<usize>>,
    local_from: Vec<Vec<Option<usize>>>,
    held: Vec<Vec<usize>>,
    tokens_per_page: usize,
    new_k: &[u8],
    new_v: &[u8],
    owners: Vec<usize>,
    vectors: &str,
) -> PyResult<(Bound<'py, PyBytes>, Vec<Vec<Cost>>)> {
    let vectors = element_type("vectors", vectors)?;
    let batch = seqs.len();
    let (q, new_k, new_v) = (f32s("q", q)?, f32s("new_k", new_k)?, f32s("new_v", new_v)?);
    let n = targets.len();
    if n == 0 || batch == 0 || group == 0 || tokens_per_page == 0 {
        return Err(bad("sparf_split needs targets, sequences, a group and a page size"));
    }
    if sinks.len() != batch || local_from.len() != batch || owners.len() != batch || held.len() != n {
        return Err(bad("sparf_split: a sink, local pages and an owner per sequence, held tokens per target"));
    }
    if local_from.iter().any(|l| l.len() != n) || held.iter().any(|h| h.len() != batch) || owners.iter().chain(sinks.iter().flatten()).any(|&j| j >= n) {
        return Err(bad("sparf_split: local pages and held tokens per target and sequence, targets by their index"));
    }
    let targets: Vec<&KvTarget> = targets.iter().map(|t| t.get()).collect();
    let (out, costs) = py.allow_threads(|| {
        let (heads, head_dim) = targets[0].info_shape(seqs[0])?;
        let row = heads * head_dim;
        if q.len() != batch * heads * group * head_dim || new_k.len() != batch * row || new_v.len() != batch * row {
            return Err(bad("sparf_split: q, new_k and new_v must hold every sequence's rows"));
        }
        // Round 1: every target's page scores, the step's token appended where it belongs.
        let mut first = Vec::with_capacity(n);
        for (j, t) in targets.iter().enumerate() {
            let rows: Vec<usize> = (0..batch).filter(|&b| owners[b] == j).collect();
            let pick = |v: &[f32]| rows.iter().flat_map(|&b| v[b * row..(b + 1) * row].iter().copied()).collect::<Vec<f32>>();
            let new_kv = (!rows.is_empty()).then(|| (pick(&new_k), pick(&new_v)));
            let new_entries = (!rows.is_empty() && rows.len() < batch).then_some(rows);
            let pages: usize = held[j].iter().map(|h| h.div_ceil(tokens_per_page)).sum();
            let method = Method::SparF { r, k: 1, local: 0, pages: 0, mean_v: true };
            let req = Attend {
                layer,
                heads,
                group,
                head_dim,
                method,
                scale,
                seqs: seqs.clone(),
                q: q.clone(),
                new_kv,
                new_entries,
                groups: None,
                vectors,
                reduced: None,
            };
            let want = RESULT_HEADER_LEN + 4 * batch + 4 * heads * group * pages;
            first.push(t.prepare(req, Some(r), AttendOptions { partial: false, page_scores: true }, want)?);
        }
        let scores: Vec<PageScores> = answers(&targets, &first, |a| match a {
            Answer::Scores(s) => Ok(s),
            Answer::Outputs(_) => Err(StorageIOError::new_err("KV page scores: the target answered with outputs")),
        })?;
        let mut costs = vec![scores.iter().enumerate().map(|(j, s)| cost(j, &s.stats)).collect::<Vec<_>>()];
        // The choice over the whole sequence.
        let views: Vec<TargetScores> = scores.iter().map(|s| TargetScores { pages: &s.groups, log_mass: &s.log_mass }).collect();
        let fixed: Vec<FixedPages> = sinks.iter().zip(&local_from).map(|(&sink, l)| FixedPages { sink, local_from: l.clone() }).collect();
        let chosen = choose_pages(&views, heads, group, &fixed, budget);
        // Round 2: every target with a page kept attends over its kept pages, for the
        // sequences with one there.
        let per_seq = heads * group * head_dim;
        let (mut second, mut who, mut asked) = (Vec::new(), Vec::new(), Vec::new());
        for (j, lists) in chosen.into_iter().enumerate() {
            let these: Vec<usize> = (0..batch).filter(|&b| lists[b * heads..(b + 1) * heads].iter().any(|l| !l.is_empty())).collect();
            if these.is_empty() {
                continue;
            }
            let groups: Vec<Vec<u32>> = these.iter().flat_map(|&b| lists[b * heads..(b + 1) * heads].to_vec()).collect();
            let qj: Vec<f32> = these.iter().flat_map(|&b| q[b * per_seq..(b + 1) * per_seq].iter().copied()).collect();
            let req = Attend {
                layer,
                heads,
                group,
                head_dim,
                method: Method::Dense,
                scale,
                seqs: these.iter().map(|&b| seqs[b]).collect(),
                q: qj,
                new_kv: None,
                new_entries: None,
                groups: Some(groups),
                vectors,
                reduced: None,
            };
            second.push(targets[j].prepare(req, None, AttendOptions { partial: true, page_scores: false }, 0)?);
            who.push(j);
            asked.push(these);
        }
        let chosen_targets: Vec<&KvTarget> = who.iter().map(|&j| targets[j]).collect();
        let parts: Vec<AttendResult> = answers(&chosen_targets, &second, |a| match a {
            Answer::Outputs(r) if r.lse.is_some() => Ok(r),
            _ => Err(StorageIOError::new_err("KV attend: the target's answer holds no partial result")),
        })?;
        costs.push(who.iter().zip(&parts).map(|(&j, p)| cost(j, &p.stats)).collect());
        // The merge: rows are (sequence, KV head, query row), sequence-major.
        let rows_per_seq = heads * group;
        let rows: Vec<Vec<usize>> = asked.iter().map(|these| these.iter().flat_map(|&b| b * rows_per_seq..(b + 1) * rows_per_seq).collect()).collect();
        let views: Vec<Part> = parts.iter().zip(&rows).map(|(p, rows)| Part { rows, out: &p.out, lse: p.lse.as_deref().unwrap_or(&[]) }).collect();
        let mut out = vec![0.0f32; q.len()];
        merge(&views, head_dim, &mut out);
        Ok::<_, PyErr>((out, costs))
    })?;
    let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok((PyBytes::new(py, &bytes), costs))
}

/// Runs `prepared[j]` on `targets[j]`, all at once, and unpacks each answer with `take`;
/// the first error wins.
fn answers<T>(targets: &[&KvTarget], prepared: &[PreparedAttend], take: impl Fn(Answer) -> PyResult<T>) -> PyResult<Vec<T>> {
    let jobs: Vec<(&KvTarget, &PreparedAttend)> = targets.iter().copied().zip(prepared).collect();
    run_all(&jobs).into_iter().map(|a| take(a?)).collect()
}

/// SparF's page choice over a token split (`insitu_kvcache::split::choose_pages`), for a
/// host that scores the pages itself (the FlexGen-style backend): `scores[j]` is target
/// `j`'s `(pages, log_mass)`, its page count per sequence and its f32 log-masses
/// `[seq][heads][rows][its pages]`; `sinks` and `local_from` as for [`sparf_split`].
/// Returns, per target, the chosen pages of each (sequence, KV head), sequence-major.
#[pyfunction]
pub fn choose_split_pages(
    py: Python<'_>,
    scores: Vec<(Vec<u32>, PyBackedBytes)>,
    heads: usize,
    rows: usize,
    sinks: Vec<Option<usize>>,
    local_from: Vec<Vec<Option<usize>>>,
    budget: usize,
) -> PyResult<Vec<Vec<Vec<u32>>>> {
    let masses: Vec<Vec<f32>> = scores.iter().map(|(_, b)| f32s("log_mass", b)).collect::<PyResult<_>>()?;
    let batch = sinks.len();
    for ((pages, _), m) in scores.iter().zip(&masses) {
        if pages.len() != batch || m.len() != heads * rows * pages.iter().map(|&n| n as usize).sum::<usize>() {
            return Err(bad("choose_split_pages: a page count per sequence, heads x rows log-masses per page"));
        }
    }
    if local_from.len() != batch || local_from.iter().any(|l| l.len() != scores.len()) || sinks.iter().flatten().any(|&j| j >= scores.len()) {
        return Err(bad("choose_split_pages: a sink and local pages per target for every sequence"));
    }
    let views: Vec<TargetScores> = scores.iter().zip(&masses).map(|((pages, _), m)| TargetScores { pages, log_mass: m }).collect();
    let fixed: Vec<FixedPages> = sinks.into_iter().zip(local_from).map(|(sink, local_from)| FixedPages { sink, local_from }).collect();
    Ok(py.allow_threads(|| choose_pages(&views, heads, rows, &fixed, budget)))
}
