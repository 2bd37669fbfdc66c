// SPDX-License-Identifier: Apache-2.0
//! Decode-phase attention over a head's pages: dense, and SparF (InstInfer Algorithm 1).
//!
//! Everything reads the cache through [`HeadPages`], a page at a time, and loads each page
//! at most once per call however many query rows (grouped-query attention) share the head.
//! Dot products, softmax and the weighted sums of V are accumulated in f64 from the f32 rows:
//! the host checks generated tokens against a PyTorch reference, and an f32 running sum over
//! tens of thousands of tokens drifts far enough to flip an argmax now and then. SparF's
//! approximate scores, which only choose what to read, are f32 (see `approx`).
//!
//! * `dense` reads every token-indexed K page, then every V page (two passes, so the softmax
//!   is exact rather than rescaled online).
//! * `sparse` runs SparF and SparQ; they differ only in how media reads are counted.
//! * `kernels` holds the vectorisable loops and the top-k selection both use.
//! * `approx` holds SparF's approximate pass, in f32: it only ranks pages and tokens.

mod approx;
mod dense;
mod kernels;
#[cfg(test)]
mod partial_tests;
mod sparse;
#[cfg(test)]
mod sparse_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

use rayon::prelude::*;

use crate::{AttendStats, HeadPages, Kind, KvError, Loaded};

pub use insitu_proto::attention::Method;

/// One head's work in a batch: its cache, the `group` query rows that share it (grouped-query
/// attention), and where the outputs go (`group * head_dim` each).
pub struct Task<'a> {
    /// The head's cache.
    pub head: &'a dyn HeadPages,
    /// Query rows, `group * head_dim`.
    pub q: &'a [f32],
    /// Output rows, `group * head_dim`.
    pub out: &'a mut [f32],
    /// With room for one value per query row: a partial result (see [`attend_partial`]).
    pub lse: Option<&'a mut [f64]>,
}

/// Attention of `q` (`group` query rows of `head_dim`) over one head's cache into `out`, with
/// scores scaled by `scale` (1/sqrt(head_dim) for most models).
///
/// Each query row is computed on its own (with SparF/SparQ it makes its own selections), but
/// a page that several rows need is loaded and counted once. The stats count flash pages and
/// media bytes as the store reports them (SparQ: element-granular, see [`Method::SparQ`]) and
/// the distinct K and V token rows that entered the computation.
///
/// Returns [`KvError::BadRequest`] when `q` is empty or not whole rows, `out` is not the
/// size of `q`, `q` or `scale` is not finite, `r` or `k` is 0, or the cache has no tokens;
/// errors of the store are passed on. `out` is unspecified after an error.
pub fn attend(head: &dyn HeadPages, q: &[f32], scale: f32, method: Method, out: &mut [f32]) -> Result<AttendStats, KvError> {
    attend_rows(head, q, scale, method, out, None)
}

/// [`attend`] as one part of an attention whose tokens are split over several caches
/// (split-K): also writes each query row's log-sum-exp of the scaled scores it attended
/// over into `lse` (one per row), by which the host merges the parts exactly. An empty
/// cache is an empty part (outputs 0, log-sum-exp −∞), not an error. A sparse method must
/// leave out the mean of V (`mean_v` false): that mix weighs the whole sequence, which
/// one part does not hold.
pub fn attend_partial(head: &dyn HeadPages, q: &[f32], scale: f32, method: Method, out: &mut [f32], lse: &mut [f64]) -> Result<AttendStats, KvError> {
    attend_rows(head, q, scale, method, out, Some(lse))
}

fn attend_rows(head: &dyn HeadPages, q: &[f32], scale: f32, method: Method, out: &mut [f32], lse: Option<&mut [f64]>) -> Result<AttendStats, KvError> {
    let layout = head.layout();
    let hd = layout.head_dim;
    if q.is_empty() || !q.len().is_multiple_of(hd) {
        return Err(bad(format!("query of {} elements is not whole rows of {hd}", q.len())));
    }
    if out.len() != q.len() {
        return Err(bad(format!("output of {} elements for a query of {}", out.len(), q.len())));
    }
    if !scale.is_finite() || !q.iter().all(|x| x.is_finite()) {
        return Err(bad("the query and the scale must be finite".into()));
    }
    let rows = q.len() / hd;
    if let Some(lse) = &lse {
        if lse.len() != rows {
            return Err(bad(format!("{} log-sum-exp slots for {rows} query rows", lse.len())));
        }
    }
    let (r, k, local, count, budget, mean_v) = match method {
        Method::Dense => (0, 0, 0, Count::Pages, 0, false),
        Method::SparF { r, k, local, pages, mean_v } => (r, k, local, Count::Pages, pages, mean_v),
        Method::SparQ { r, k, local, mean_v } => (r, k, local, Count::Elements, 0, mean_v),
    };
    if method != Method::Dense && (r == 0 || k == 0) {
        return Err(bad(format!("sparse attention needs r and k above 0 (got r = {r}, k = {k})")));
    }
    if mean_v && lse.is_some() {
        return Err(bad("a partial result cannot mix in the mean of V (set flag bit 1: the kept tokens carry all the weight)".into()));
    }
    let tokens = head.tokens();
    if tokens == 0 {
        let Some(lse) = lse else {
            return Err(bad("attention over an empty cache (append the current token first)".into()));
        };
        out.fill(0.0);
        lse.fill(f64::NEG_INFINITY);
        return Ok(AttendStats::default());
    }
    if method == Method::Dense || k >= tokens {
        // Every token is kept, so α = 1 and the approximate scores change nothing: the
        // exact result, without reading the dimension-indexed copy at all.
        let stats = dense::attend(head, q, f64::from(scale), out, lse)?;
        return Ok(match count {
            Count::Pages => stats,
            Count::Elements => element_stats(layout, 0, tokens, stats.rows_used / 2),
        });
    }
    let plan = sparse::Plan { r: r.min(hd), k, local: local.min(tokens), count, budget, mean_v };
    sparse::attend(head, q, f64::from(scale), plan, out, lse)
}

/// SparF's first phase over one part of a sequence whose tokens are split over several
/// caches: `q`'s rows (one KV head's query rows) choose `r` components together, the
/// dimension groups holding them are read, and the result holds, per row and token group
/// (`rows × token groups` values, row-major), the log of the group's approximate mass
/// `log Σ exp(ŝ_t)` over its tokens, `ŝ` the temperature-scaled partial scores before the
/// softmax. The host normalises every part's masses over the whole sequence and picks the
/// pages for [`attend_groups`]: the pages SparF reads are then chosen over the whole
/// sequence, as on one cache holding it all, however many parts it is split into.
/// An empty cache gives no values.
pub fn page_log_mass(head: &dyn HeadPages, q: &[f32], scale: f32, r: usize) -> Result<(Vec<f64>, AttendStats), KvError> {
    check_query(head, q, scale)?;
    if r == 0 {
        return Err(bad("page scores need r above 0".into()));
    }
    let (masses, loaded) = sparse::page_log_mass(head, q, f64::from(scale), r, None)?;
    Ok((masses, AttendStats { pages_read: loaded.pages, media_bytes: loaded.bytes, rows_used: 0, drive_wait_ns: 0 }))
}

/// SparF's step 1 made on the host for [`page_log_mass_reduced`]: for queries `q`
/// (`[entries · kv_heads][group][head_dim]`, as the target decodes them) the `r`
/// components each (entry, KV head)'s rows share, `[entries · kv_heads][r]`, the rows'
/// values at them, `[..][group][r]`, and each row's `‖q‖₁`: what a page-scores request
/// needs of the queries, computed as the target computes it from the full ones.
pub fn reduce_queries(q: &[f32], group: usize, head_dim: usize, r: usize) -> (Vec<usize>, Vec<f32>, Vec<f64>) {
    let r = r.clamp(1, head_dim);
    let (mut dims, mut vals, mut l1) = (Vec::new(), Vec::new(), Vec::new());
    for rows in q.chunks_exact(group * head_dim) {
        let qd: Vec<f64> = rows.iter().map(|&x| f64::from(x)).collect();
        let chosen = sparse::shared_components(&qd, head_dim, r);
        for row in qd.chunks_exact(head_dim) {
            vals.extend(chosen.iter().map(|&d| row[d] as f32));
            l1.push(sparse::l1_norm(row));
        }
        dims.extend(chosen);
    }
    (dims, vals, l1)
}

/// [`page_log_mass`] from reduced queries: `q` holds each row's values at the `dims`
/// (strictly ascending, the components the rows share, as SparF's step 1 picks them from
/// the full queries) and `l1` each row's `‖q‖₁` over all components. The masses are those
/// of the full queries: only these components and norms enter them.
pub fn page_log_mass_reduced(head: &dyn HeadPages, q: &[f32], dims: &[usize], l1: &[f64], scale: f32) -> Result<(Vec<f64>, AttendStats), KvError> {
    insitu_proto::attention::check_components(dims, head.layout().head_dim)?;
    if q.len() != l1.len() * dims.len() {
        return Err(bad(format!("{} reduced query values for {} rows of {} components", q.len(), l1.len(), dims.len())));
    }
    if !scale.is_finite() || !q.iter().all(|x| x.is_finite()) {
        return Err(bad("the query and the scale must be finite".into()));
    }
    let (masses, loaded) = sparse::page_log_mass(head, q, f64::from(scale), dims.len(), Some((dims, l1)))?;
    Ok((masses, AttendStats { pages_read: loaded.pages, media_bytes: loaded.bytes, rows_used: 0, drive_wait_ns: 0 }))
}

/// SparF's second phase over one part: exact attention of every row of `q` over every
/// token of the token groups `groups` (strictly ascending, each below the cache's group
/// count), with each row's log-sum-exp into `lse` (a part: an empty list gives outputs 0
/// and log-sum-exp −∞).
pub fn attend_groups(head: &dyn HeadPages, q: &[f32], scale: f32, groups: &[usize], out: &mut [f32], lse: &mut [f64]) -> Result<AttendStats, KvError> {
    check_query(head, q, scale)?;
    let rows = q.len() / head.layout().head_dim;
    if out.len() != q.len() || lse.len() != rows {
        return Err(bad(format!("{} outputs and {} log-sum-exp slots for {rows} query rows", out.len(), lse.len())));
    }
    let have = head.layout().token_groups(head.tokens());
    if groups.windows(2).any(|w| w[0] >= w[1]) || groups.last().is_some_and(|&g| g >= have) {
        return Err(bad(format!("token groups {groups:?} are not ascending below {have}, the groups this part holds")));
    }
    sparse::attend_groups(head, q, f64::from(scale), groups, out, lse)
}

fn check_query(head: &dyn HeadPages, q: &[f32], scale: f32) -> Result<(), KvError> {
    let hd = head.layout().head_dim;
    if q.is_empty() || !q.len().is_multiple_of(hd) {
        return Err(bad(format!("query of {} elements is not whole rows of {hd}", q.len())));
    }
    if !scale.is_finite() || !q.iter().all(|x| x.is_finite()) {
        return Err(bad("the query and the scale must be finite".into()));
    }
    Ok(())
}

/// Runs every task, in parallel over heads; the stats are summed.
///
/// Every task runs even when one fails; the error returned is that of the first failing
/// task in `tasks` order, and the outputs of the other tasks are then still valid.
pub fn attend_all(tasks: Vec<Task<'_>>, scale: f32, method: Method) -> Result<AttendStats, KvError> {
    sum_stats(tasks.into_par_iter().map(|t| attend_task(t, scale, method)).collect())
}

/// One task of [`attend_all`].
pub(crate) fn attend_task(t: Task<'_>, scale: f32, method: Method) -> Result<AttendStats, KvError> {
    attend_rows(t.head, t.q, scale, method, t.out, t.lse)
}

/// The sum of every task's stats, or the first task's error (in task order).
pub(crate) fn sum_stats(results: Vec<Result<AttendStats, KvError>>) -> Result<AttendStats, KvError> {
    let mut total = AttendStats::default();
    for r in results {
        total += r?;
    }
    Ok(total)
}

/// How a sparse call reports its media reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// What the store's pages cost (SparF).
    Pages,
    /// Only the elements used, as a store without page groups would read them (SparQ).
    Elements,
}

fn bad(msg: String) -> KvError {
    KvError::BadRequest(msg)
}

/// The stats of an element-granular read of `dims` whole dimensions of K (all tokens) and
/// `rows` token rows of both K and V: bytes are elements times the element size, pages
/// what those bytes would fill.
fn element_stats(layout: &crate::Layout, dims: usize, tokens: usize, rows: u64) -> AttendStats {
    let size = layout.dtype.size() as u64;
    let elements = (dims * tokens) as u64 + 2 * rows * layout.head_dim as u64;
    let bytes = elements * size;
    AttendStats { pages_read: bytes.div_ceil(layout.page_bytes as u64), media_bytes: bytes, rows_used: 2 * rows, drive_wait_ns: 0 }
}

/// Token groups loaded per batch of reads: enough for a drive to overlap them over its
/// dies (4,096 tokens of a 64-element f32 head), few enough that a long context's rows
/// need not all be held at once.
pub(crate) const GROUPS_PER_BATCH: usize = 256;

/// The K and V rows of some token groups, for an attention's two passes (K for the scores,
/// then V for the weighted sum). When the groups fit in one batch, K and V are read
/// together, one wait on the drive instead of two; otherwise each pass reads its kind
/// batch by batch.
pub(super) struct PagedRows<'a> {
    head: &'a dyn HeadPages,
    groups: &'a [usize],
    buf: Scratch,
    together: bool,
    /// What the reads cost so far.
    pub loaded: Loaded,
}

impl<'a> PagedRows<'a> {
    /// Rows of `groups` (ascending) of `head`; nothing is read yet.
    pub fn new(head: &'a dyn HeadPages, groups: &'a [usize]) -> Self {
        let per = head.layout().tokens_per_page * head.layout().head_dim;
        let together = groups.len() <= GROUPS_PER_BATCH;
        let slots = if together { 2 * groups.len() } else { GROUPS_PER_BATCH };
        PagedRows { head, groups, buf: Scratch::take(slots * per), together, loaded: Loaded::default() }
    }

    /// Hands `each` every batch of groups with its `kind` rows (group `batch[i]` from row
    /// `i * tokens_per_page`). K's pass must come first.
    pub fn pass(&mut self, kind: Kind, mut each: impl FnMut(&[usize], &[f32])) -> Result<(), KvError> {
        let per = self.head.layout().tokens_per_page * self.head.layout().head_dim;
        if self.together {
            if kind == Kind::K {
                let (rows, loaded) = self.head.load_token_groups_kv(self.groups, &mut self.buf)?;
                check_rows(self.head, Kind::K, self.groups, &rows)?;
                self.loaded += loaded;
            }
            let half = self.groups.len() * per;
            let rows = if kind == Kind::K { &self.buf[..half] } else { &self.buf[half..] };
            each(self.groups, rows);
            return Ok(());
        }
        for batch in self.groups.chunks(GROUPS_PER_BATCH) {
            let (rows, loaded) = self.head.load_token_groups(kind, batch, &mut self.buf)?;
            check_rows(self.head, kind, batch, &rows)?;
            self.loaded += loaded;
            each(batch, &self.buf);
        }
        Ok(())
    }
}

thread_local! {
    /// Buffers this thread's attention has read pages into, kept for its next calls.
    static SCRATCH: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most elements of a buffer [`SCRATCH`] keeps (a dense read of more than 4,096 tokens
/// of 64-element heads gets one of its own): a thread keeps two of at most 2 MiB.
const SCRATCH_KEPT: usize = 1 << 19;

/// A buffer for the store to fill with rows before any is read, taken from the thread's
/// [`SCRATCH`] and given back when dropped.
///
/// The pages of a decode step are about a quarter of what a SparF call touches; a fresh
/// zeroed buffer per call made the allocator and `memset` a tenth of the engine's time.
/// What a buffer holds before it is filled is whatever an earlier call left there: callers
/// read only the rows the store reports it wrote ([`check_rows`]).
pub(super) struct Scratch {
    buf: Vec<f32>,
    len: usize,
}

impl Scratch {
    /// A buffer of `len` elements.
    pub fn take(len: usize) -> Scratch {
        let mut buf = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        Scratch { buf, len }
    }
}

impl std::ops::Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.buf.len() <= SCRATCH_KEPT {
            let buf = std::mem::take(&mut self.buf);
            // A thread exiting has no pool left to keep it in.
            let _ = SCRATCH.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < 2 {
                    s.push(buf);
                }
            });
        }
    }
}

/// Checks that the store gave each group the rows the layout implies: a short page would
/// otherwise pair scores with the wrong tokens.
fn check_rows(head: &dyn HeadPages, kind: Kind, groups: &[usize], rows: &[usize]) -> Result<(), KvError> {
    let tpp = head.layout().tokens_per_page;
    for (&group, &rows) in groups.iter().zip(rows) {
        let want = tpp.min(head.tokens() - group * tpp);
        if rows != want {
            return Err(KvError::invalid_data(format!("{kind:?} token group {group} gave {rows} rows, {want} expected")));
        }
    }
    Ok(())
}

/// The mean of V (`v_sum / tokens`), checked against the head size.
fn v_mean(head: &dyn HeadPages) -> Result<Vec<f64>, KvError> {
    let sum = head.v_sum();
    if sum.len() != head.layout().head_dim {
        return Err(KvError::invalid_data(format!("the V sum has {} elements for a head of {}", sum.len(), head.layout().head_dim)));
    }
    let n = head.tokens() as f64;
    Ok(sum.into_iter().map(|s| s / n).collect())
}
