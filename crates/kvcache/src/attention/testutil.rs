// SPDX-License-Identifier: Apache-2.0
//! Test fakes: an in-memory head that counts pages as the store does, plain references of
//! dense attention and of Algorithm 1 (no pages, no vector tricks), and random data.

use std::sync::Mutex;

use super::{attend, Method};
use crate::{AttendStats, Dtype, HeadPages, Kind, KvError, Layout, Loaded};

/// One page read, as [`MemHead`] logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Read {
    /// A token-indexed page of K or V.
    Token(Kind, usize),
    /// A dimension group of K (one or more pages).
    Dim(usize),
}

/// K and V rows in memory. A token group costs one page, a dimension group one page per
/// `tokens_per_dim_page` tokens (rounded up); bytes are whole pages, as on flash.
pub struct MemHead {
    pub layout: Layout,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Every load, in order.
    pub reads: Mutex<Vec<Read>>,
}

impl MemHead {
    pub fn new(layout: Layout, k: Vec<f32>, v: Vec<f32>) -> MemHead {
        assert_eq!(k.len(), v.len());
        assert_eq!(k.len() % layout.head_dim, 0);
        MemHead { layout, k, v, reads: Mutex::new(Vec::new()) }
    }

    /// A head of `tokens` random rows.
    pub fn random(layout: Layout, tokens: usize, rng: &mut Rng) -> MemHead {
        let n = tokens * layout.head_dim;
        MemHead::new(layout, rng.vec(n), rng.vec(n))
    }

    pub fn take_reads(&self) -> Vec<Read> {
        std::mem::take(&mut self.reads.lock().unwrap())
    }

    /// Pages of one dimension group.
    pub fn dim_group_pages(&self) -> u64 {
        self.tokens().div_ceil(self.layout.tokens_per_dim_page) as u64
    }

    fn cost(&self, pages: u64) -> Loaded {
        Loaded { pages, bytes: pages * self.layout.page_bytes as u64 }
    }
}

impl HeadPages for MemHead {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn tokens(&self) -> usize {
        self.k.len() / self.layout.head_dim
    }

    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, Loaded), KvError> {
        let (hd, tpp) = (self.layout.head_dim, self.layout.tokens_per_page);
        let first = group * tpp;
        if first >= self.tokens() {
            return Err(KvError::BadRequest(format!("token group {group} is past the end")));
        }
        let rows = tpp.min(self.tokens() - first);
        let src = match kind {
            Kind::K => &self.k,
            Kind::V => &self.v,
        };
        out[..rows * hd].copy_from_slice(&src[first * hd..(first + rows) * hd]);
        self.reads.lock().unwrap().push(Read::Token(kind, group));
        Ok((rows, self.cost(1)))
    }

    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<Loaded, KvError> {
        let (hd, dpp, n) = (self.layout.head_dim, self.layout.dims_per_page, self.tokens());
        for j in 0..dpp {
            let d = group * dpp + j;
            for t in 0..n {
                out[j * n + t] = self.k[t * hd + d];
            }
        }
        self.reads.lock().unwrap().push(Read::Dim(group));
        Ok(self.cost(self.dim_group_pages()))
    }

    fn v_sum(&self) -> Vec<f64> {
        let hd = self.layout.head_dim;
        let mut s = vec![0f64; hd];
        for row in self.v.chunks_exact(hd) {
            for (s, v) in s.iter_mut().zip(row) {
                *s += f64::from(*v);
            }
        }
        s
    }
}

/// Plain softmax in f64.
fn softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

fn row(m: &[f32], hd: usize, t: usize) -> &[f32] {
    &m[t * hd..(t + 1) * hd]
}

pub fn dot(q: &[f32], k: &[f32]) -> f64 {
    q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum()
}

/// Softmax attention of one query row over the tokens `j` of `h`.
pub fn attention(h: &MemHead, q: &[f32], scale: f64, j: &[usize]) -> Vec<f64> {
    let hd = h.layout.head_dim;
    let s = softmax(&j.iter().map(|&t| dot(q, row(&h.k, hd, t)) * scale).collect::<Vec<_>>());
    let mut out = vec![0f64; hd];
    for (w, &t) in s.iter().zip(j) {
        for (o, v) in out.iter_mut().zip(row(&h.v, hd, t)) {
            *o += w * f64::from(*v);
        }
    }
    out
}

/// Exact attention of one query row.
pub fn dense_ref(h: &MemHead, q: &[f32], scale: f64) -> Vec<f64> {
    attention(h, q, scale, &(0..h.tokens()).collect::<Vec<_>>())
}

/// A token's approximate logit: `q[i] · k[i]` summed over the components `i` in f32, in
/// ascending order, times the temperature-scaled `factor` rounded to f32, as the engine
/// ranks pages and tokens.
fn approx_logit(q: &[f32], k: &[f32], i: &[usize], factor: f64) -> f64 {
    let mut s = 0f32;
    for &d in i {
        s += q[d] * k[d];
    }
    f64::from(s * factor as f32)
}

/// Outputs that mix in the mean of V by α, the approximate mass of the kept tokens, are
/// checked to this relative error: the engine sums α from f32 exponentials (a few parts
/// in 10^7), times a difference of V rows up to 2 apart, against the floor of 0.01.
pub const MIXED_TOL: f64 = 1e-4;

/// Algorithm 1 for one query row, straight from the paper: the output, the components kept
/// (`i`) and the tokens kept (`j`), both ascending.
pub fn sparf_ref(h: &MemHead, q: &[f32], scale: f64, r: usize, k: usize, local: usize) -> (Vec<f64>, Vec<usize>, Vec<usize>) {
    let (hd, n) = (h.layout.head_dim, h.tokens());
    // 1: argtopk(|q|, r), ties to the lower index.
    let mut i: Vec<usize> = (0..hd).collect();
    i.sort_by(|&a, &b| q[b].abs().total_cmp(&q[a].abs()).then(a.cmp(&b)));
    i.truncate(r.min(hd));
    i.sort();
    // 4: ŝ = softmax(q[i]·K[:, i] · scale / sqrt(|q[i]|_1 / |q|_1)).
    let l1: f64 = q.iter().map(|x| f64::from(x.abs())).sum();
    let l1_i: f64 = i.iter().map(|&d| f64::from(q[d].abs())).sum();
    let factor = if l1_i > 0.0 { scale / (l1_i / l1).sqrt() } else { scale };
    let s_hat = softmax(&(0..n).map(|t| approx_logit(q, &h.k[t * hd..(t + 1) * hd], &i, factor)).collect::<Vec<_>>());
    // 5-6: argtopk(ŝ + m, k), m = 1 on the last `local` tokens.
    let local = local.min(n);
    let is_local = |t: usize| t >= n - local;
    let mut j: Vec<usize> = (0..n).collect();
    j.sort_by(|&a, &b| is_local(b).cmp(&is_local(a)).then(s_hat[b].total_cmp(&s_hat[a])).then(a.cmp(&b)));
    j.truncate(k.min(n));
    j.sort();
    // 7: α = Σ ŝ[j].
    let alpha: f64 = j.iter().map(|&t| s_hat[t]).sum();
    // 10-11: out = α · softmax(q·K[j] · scale) · V[j] + (1 − α) · mean(V).
    let att = attention(h, q, scale, &j);
    let mean: Vec<f64> = h.v_sum().iter().map(|s| s / n as f64).collect();
    let out = att.iter().zip(&mean).map(|(a, m)| alpha * a + (1.0 - alpha) * m).collect();
    (out, i, j)
}

/// SparF with a page cap of `pages` for the query rows `q` of one KV head, written out
/// plainly: the rows share the `r` components of largest `Σ |q_row| / ‖q_row‖₁`; the pages
/// in reach are the first, the local tokens' and the `pages` others of largest page mass
/// (a row's ŝ summed over the page, the largest over the rows); each row keeps its `k`
/// best tokens in reach, the local ones first. Per row: the output, the components and the
/// tokens kept.
pub fn sparf_capped_ref(h: &MemHead, q: &[f32], scale: f64, (r, k, local, pages): (usize, usize, usize, usize)) -> Vec<(Vec<f64>, Vec<usize>, Vec<usize>)> {
    let (hd, n, tpp) = (h.layout.head_dim, h.tokens(), h.layout.tokens_per_page);
    let rows: Vec<&[f32]> = q.chunks(hd).collect();
    let mut weight = vec![0f64; hd];
    for qr in &rows {
        let l1: f64 = qr.iter().map(|x| f64::from(x.abs())).sum();
        if l1 > 0.0 {
            for d in 0..hd {
                weight[d] += f64::from(qr[d].abs()) / l1;
            }
        }
    }
    let mut i: Vec<usize> = (0..hd).collect();
    i.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    i.truncate(r.min(hd));
    i.sort();
    let s_hats: Vec<Vec<f64>> = rows
        .iter()
        .map(|qr| {
            let l1: f64 = qr.iter().map(|x| f64::from(x.abs())).sum();
            let l1_i: f64 = i.iter().map(|&d| f64::from(qr[d].abs())).sum();
            let factor = if l1_i > 0.0 { scale / (l1_i / l1).sqrt() } else { scale };
            softmax(&(0..n).map(|t| approx_logit(qr, &h.k[t * hd..(t + 1) * hd], &i, factor)).collect::<Vec<_>>())
        })
        .collect();
    let local = local.min(n);
    let groups = n.div_ceil(tpp);
    let local_from = if local > 0 { ((n - local) / tpp).min(groups) } else { groups };
    let mass = |g: usize| s_hats.iter().map(|s| s[g * tpp..n.min((g + 1) * tpp)].iter().fold(0.0, |a, &x| a + x)).fold(0.0, f64::max);
    let mut others: Vec<usize> = (1..local_from).collect();
    others.sort_by(|&a, &b| mass(b).total_cmp(&mass(a)).then(a.cmp(&b)));
    others.truncate(pages);
    let in_reach = |t: usize| t / tpp == 0 || t / tpp >= local_from || others.contains(&(t / tpp));
    let mean: Vec<f64> = h.v_sum().iter().map(|s| s / n as f64).collect();
    rows.iter()
        .zip(&s_hats)
        .map(|(qr, s_hat)| {
            let is_local = |t: usize| t >= n - local;
            let mut j: Vec<usize> = (0..n).filter(|&t| in_reach(t)).collect();
            j.sort_by(|&a, &b| is_local(b).cmp(&is_local(a)).then(s_hat[b].total_cmp(&s_hat[a])).then(a.cmp(&b)));
            j.truncate(k);
            j.sort();
            let alpha: f64 = j.iter().map(|&t| s_hat[t]).sum();
            let att = attention(h, qr, scale, &j);
            let out = att.iter().zip(&mean).map(|(a, m)| alpha * a + (1.0 - alpha) * m).collect();
            (out, i.clone(), j)
        })
        .collect()
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Asserts `got` (f32) is within `tol` of `want`, relative to `|want|` but at least 0.01:
/// outputs are averages of rows in [-1, 1], and relative error means nothing near 0.
pub fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(*g) - w).abs();
        assert!(err <= tol * w.abs().max(0.01), "{what}: element {i}: {g} vs {w} (error {err:e})");
    }
}

/// (head_dim, dtype, page bytes, dims per page): token pages of 4 to 32 tokens, dimension
/// pages of 32 to 1,024 tokens, so small caches still span several of both.
pub const SHAPES: [(usize, Dtype, usize, usize); 4] =
    [(16, Dtype::F32, 256, 2), (32, Dtype::F16, 512, 1), (64, Dtype::F32, 4096, 4), (128, Dtype::F16, 4096, 2)];

pub fn layout((hd, dtype, page, dpp): (usize, Dtype, usize, usize)) -> Layout {
    Layout::new(hd, dtype, page, dpp).unwrap()
}

/// One call of the engine, into a fresh output.
pub fn run(h: &MemHead, q: &[f32], scale: f32, m: Method) -> (Vec<f32>, AttendStats) {
    let mut out = vec![f32::NAN; q.len()];
    let stats = attend(h, q, scale, m, &mut out).unwrap();
    (out, stats)
}

/// The usual 1/sqrt(head_dim).
pub fn scale_of(h: &MemHead) -> f32 {
    1.0 / (h.layout.head_dim as f32).sqrt()
}
