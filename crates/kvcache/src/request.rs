// SPDX-License-Identifier: Apache-2.0
//! One KV_ATTEND request against the store: the decode step's appends, then every
//! (entry, KV head) attended on the store's threads, into the result the command returns.

use crate::{AttendStats, KvCache, KvError, Task};
use insitu_proto::attention::{Attend, AttendOptions, AttendResult};

impl KvCache {
    /// Runs a decoded attention request whose sequences the caller has checked against
    /// `a`'s shape (layer, KV heads, head size): appends the new token of every entry when
    /// the request carries one, then attends every KV head of every entry.
    ///
    /// With [`AttendOptions::partial`] the result carries each query row's log-sum-exp and
    /// an entry with no token here is an empty part rather than an error (split-K: the
    /// host holds each sequence's tokens on several targets and merges their parts).
    ///
    /// A sequence named twice is refused before anything is appended.
    pub fn attend_request(&self, a: Attend, options: AttendOptions) -> Result<AttendResult, KvError> {
        for (i, s) in a.seqs.iter().enumerate() {
            if a.seqs[..i].contains(s) {
                return Err(KvError::BadRequest(format!("sequence {s} appears twice in one attention request")));
            }
        }
        if let Some((k, v)) = &a.new_kv {
            let n = a.heads * a.head_dim;
            for (i, s) in a.seqs.iter().enumerate() {
                self.append(*s, a.layer, 1, &k[i * n..(i + 1) * n], &v[i * n..(i + 1) * n])?;
            }
        }
        let views = a.seqs.iter().flat_map(|s| (0..a.heads).map(move |h| self.head(*s, a.layer, h))).collect::<Result<Vec<_>, _>>()?;
        let rows = a.group * a.head_dim;
        let mut out = vec![0f32; a.q.len()];
        let mut lse = options.partial.then(|| vec![f64::NEG_INFINITY; a.q.len() / a.head_dim]);
        // One slot per query row, `group` rows per (entry, KV head) task.
        let mut lse_parts = lse.as_mut().map(|l| l.chunks_mut(a.group));
        let tasks = views
            .iter()
            .zip(a.q.chunks(rows))
            .zip(out.chunks_mut(rows))
            .map(|((head, q), out)| Task { head, q, out, lse: lse_parts.as_mut().and_then(Iterator::next) })
            .collect();
        let stats: AttendStats = self.attend_all(tasks, a.scale, a.method)?;
        Ok(AttendResult { entries: a.seqs.len(), heads: a.heads, group: a.group, head_dim: a.head_dim, stats, out, lse })
    }
}
