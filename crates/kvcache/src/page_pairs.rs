// SPDX-License-Identifier: Apache-2.0
//! Heads whose pages the host has already read: page pairs (a K page, then the V page of
//! the same tokens) in a buffer, then a tail of rows not yet on whole pages; and, for
//! SparF's first step, the dimension-indexed runs of the components it chose.
//!
//! This is how an offloading host (FlexGen) holds a layer it read back from storage. The
//! engine's kernels then attend over it on the host exactly as they attend over a target's
//! pages, so a baseline that moves the cache to the host computes what the in-storage
//! engine computes, at the same cost per element: the two differ only in where it runs.

use crate::store::decode;
use crate::{HeadPages, Kind, KvError, Layout, Loaded};

/// One KV head as page pairs in host memory and a tail of f32 rows: every pair of the
/// paged tokens ([`PagePairs::new`]), or only those of the token groups SparF chose
/// ([`PagePairs::chosen`]).
pub struct PagePairs<'a> {
    layout: Layout,
    pairs: &'a [u8],
    /// The groups whose pairs `pairs` holds, ascending; None: `0..paged`.
    groups: Option<&'a [usize]>,
    /// Token groups on whole pages (before the tail).
    paged: usize,
    tail_k: &'a [f32],
    tail_v: &'a [f32],
}

fn bad(msg: String) -> KvError {
    KvError::BadRequest(msg)
}

impl<'a> PagePairs<'a> {
    /// The head held in `pairs` (whole page pairs of `layout`: `[K page g][V page g]` for
    /// `g = 0, 1, …`, little-endian elements of its dtype) followed by the rows of `tail_k`
    /// and `tail_v` (f32, whole rows, as many in each). An error when they are not whole.
    pub fn new(layout: Layout, pairs: &'a [u8], tail_k: &'a [f32], tail_v: &'a [f32]) -> Result<PagePairs<'a>, KvError> {
        if !pairs.len().is_multiple_of(2 * layout.page_bytes) {
            return Err(bad(format!("{} bytes are not whole pairs of {}-byte pages", pairs.len(), layout.page_bytes)));
        }
        PagePairs::build(layout, pairs, None, pairs.len() / (2 * layout.page_bytes), tail_k, tail_v)
    }

    /// A head of `paged` token groups on pages and the tail after them, of which the host
    /// read only the pairs of `groups` (strictly ascending, each below `paged`), into
    /// `pairs` in that order: what SparF's second step attends over.
    pub fn chosen(layout: Layout, pairs: &'a [u8], groups: &'a [usize], paged: usize, tail_k: &'a [f32], tail_v: &'a [f32]) -> Result<PagePairs<'a>, KvError> {
        if groups.windows(2).any(|w| w[0] >= w[1]) || groups.last().is_some_and(|&g| g >= paged) {
            return Err(bad(format!("token groups {groups:?} are not ascending below the {paged} on pages")));
        }
        if Some(pairs.len()) != groups.len().checked_mul(2 * layout.page_bytes) {
            return Err(bad(format!("{} bytes for the page pairs of {} token groups", pairs.len(), groups.len())));
        }
        PagePairs::build(layout, pairs, Some(groups), paged, tail_k, tail_v)
    }

    fn build(
        layout: Layout,
        pairs: &'a [u8],
        groups: Option<&'a [usize]>,
        paged: usize,
        tail_k: &'a [f32],
        tail_v: &'a [f32],
    ) -> Result<PagePairs<'a>, KvError> {
        let hd = layout.head_dim;
        if tail_k.len() != tail_v.len() || !tail_k.len().is_multiple_of(hd) {
            return Err(bad(format!("a tail of {} K and {} V values is not whole rows of {hd} of each", tail_k.len(), tail_v.len())));
        }
        Ok(PagePairs { layout, pairs, groups, paged, tail_k, tail_v })
    }

    /// Where group `group`'s pair is in `pairs`, if it was read.
    fn pair_of(&self, group: usize) -> Option<usize> {
        match self.groups {
            None => Some(group),
            Some(groups) => groups.binary_search(&group).ok(),
        }
    }
}

impl HeadPages for PagePairs<'_> {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn tokens(&self) -> usize {
        self.paged * self.layout.tokens_per_page + self.tail_k.len() / self.layout.head_dim
    }

    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, Loaded), KvError> {
        let (hd, tpp, page) = (self.layout.head_dim, self.layout.tokens_per_page, self.layout.page_bytes);
        let paged = self.paged;
        if group < paged {
            let pair = self.pair_of(group).ok_or_else(|| bad(format!("token group {group} was not read")))?;
            let at = (2 * pair + usize::from(kind == Kind::V)) * page;
            decode(self.layout.dtype, &self.pairs[at..at + page], &mut out[..tpp * hd]);
            return Ok((tpp, Loaded { pages: 1, bytes: page as u64 }));
        }
        let tail = match kind {
            Kind::K => self.tail_k,
            Kind::V => self.tail_v,
        };
        let first = (group - paged) * tpp * hd;
        if first >= tail.len() {
            return Err(KvError::BadRequest(format!("token group {group} is past the end of {} tokens", self.tokens())));
        }
        let n = (tail.len() - first).min(tpp * hd);
        out[..n].copy_from_slice(&tail[first..first + n]);
        Ok((n / hd, Loaded::default()))
    }

    fn load_dim_group(&self, _group: usize, _out: &mut [f32]) -> Result<Loaded, KvError> {
        Err(KvError::BadRequest("page pairs hold no dimension-indexed pages (dense attention only)".into()))
    }

    /// Over the rows held: a head of [`PagePairs::chosen`] lacks the groups not read
    /// (SparF's second step never asks for it).
    fn v_sum(&self) -> Vec<f64> {
        let hd = self.layout.head_dim;
        let mut sum = vec![0f64; hd];
        let mut rows = vec![0f32; self.layout.tokens_per_page * hd];
        for g in 0..self.layout.token_groups(self.tokens()) {
            if let Ok((n, _)) = self.load_token_group(Kind::V, g, &mut rows) {
                for r in rows[..n * hd].chunks_exact(hd) {
                    sum.iter_mut().zip(r).for_each(|(s, &x)| *s += f64::from(x));
                }
            }
        }
        sum
    }
}

/// One KV head's dimension-indexed copy of K as the host read it for SparF's first step:
/// the runs of the components chosen, each the first `paged` tokens of one dimension
/// (little-endian elements of the layout's dtype), and the later tokens' values of those
/// components from the host's tail. Only [`HeadPages::load_dim_group`] of a chosen
/// component works (one dimension a group: `dims_per_page` must be 1).
pub struct DimRuns<'a> {
    layout: Layout,
    tokens: usize,
    dims: &'a [usize],
    runs: &'a [u8],
    stride: usize,
    paged: usize,
    tail: &'a [f32],
}

impl<'a> DimRuns<'a> {
    /// `tokens` tokens, of which the first `paged` are in `runs`: the run of `dims[i]`
    /// (strictly ascending) at byte `i * stride`; `tail` holds the rest, `[dims][tokens -
    /// paged]` as f32.
    pub fn new(layout: Layout, tokens: usize, dims: &'a [usize], runs: &'a [u8], stride: usize, paged: usize, tail: &'a [f32]) -> Result<DimRuns<'a>, KvError> {
        if layout.dims_per_page != 1 {
            return Err(bad(format!("dimension runs need one dimension a page, not {}", layout.dims_per_page)));
        }
        if dims.windows(2).any(|w| w[0] >= w[1]) || dims.last().is_some_and(|&d| d >= layout.head_dim) {
            return Err(bad(format!("components {dims:?} are not ascending below {}", layout.head_dim)));
        }
        let es = layout.dtype.size();
        let need = dims.len().saturating_sub(1).checked_mul(stride).and_then(|n| n.checked_add(paged.checked_mul(es)?));
        if paged > tokens || stride < paged.saturating_mul(es) || need.is_none_or(|need| runs.len() < need) {
            return Err(bad(format!("{} bytes do not hold {} runs of {paged} tokens {stride} bytes apart", runs.len(), dims.len())));
        }
        if Some(tail.len()) != dims.len().checked_mul(tokens - paged) {
            return Err(bad(format!("a tail of {} values for {} components of {} tokens", tail.len(), dims.len(), tokens - paged)));
        }
        Ok(DimRuns { layout, tokens, dims, runs, stride, paged, tail })
    }
}

impl HeadPages for DimRuns<'_> {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn tokens(&self) -> usize {
        self.tokens
    }

    fn load_token_group(&self, _kind: Kind, _group: usize, _out: &mut [f32]) -> Result<(usize, Loaded), KvError> {
        Err(bad("dimension runs hold no token pages (SparF's first step only)".into()))
    }

    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<Loaded, KvError> {
        let i = self.dims.binary_search(&group).map_err(|_| bad(format!("component {group} was not read")))?;
        let (es, n) = (self.layout.dtype.size(), self.tokens - self.paged);
        decode(self.layout.dtype, &self.runs[i * self.stride..][..self.paged * es], &mut out[..self.paged]);
        out[self.paged..self.tokens].copy_from_slice(&self.tail[i * n..(i + 1) * n]);
        let bytes = (self.paged * es) as u64;
        Ok(Loaded { pages: bytes.div_ceil(self.layout.page_bytes as u64), bytes })
    }

    /// Not held (V is not among the runs): zeros; SparF's first step never asks for it.
    fn v_sum(&self) -> Vec<f64> {
        vec![0.0; self.layout.head_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::testutil::{MemHead, Rng};
    use crate::{attend_groups, attend_partial, page_log_mass_reduced, reduce_queries, Dtype, Method};

    /// `rows` as little-endian `dtype` bytes.
    fn encode(dtype: Dtype, rows: &[f32]) -> Vec<u8> {
        match dtype {
            Dtype::F32 => rows.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::F16 => rows.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        }
    }

    /// The rows as the store keeps them: rounded to `dtype`.
    fn rounded(dtype: Dtype, rows: &[f32]) -> Vec<f32> {
        rows.iter().map(|&x| if dtype == Dtype::F16 { half::f16::from_f32(x).to_f32() } else { x }).collect()
    }

    #[test]
    fn attention_over_page_pairs_and_a_tail_is_attention_over_the_rows() {
        let mut rng = Rng::new(7);
        for dtype in [Dtype::F16, Dtype::F32] {
            let layout = Layout::new(16, dtype, 256, 1).unwrap();
            let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
            for (groups, tail) in [(0, 3), (1, 0), (3, 5), (2, 2 * tpp + 1)] {
                let n = groups * tpp;
                let (k, v) = (rounded(dtype, &rng.vec(n * hd)), rounded(dtype, &rng.vec(n * hd)));
                let (tk, tv) = (rng.vec(tail * hd), rng.vec(tail * hd));
                let mut pairs = Vec::new();
                for g in 0..groups {
                    pairs.extend(encode(dtype, &k[g * tpp * hd..][..tpp * hd]));
                    pairs.extend(encode(dtype, &v[g * tpp * hd..][..tpp * hd]));
                }
                let head = PagePairs::new(layout, &pairs, &tk, &tv).unwrap();
                let whole = MemHead::new(layout, [k.clone(), tk.clone()].concat(), [v.clone(), tv.clone()].concat());
                assert_eq!(head.tokens(), whole.tokens());
                assert_eq!(head.v_sum(), whole.v_sum());
                let q = rng.vec(3 * hd);
                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                let (mut la, mut lb) = (vec![0f64; 3], vec![0f64; 3]);
                attend_partial(&head, &q, 0.25, Method::Dense, &mut a, &mut la).unwrap();
                attend_partial(&whole, &q, 0.25, Method::Dense, &mut b, &mut lb).unwrap();
                assert_eq!((a, la), (b, lb), "{dtype:?}, {groups} page pairs and {tail} tail rows");
            }
        }
    }

    #[test]
    fn pieces_that_are_not_whole_are_refused() {
        let layout = Layout::new(16, Dtype::F16, 256, 1).unwrap();
        assert!(PagePairs::new(layout, &[0; 256], &[], &[]).is_err(), "half a pair");
        assert!(PagePairs::new(layout, &[], &[0.0; 16], &[]).is_err(), "K and V tails differ");
        assert!(PagePairs::new(layout, &[], &[0.0; 15], &[0.0; 15]).is_err(), "part of a row");
        let head = PagePairs::new(layout, &[0; 512], &[0.0; 16], &[0.0; 16]).unwrap();
        assert!(head.load_dim_group(0, &mut [0.0; 64]).is_err());
        assert!(head.load_token_group(Kind::K, 2, &mut [0.0; 256]).is_err());
    }

    #[test]
    fn the_chosen_pairs_attend_as_the_whole_head_over_those_groups() {
        let mut rng = Rng::new(11);
        for dtype in [Dtype::F16, Dtype::F32] {
            let layout = Layout::new(16, dtype, 256, 1).unwrap();
            let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
            let (paged, tail) = (6, 5);
            let n = paged * tpp;
            let (k, v) = (rounded(dtype, &rng.vec(n * hd)), rounded(dtype, &rng.vec(n * hd)));
            let (tk, tv) = (rng.vec(tail * hd), rng.vec(tail * hd));
            let whole = MemHead::new(layout, [k.clone(), tk.clone()].concat(), [v.clone(), tv.clone()].concat());
            for groups in [vec![0, 3, 6], vec![1, 2], vec![6], vec![0, 1, 2, 3, 4, 5, 6]] {
                let read: Vec<usize> = groups.iter().copied().filter(|&g| g < paged).collect();
                let mut pairs = Vec::new();
                for &g in &read {
                    pairs.extend(encode(dtype, &k[g * tpp * hd..][..tpp * hd]));
                    pairs.extend(encode(dtype, &v[g * tpp * hd..][..tpp * hd]));
                }
                let head = PagePairs::chosen(layout, &pairs, &read, paged, &tk, &tv).unwrap();
                assert_eq!(head.tokens(), whole.tokens());
                let q = rng.vec(3 * hd);
                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                let (mut la, mut lb) = (vec![0f64; 3], vec![0f64; 3]);
                attend_groups(&head, &q, 0.25, &groups, &mut a, &mut la).unwrap();
                attend_groups(&whole, &q, 0.25, &groups, &mut b, &mut lb).unwrap();
                assert_eq!((a, la), (b, lb), "{dtype:?}, groups {groups:?}");
            }
            let pairs = encode(dtype, &[k[..tpp * hd].to_vec(), v[..tpp * hd].to_vec()].concat());
            let head = PagePairs::chosen(layout, &pairs, &[0], paged, &tk, &tv).unwrap();
            let (mut o, mut l) = (vec![0f32; hd], vec![0f64; 1]);
            assert!(attend_groups(&head, &rng.vec(hd), 0.25, &[1], &mut o, &mut l).is_err(), "a group not read");
            assert!(PagePairs::chosen(layout, &pairs, &[2, 1], paged, &tk, &tv).is_err(), "not ascending");
            assert!(PagePairs::chosen(layout, &pairs, &[6], paged, &tk, &tv).is_err(), "not on a page");
            assert!(PagePairs::chosen(layout, &pairs, &[0, 1], paged, &tk, &tv).is_err(), "one pair for two groups");
        }
    }

    #[test]
    fn page_masses_from_the_chosen_runs_are_the_whole_heads() {
        let mut rng = Rng::new(12);
        for dtype in [Dtype::F16, Dtype::F32] {
            let layout = Layout::new(16, dtype, 256, 1).unwrap();
            let hd = layout.head_dim;
            for (paged, tokens) in [(0, 9), (128, 128), (128, 150), (64, 200)] {
                let k = rounded(dtype, &rng.vec(tokens * hd));
                let whole = MemHead::new(layout, k.clone(), rng.vec(tokens * hd));
                let q = rng.vec(3 * hd);
                let (dims, reduced, l1) = reduce_queries(&q, 3, hd, 4);
                // Each chosen dimension's run, 512 bytes apart, and the later tokens.
                let stride = 512;
                let mut runs = vec![0u8; dims.len() * stride];
                let mut tail = Vec::new();
                for (i, &d) in dims.iter().enumerate() {
                    let col: Vec<f32> = (0..tokens).map(|t| k[t * hd + d]).collect();
                    let bytes = encode(dtype, &col[..paged]);
                    runs[i * stride..][..bytes.len()].copy_from_slice(&bytes);
                    tail.extend(&col[paged..]);
                }
                let head = DimRuns::new(layout, tokens, &dims, &runs, stride, paged, &tail).unwrap();
                let got = page_log_mass_reduced(&head, &reduced, &dims, &l1, 0.25).unwrap().0;
                let want = page_log_mass_reduced(&whole, &reduced, &dims, &l1, 0.25).unwrap().0;
                assert_eq!(got, want, "{dtype:?}, {paged} of {tokens} tokens in runs");
            }
            assert!(DimRuns::new(layout, 4, &[3, 1], &[0; 64], 32, 4, &[]).is_err(), "not ascending");
            assert!(DimRuns::new(layout, 4, &[1], &[0; 4], 32, 4, &[]).is_err(), "a short run");
            assert!(DimRuns::new(layout, 6, &[1], &[0; 64], 32, 4, &[0.0]).is_err(), "a short tail");
            let head = DimRuns::new(layout, 4, &[1], &[0; 64], 32, 4, &[]).unwrap();
            assert!(head.load_dim_group(2, &mut [0.0; 4]).is_err(), "a component not read");
        }
    }
}
