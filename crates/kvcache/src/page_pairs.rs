// SPDX-License-Identifier: Apache-2.0
//! A head whose pages the host has already read: page pairs (a K page, then the V page of
//! the same tokens) in a buffer, then a tail of rows not yet on whole pages.
//!
//! This is how an offloading host (FlexGen) holds a layer it read back from storage. The
//! engine's kernels then attend over it on the host exactly as they attend over a target's
//! pages, so a baseline that moves the cache to the host computes what the in-storage
//! engine computes, at the same cost per element: the two differ only in where it runs.

use crate::store::decode;
use crate::{HeadPages, Kind, KvError, Layout, Loaded};

/// One KV head as page pairs in host memory and a tail of f32 rows.
pub struct PagePairs<'a> {
    layout: Layout,
    pairs: &'a [u8],
    tail_k: &'a [f32],
    tail_v: &'a [f32],
}

impl<'a> PagePairs<'a> {
    /// The head held in `pairs` (whole page pairs of `layout`: `[K page g][V page g]` for
    /// `g = 0, 1, …`, little-endian elements of its dtype) followed by the rows of `tail_k`
    /// and `tail_v` (f32, whole rows, as many in each). An error when they are not whole.
    pub fn new(layout: Layout, pairs: &'a [u8], tail_k: &'a [f32], tail_v: &'a [f32]) -> Result<PagePairs<'a>, KvError> {
        let hd = layout.head_dim;
        if !pairs.len().is_multiple_of(2 * layout.page_bytes) {
            return Err(KvError::BadRequest(format!("{} bytes are not whole pairs of {}-byte pages", pairs.len(), layout.page_bytes)));
        }
        if tail_k.len() != tail_v.len() || !tail_k.len().is_multiple_of(hd) {
            return Err(KvError::BadRequest(format!("a tail of {} K and {} V values is not whole rows of {hd} of each", tail_k.len(), tail_v.len())));
        }
        Ok(PagePairs { layout, pairs, tail_k, tail_v })
    }

    /// Token groups held in page pairs.
    fn paged_groups(&self) -> usize {
        self.pairs.len() / (2 * self.layout.page_bytes)
    }
}

impl HeadPages for PagePairs<'_> {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn tokens(&self) -> usize {
        self.paged_groups() * self.layout.tokens_per_page + self.tail_k.len() / self.layout.head_dim
    }

    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, Loaded), KvError> {
        let (hd, tpp, page) = (self.layout.head_dim, self.layout.tokens_per_page, self.layout.page_bytes);
        let paged = self.paged_groups();
        if group < paged {
            let at = (2 * group + usize::from(kind == Kind::V)) * page;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::testutil::{MemHead, Rng};
    use crate::{attend_partial, Dtype, Method};

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
}
