// SPDX-License-Identifier: Apache-2.0
//! Exact attention over every token.
//!
//! Two passes: every K page (scores of all query rows), then every V page (weighted sums),
//! read as [`PagedRows`] (K and V in one batch of reads when they fit in one).
//! Holding one score per token and row costs 8 bytes per token and row, little next to the
//! cache, and keeps the softmax exact instead of rescaled page after page.

use super::kernels::{axpy_rows, exp_shifted_lse, score_run};
use super::PagedRows;
use crate::{AttendStats, HeadPages, Kind, KvError};

/// Dense attention of the `q.len() / head_dim` rows of `q` into `out`, and each row's
/// log-sum-exp into `lse` when given (shapes checked by the caller).
pub(super) fn attend(head: &dyn HeadPages, q: &[f32], scale: f64, out: &mut [f32], lse: Option<&mut [f64]>) -> Result<AttendStats, KvError> {
    let layout = *head.layout();
    let (hd, tpp) = (layout.head_dim, layout.tokens_per_page);
    let tokens = head.tokens();
    let rows = q.len() / hd;
    let qd: Vec<f64> = q.iter().map(|&x| f64::from(x)).collect();
    let all: Vec<usize> = (0..layout.token_groups(tokens)).collect();
    let mut pages = PagedRows::new(head, &all);

    // Pass 1: scores[row * tokens + t] = q_row · k_t * scale.
    let mut scores = vec![0f64; rows * tokens];
    pages.pass(Kind::K, |batch, buf| {
        // The batch's groups are consecutive: its rows are tokens base.. in order.
        let base = batch[0] * tpp;
        let n = tokens.min(base + batch.len() * tpp) - base;
        score_run(&qd, &buf[..n * hd], hd, scale, &mut scores[base..], tokens);
    })?;
    // Unnormalised weights; the division by their sum happens once per output element.
    let (sums, lses): (Vec<f64>, Vec<f64>) = scores.chunks_exact_mut(tokens).map(exp_shifted_lse).unzip();
    if let Some(lse) = lse {
        lse.copy_from_slice(&lses);
    }

    // Pass 2: acc_row = Σ_t w_row,t v_t.
    let mut acc = vec![0f64; rows * hd];
    pages.pass(Kind::V, |batch, buf| {
        let base = batch[0] * tpp;
        let n = tokens.min(base + batch.len() * tpp) - base;
        for (row, a) in acc.chunks_exact_mut(hd).enumerate() {
            axpy_rows(a, &scores[row * tokens + base..][..n], &buf[..n * hd]);
        }
    })?;
    for ((o, a), sum) in out.chunks_exact_mut(hd).zip(acc.chunks_exact(hd)).zip(sums) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = (a / sum) as f32;
        }
    }
    Ok(AttendStats { pages_read: pages.loaded.pages, media_bytes: pages.loaded.bytes, rows_used: 2 * tokens as u64, drive_wait_ns: 0 })
}
