// SPDX-License-Identifier: Apache-2.0
//! Decode-phase attention over a head's pages: dense, and SparF (InstInfer Algorithm 1).

use crate::{AttendStats, HeadPages, KvError};

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Every token: all token-indexed K and V pages are read.
    Dense,
    /// SparF: the `r` largest-magnitude query components select dimension-indexed K pages
    /// (approximate scores, L1-ratio scaled); the `k` best tokens (the last `local` tokens
    /// always among them) select token-indexed K and V pages; only selected units enter the
    /// computation (dual-step loading); the result is mixed with the mean of V by α.
    SparF {
        /// Query components kept.
        r: usize,
        /// Tokens kept.
        k: usize,
        /// Most recent tokens always kept.
        local: usize,
    },
    /// SparQ: the same selection and arithmetic as SparF, with media reads counted at element
    /// granularity, as a store without page groups would need (for comparison).
    SparQ {
        /// Query components kept.
        r: usize,
        /// Tokens kept.
        k: usize,
        /// Most recent tokens always kept.
        local: usize,
    },
}

/// One head's work in a batch: its cache, the `group` query rows that share it (grouped-query
/// attention), and where the outputs go (`group * head_dim` each).
pub struct Task<'a> {
    /// The head's cache.
    pub head: &'a dyn HeadPages,
    /// Query rows, `group * head_dim`.
    pub q: &'a [f32],
    /// Output rows, `group * head_dim`.
    pub out: &'a mut [f32],
}

/// Attention of `q` (`group` query rows of `head_dim`) over one head's cache into `out`, with
/// scores scaled by `scale` (1/sqrt(head_dim) for most models).
pub fn attend(head: &dyn HeadPages, q: &[f32], scale: f32, method: Method, out: &mut [f32]) -> Result<AttendStats, KvError> {
    let _ = (head, q, scale, method, out);
    todo!("attention engine")
}

/// Runs every task, in parallel over heads; the stats are summed.
pub fn attend_all(tasks: Vec<Task<'_>>, scale: f32, method: Method) -> Result<AttendStats, KvError> {
    let _ = (tasks, scale, method);
    todo!("attention engine")
}
