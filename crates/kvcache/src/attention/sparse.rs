// SPDX-License-Identifier: Apache-2.0
//! SparF (InstInfer Algorithm 1) and SparQ: the same selection and arithmetic; SparF counts
//! the pages the store reads, SparQ the elements a store without page groups would read.
//!
//! Each query row of a grouped-query call makes its own selections (steps 1 and 6), but the
//! pages are loaded for the union of the rows' needs, each once, and every row picks its own
//! units out of a loaded page (the second step of the dual-step loading). Pages no row needs
//! are never read (the first step).
//!
//! Ties are broken towards the lower index, in the selection of components and of tokens,
//! so a call is deterministic; the approximate scores of a token are summed over the
//! selected components in ascending order, in f32, which a plain reference reproduces
//! exactly.

use std::ops::Range;

use super::approx;
use super::kernels::{axpy, axpy_rows, dot, dot_rows, exp_shifted_lse, score_run, top_k};
use super::{element_stats, v_mean, Count, PagedRows};
use crate::{AttendStats, HeadPages, Kind, KvError, Loaded};

/// What to keep, already clamped: `r <= head_dim`, `k < tokens`, `local <= tokens`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Query components kept per row.
    pub r: usize,
    /// Tokens kept per row (the local ones included).
    pub k: usize,
    /// Most recent tokens always kept (if `local > k`, the `k` best of them).
    pub local: usize,
    /// How media reads are reported.
    pub count: Count,
    /// Most token pages chosen besides the local tokens' (0: no cap).
    pub budget: usize,
    /// Mix with the mean of V by α (else α is 1).
    pub mean_v: bool,
}

/// Sparse attention of the rows of `q` into `out`, and the log-sum-exp of each row's
/// exact scores over its kept tokens into `lse` when given (shapes checked by the caller).
pub(super) fn attend(head: &dyn HeadPages, q: &[f32], scale: f64, plan: Plan, out: &mut [f32], lse: Option<&mut [f64]>) -> Result<AttendStats, KvError> {
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let n = head.tokens();
    let rows = q.len() / hd;
    let qd: Vec<f64> = q.iter().map(|&x| f64::from(x)).collect();
    let mut order = Vec::with_capacity(n);
    let mut loaded = Loaded::default();
    // Checked before any page is read, so a store with a bad V sum costs no reads.
    let mean = if plan.mean_v { Some(v_mean(head)?) } else { None };

    let (dim_used, mut shat) = approx_logits(head, &qd, scale, plan.r, plan.budget > 0, &mut loaded)?;
    shat.chunks_exact_mut(n).for_each(approx::softmax);

    // With a page budget, the pages come first: the first page (the attention sink most
    // heads lean on), those of the local tokens, and the `budget` others on which some row
    // puts the most approximate weight (the sum of its ŝ over the page's tokens: a page is
    // worth reading for all its tokens, not for its single best one). Tokens elsewhere are
    // out of reach (ranked below every token in reach).
    let first_local = n - plan.local;
    let groups_n = layout.token_groups(n);
    // Steps 5-7 rank only the tokens in reach (with a page budget, a few pages' worth of
    // the sequence), ascending, not every token of every row.
    let cand: Vec<usize> = if plan.budget > 0 {
        let local_from = first_local / tpp;
        // Each row's page sums, then the largest over the rows.
        let mut mass = vec![0f32; groups_n];
        for s in shat.chunks_exact(n) {
            mass.iter_mut().zip(s.chunks(tpp)).for_each(|(m, page)| *m = m.max(approx::sum(page)));
        }
        let candidates = if plan.local > 0 { local_from.min(groups_n) } else { groups_n };
        let mut pick = Vec::new();
        if candidates > 1 {
            top_k(candidates - 1, plan.budget, &mut pick, |a, b| mass[b + 1].total_cmp(&mass[a + 1]).then(a.cmp(&b)));
        }
        // `pick` is ascending and below `candidates - 1`: the pages in reach, in order.
        let pages = std::iter::once(0).chain(pick.iter().map(|&g| g + 1)).chain(candidates.max(1)..groups_n);
        pages.flat_map(|g| g * tpp..n.min((g + 1) * tpp)).collect()
    } else {
        (0..n).collect()
    };
    let k = plan.k.min(cand.len()).max(1);

    // Steps 5-7: the `k` best tokens by ŝ, the last `local` first (the paper's ŝ + m), and
    // α, the approximate weight they carry (needed only to mix in the mean of V).
    let mut toks = Vec::with_capacity(rows);
    let mut alpha = Vec::with_capacity(rows);
    let every = k >= cand.len(); // a page budget's reach is kept whole: no ranking
    for s in shat.chunks_exact(n) {
        if every {
            if plan.mean_v {
                alpha.push(cand.iter().map(|&t| f64::from(s[t])).sum::<f64>());
            }
            toks.push(cand.clone());
            continue;
        }
        top_k(cand.len(), k, &mut order, |a, b| {
            let (a, b) = (cand[a], cand[b]);
            (b >= first_local).cmp(&(a >= first_local)).then(s[b].total_cmp(&s[a])).then(a.cmp(&b))
        });
        order.iter_mut().for_each(|i| *i = cand[*i]); // ascending still: `cand` is
        if plan.mean_v {
            alpha.push(order.iter().map(|&t| f64::from(s[t])).sum::<f64>());
        }
        toks.push(order.clone());
    }
    drop(shat);

    // Steps 8-11 on the pages that hold a kept token.
    let mut tok_used = vec![false; n];
    toks.iter().flatten().for_each(|&t| tok_used[t] = true);
    let groups: Vec<usize> = (0..layout.token_groups(n)).filter(|&g| tok_used[g * tpp..n.min((g + 1) * tpp)].contains(&true)).collect();
    let mix = mean.as_deref().map(|m| (m, alpha.as_slice()));
    loaded += exact(head, &qd, scale, &toks, &groups, mix, out, lse)?;

    let distinct = tok_used.iter().filter(|&&u| u).count() as u64;
    Ok(match plan.count {
        Count::Pages => AttendStats { pages_read: loaded.pages, media_bytes: loaded.bytes, rows_used: 2 * distinct, drive_wait_ns: 0 },
        Count::Elements => element_stats(&layout, dim_used.iter().filter(|&&u| u).count(), n, distinct),
    })
}

/// Step 1 with a page budget, for the rows `qd` of one KV head: the `r` largest of
/// Σ |q_row| / ‖q_row‖₁, ascending, ties to the lower component.
pub(super) fn shared_components(qd: &[f64], hd: usize, r: usize) -> Vec<usize> {
    let mut weight = vec![0f64; hd];
    for qr in qd.chunks_exact(hd) {
        let l1 = l1_norm(qr);
        if l1 > 0.0 {
            weight.iter_mut().zip(qr).for_each(|(w, x)| *w += x.abs() / l1);
        }
    }
    let mut order = Vec::with_capacity(hd);
    top_k(hd, r, &mut order, |a, b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    order
}

/// `‖row‖₁`, summed in component order (the host's reduced queries carry it so).
pub(super) fn l1_norm(row: &[f64]) -> f64 {
    row.iter().map(|x| x.abs()).sum()
}

/// The positions in the ascending list `sorted` of the values in `lo..hi`.
fn span(sorted: &[usize], lo: usize, hi: usize) -> Range<usize> {
    sorted.partition_point(|&x| x < lo)..sorted.partition_point(|&x| x < hi)
}

/// Steps 1-4: each row's `r` largest-magnitude components (with `shared`, one choice for
/// all rows), the dimension groups holding them loaded, and each row's approximate scores
/// `ŝ` before the softmax, `rows × tokens` (the temperature applied), in f32. Returns
/// which components some row uses and the scores.
fn approx_logits(head: &dyn HeadPages, qd: &[f64], scale: f64, r: usize, shared: bool, loaded: &mut Loaded) -> Result<(Vec<bool>, Vec<f32>), KvError> {
    approx_logits_given(head, qd, scale, r, shared, None, loaded)
}

/// [`approx_logits`], with step 1 made by the host when `given` holds the shared
/// components and each row's `‖q‖₁` (reduced queries: `qd` is zero elsewhere).
fn approx_logits_given(
    head: &dyn HeadPages,
    qd: &[f64],
    scale: f64,
    r: usize,
    shared: bool,
    given: Option<(&[usize], &[f64])>,
    loaded: &mut Loaded,
) -> Result<(Vec<bool>, Vec<f32>), KvError> {
    let layout = *head.layout();
    let (hd, dpp) = (layout.head_dim, layout.dims_per_page);
    let n = head.tokens();
    let rows = qd.len() / hd;
    let mut order = Vec::with_capacity(hd);
    // Step 1. Shared (with a page budget): the `r` largest of Σ |q_row| / ‖q_row‖₁, so
    // every row scores with `r` components for `r` dimension pages, where separate choices
    // would read up to `rows · r` pages and leave less of the budget for token pages.
    let mut dims = Vec::with_capacity(rows);
    if let Some((chosen, _)) = given {
        dims.resize(rows, chosen.to_vec());
    } else if shared {
        dims.resize(rows, shared_components(qd, hd, r));
    } else {
        for qr in qd.chunks_exact(hd) {
            top_k(hd, r, &mut order, |a, b| qr[b].abs().total_cmp(&qr[a].abs()).then(a.cmp(&b)));
            dims.push(order.clone());
        }
    }

    // Steps 2-4: approximate scores from the dimension groups holding a selected component.
    let mut dim_used = vec![false; hd];
    dims.iter().flatten().for_each(|&d| dim_used[d] = true);
    let mut shat = vec![0f32; rows * n];
    let used: Vec<usize> = (0..layout.dim_groups()).filter(|g| dim_used[g * dpp..(g + 1) * dpp].contains(&true)).collect();
    let mut buf = super::Scratch::take(used.len() * dpp * n);
    *loaded += head.load_dim_groups(&used, &mut buf)?;
    // Where dimension `d`'s run of tokens is in `buf`.
    let mut at = vec![usize::MAX; hd];
    for (i, &group) in used.iter().enumerate() {
        (0..dpp).for_each(|j| at[group * dpp + j] = (i * dpp + j) * n);
    }
    for (row, (ds, s)) in dims.iter().zip(shat.chunks_exact_mut(n)).enumerate() {
        // The row's components in ascending order, as the groups hold them.
        // `qd` holds f32 values widened: back to f32 exactly.
        let terms: Vec<(f32, &[f32])> = ds.iter().map(|&d| (qd[row * hd + d] as f32, &buf[at[d]..at[d] + n])).collect();
        approx::axpy_terms(s, &terms);
    }
    for (row, ((qr, ds), s)) in qd.chunks_exact(hd).zip(&dims).zip(shat.chunks_exact_mut(n)).enumerate() {
        // The paper divides by sqrt(d_h * |q_i|_1 / |q|_1): a partial dot product over the
        // components that carry most of q underestimates the full one's spread, and this
        // temperature corrects for it. A zero query scores every token 0 whatever the scale.
        let l1: f64 = given.map_or_else(|| l1_norm(qr), |(_, l1)| l1[row]);
        let l1_kept: f64 = ds.iter().map(|&d| qr[d].abs()).sum();
        let factor = if l1_kept > 0.0 { scale / (l1_kept / l1).sqrt() } else { scale };
        approx::scale(s, factor as f32);
    }
    Ok((dim_used, shat))
}

/// Steps 8-11: each row's exact attention over its kept tokens `toks[row]` (ascending),
/// read from the token groups `groups` (ascending, every kept token's among them), into
/// `out`; mixed with the mean of V by each row's α when `mix` is given; each row's
/// log-sum-exp into `lse` when given. Returns what the reads cost.
#[allow(clippy::too_many_arguments)]
fn exact(
    head: &dyn HeadPages,
    qd: &[f64],
    scale: f64,
    toks: &[Vec<usize>],
    groups: &[usize],
    mix: Option<(&[f64], &[f64])>,
    out: &mut [f32],
    lse: Option<&mut [f64]>,
) -> Result<Loaded, KvError> {
    if toks.windows(2).all(|w| w[0] == w[1]) {
        return exact_shared(head, qd, scale, &toks[0], groups, mix, out, lse);
    }
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let rows = qd.len() / hd;
    let mut pages = PagedRows::new(head, groups);
    let mut scores: Vec<Vec<f64>> = toks.iter().map(|j| vec![0f64; j.len()]).collect();
    pages.pass(Kind::K, |batch, buf| {
        for (&group, page) in batch.iter().zip(buf.chunks_exact(tpp * hd)) {
            let base = group * tpp;
            for ((qr, j), sc) in qd.chunks_exact(hd).zip(toks).zip(&mut scores) {
                for i in span(j, base, base + tpp) {
                    sc[i] = dot(qr, &page[(j[i] - base) * hd..][..hd]) * scale;
                }
            }
        }
    })?;
    let (sums, lses): (Vec<f64>, Vec<f64>) = scores.iter_mut().map(|s| exp_shifted_lse(s)).unzip();
    if let Some(lse) = lse {
        lse.copy_from_slice(&lses);
    }

    // Step 11: out = α · softmax(s) · V[j] + (1 − α) · mean(V), or softmax(s) · V[j].
    let mut acc = vec![0f64; rows * hd];
    pages.pass(Kind::V, |batch, buf| {
        for (&group, page) in batch.iter().zip(buf.chunks_exact(tpp * hd)) {
            let base = group * tpp;
            for ((a, j), w) in acc.chunks_exact_mut(hd).zip(toks).zip(&scores) {
                for i in span(j, base, base + tpp) {
                    axpy(a, w[i], &page[(j[i] - base) * hd..][..hd]);
                }
            }
        }
    })?;
    finish(hd, &acc, &sums, mix, out);
    Ok(pages.loaded)
}

/// [`exact`] when every row keeps the same tokens (SparF with a page cap keeps every token
/// of the pages read): each kept token's K row is scored against all query rows at once,
/// and each page's run of kept V rows is summed into every row with the blocked kernels
/// dense attention uses.
#[allow(clippy::too_many_arguments)]
fn exact_shared(
    head: &dyn HeadPages,
    qd: &[f64],
    scale: f64,
    toks: &[usize],
    groups: &[usize],
    mix: Option<(&[f64], &[f64])>,
    out: &mut [f32],
    lse: Option<&mut [f64]>,
) -> Result<Loaded, KvError> {
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let rows = qd.len() / hd;
    let m = toks.len();
    let mut pages = PagedRows::new(head, groups);
    let mut scores = vec![0f64; rows * m];
    let mut dots = vec![0f64; rows];
    pages.pass(Kind::K, |batch, buf| {
        for (&group, page) in batch.iter().zip(buf.chunks_exact(tpp * hd)) {
            let base = group * tpp;
            let sp = span(toks, base, base + tpp);
            if let Some(first) = one_run(toks, &sp, base) {
                // The page's kept tokens are one run of its rows: scored in one call.
                score_run(qd, &page[first * hd..(first + sp.len()) * hd], hd, scale, &mut scores[sp.start..], m);
                continue;
            }
            for i in sp {
                dot_rows(qd, &page[(toks[i] - base) * hd..][..hd], &mut dots);
                for (row, d) in dots.iter().enumerate() {
                    scores[row * m + i] = d * scale;
                }
            }
        }
    })?;
    let (sums, lses): (Vec<f64>, Vec<f64>) = scores.chunks_exact_mut(m.max(1)).map(exp_shifted_lse).unzip();
    if let Some(lse) = lse {
        lse.copy_from_slice(&lses);
    }
    let mut acc = vec![0f64; rows * hd];
    pages.pass(Kind::V, |batch, buf| {
        for (&group, page) in batch.iter().zip(buf.chunks_exact(tpp * hd)) {
            let base = group * tpp;
            let sp = span(toks, base, base + tpp);
            if let Some(first) = one_run(toks, &sp, base) {
                // The page's kept tokens are one run of its rows.
                let v = &page[first * hd..(first + sp.len()) * hd];
                for (row, a) in acc.chunks_exact_mut(hd).enumerate() {
                    axpy_rows(a, &scores[row * m + sp.start..row * m + sp.end], v);
                }
            } else {
                for i in sp {
                    let v = &page[(toks[i] - base) * hd..][..hd];
                    for (row, a) in acc.chunks_exact_mut(hd).enumerate() {
                        axpy(a, scores[row * m + i], v);
                    }
                }
            }
        }
    })?;
    finish(hd, &acc, &sums, mix, out);
    Ok(pages.loaded)
}

/// When the kept tokens `toks[sp]` (ascending, on the page from token `base`) are one
/// run of the page's rows, the first row of the run; None for an empty span or one with
/// gaps.
fn one_run(toks: &[usize], sp: &Range<usize>, base: usize) -> Option<usize> {
    let first = toks[sp.clone()].first()? - base;
    (toks[sp.end - 1] - base == first + sp.len() - 1).then_some(first)
}

/// Step 11 for every row: `out = α · acc / sum + (1 − α) · mean(V)`, or `acc / sum`.
fn finish(hd: usize, acc: &[f64], sums: &[f64], mix: Option<(&[f64], &[f64])>, out: &mut [f32]) {
    for (row, ((o, a), sum)) in out.chunks_exact_mut(hd).zip(acc.chunks_exact(hd)).zip(sums).enumerate() {
        match mix {
            Some((mean, alpha)) => {
                let alpha = alpha[row];
                o.iter_mut().zip(a).zip(mean).for_each(|((o, a), m)| *o = (alpha * (a / sum) + (1.0 - alpha) * m) as f32)
            }
            None => o.iter_mut().zip(a).for_each(|(o, a)| *o = (a / sum) as f32),
        }
    }
}

/// SparF's first phase over a part of a sequence split across targets: the shared choice
/// of `r` components, their dimension groups loaded, and per query row and token group the
/// log of the group's approximate mass, `log Σ_{t ∈ group} exp(ŝ_t)` with `ŝ` before the
/// softmax. Every part's logits share one temperature per row (it depends on the query
/// alone), so a host holding every part's masses normalises them over the whole sequence
/// and ranks the pages as one target holding it all would. `rows × groups` values.
///
/// With `given` (reduced queries), `q` holds each row's values at the components
/// `given.0` only, and `given.1` each row's `‖q‖₁`: the same masses as the full queries.
pub(super) fn page_log_mass(head: &dyn HeadPages, q: &[f32], scale: f64, r: usize, given: Option<(&[usize], &[f64])>) -> Result<(Vec<f64>, Loaded), KvError> {
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let n = head.tokens();
    let qd: Vec<f64> = match given {
        // Each row's values back at their components, zero elsewhere (never read).
        Some((dims, _)) => {
            let mut full = vec![0f64; q.len() / dims.len().max(1) * hd];
            for (row, vals) in full.chunks_exact_mut(hd).zip(q.chunks_exact(dims.len().max(1))) {
                dims.iter().zip(vals).for_each(|(&d, &x)| row[d] = f64::from(x));
            }
            full
        }
        None => q.iter().map(|&x| f64::from(x)).collect(),
    };
    let mut loaded = Loaded::default();
    if n == 0 {
        return Ok((Vec::new(), loaded));
    }
    let (_, mut shat) = approx_logits_given(head, &qd, scale, r.min(hd), true, given, &mut loaded)?;
    let mut masses = Vec::with_capacity(shat.len() / n.max(1) * layout.token_groups(n));
    for s in shat.chunks_exact_mut(n) {
        masses.extend(s.chunks_mut(tpp).map(approx::log_sum_exp));
    }
    Ok((masses, loaded))
}

/// SparF's second phase over a part: exact attention of every row over every token of the
/// token groups `groups` (ascending, chosen by the host), with each row's log-sum-exp.
pub(super) fn attend_groups(head: &dyn HeadPages, q: &[f32], scale: f64, groups: &[usize], out: &mut [f32], lse: &mut [f64]) -> Result<AttendStats, KvError> {
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let n = head.tokens();
    let qd: Vec<f64> = q.iter().map(|&x| f64::from(x)).collect();
    let toks: Vec<usize> = groups.iter().flat_map(|&g| g * tpp..n.min((g + 1) * tpp)).collect();
    let rows = qd.len() / hd;
    if toks.is_empty() {
        out.fill(0.0);
        lse.fill(f64::NEG_INFINITY);
        return Ok(AttendStats::default());
    }
    let toks = vec![toks; rows];
    let loaded = exact(head, &qd, scale, &toks, groups, None, out, Some(lse))?;
    Ok(AttendStats { pages_read: loaded.pages, media_bytes: loaded.bytes, rows_used: 2 * toks[0].len() as u64, drive_wait_ns: 0 })
}
