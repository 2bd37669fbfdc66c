// SPDX-License-Identifier: Apache-2.0
//! One KV_ATTEND request against the store: the decode step's appends, then every
//! (entry, KV head) attended on the store's threads, into the result the command returns.

use crate::attention::{attend_groups, page_log_mass, page_log_mass_reduced, sum_stats};
use crate::store::Timeline;
use crate::{AttendStats, HeadPages, KvCache, KvError, Method, Task};
use insitu_proto::attention::{check_new_entries, Attend, AttendOptions, AttendResult, PageScores};
use std::sync::Arc;

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
        if a.groups.is_some() && !options.partial {
            return Err(KvError::BadRequest("attention over chosen token groups is a part of a split sequence: set the partial option (CDW11 bit 0)".into()));
        }
        if a.reduced.is_some() {
            return Err(KvError::BadRequest("reduced queries carry SparF's components only: they serve page scores (CDW11 bit 1), not attention".into()));
        }
        let timeline = Arc::new(Timeline::default());
        let mut result = self.attend_on(a, options, &timeline);
        let drive_wait_ns = timeline.wait(self.media());
        if let Ok(r) = &mut result {
            r.stats.drive_wait_ns = drive_wait_ns;
        }
        result
    }

    /// [`KvCache::attend_request`] with its reads booked on `timeline`, not waited for.
    fn attend_on(&self, a: Attend, options: AttendOptions, timeline: &Arc<Timeline>) -> Result<AttendResult, KvError> {
        let views = self.prepare(&a, timeline)?;
        let rows = a.group * a.head_dim;
        if let Some(groups) = &a.groups {
            let mut out = vec![0f32; a.q.len()];
            let mut lse = vec![f64::NEG_INFINITY; a.q.len() / a.head_dim];
            let tpp = views.first().map_or(0, |v| v.layout().tokens_per_page);
            let work = groups.iter().map(|g| g.len() * tpp * rows).sum();
            let items: Vec<_> = views.iter().zip(groups).zip(a.q.chunks(rows)).zip(out.chunks_mut(rows).zip(lse.chunks_mut(a.group))).collect();
            let stats = sum_stats(self.map_heads(items, work, |(((head, groups), q), (out, lse))| {
                let groups: Vec<usize> = groups.iter().map(|&g| g as usize).collect();
                attend_groups(head, q, a.scale, &groups, out, lse)
            }))?;
            return Ok(AttendResult {
                entries: a.seqs.len(),
                heads: a.heads,
                group: a.group,
                head_dim: a.head_dim,
                stats,
                out,
                lse: Some(lse),
                vectors: a.vectors,
            });
        }
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
        Ok(AttendResult { entries: a.seqs.len(), heads: a.heads, group: a.group, head_dim: a.head_dim, stats, out, lse, vectors: a.vectors })
    }

    /// SparF's first phase over this target's part of split sequences
    /// ([`AttendOptions::page_scores`]): appends the new token of every entry when the
    /// request carries one, then gives every (entry, KV head) its token groups' approximate
    /// log-masses from the dimension pages of the `r` components its query rows share.
    pub fn page_scores_request(&self, a: Attend) -> Result<PageScores, KvError> {
        let Method::SparF { r, .. } = a.method else {
            return Err(KvError::BadRequest("page scores need the SparF method (its r components)".into()));
        };
        let timeline = Arc::new(Timeline::default());
        let mut result = self.page_scores_on(&a, r, &timeline);
        let drive_wait_ns = timeline.wait(self.media());
        if let Ok(s) = &mut result {
            s.stats.drive_wait_ns = drive_wait_ns;
        }
        result
    }

    /// [`KvCache::page_scores_request`] with its reads booked on `timeline`, not waited for.
    fn page_scores_on(&self, a: &Attend, r: usize, timeline: &Arc<Timeline>) -> Result<PageScores, KvError> {
        let views = self.prepare(a, timeline)?;
        let parts = match &a.reduced {
            None => {
                let rows = a.group * a.head_dim;
                let work = views.iter().map(|v| v.tokens() * rows).sum();
                self.map_heads(views.iter().zip(a.q.chunks(rows)).collect(), work, |(head, q)| page_log_mass(head, q, a.scale, r))
            }
            // The host made step 1: per (entry, KV head) its r components, per row its norm.
            Some(red) => {
                let dims: Vec<usize> = red.dims.iter().map(|&d| usize::from(d)).collect();
                // Each token's approximate score costs about what a full row's would.
                let work = views.iter().map(|v| v.tokens() * a.group * a.head_dim).sum();
                let items = views.iter().zip(a.q.chunks(a.group * r)).zip(dims.chunks(r)).zip(red.l1.chunks(a.group)).collect();
                self.map_heads(items, work, |(((head, q), dims), l1)| page_log_mass_reduced(head, q, dims, l1, a.scale))
            }
        };
        let mut scores =
            PageScores { heads: a.heads, group: a.group, stats: AttendStats::default(), groups: Vec::with_capacity(a.seqs.len()), log_mass: Vec::new() };
        for (i, part) in parts.into_iter().enumerate() {
            let (masses, stats) = part?;
            if i % a.heads == 0 {
                scores.groups.push((masses.len() / a.group) as u32);
            }
            scores.stats += stats;
            scores.log_mass.extend(masses.iter().map(|&m| m as f32));
        }
        Ok(scores)
    }

    /// Refuses a sequence named twice, appends the decode step's new token of every entry
    /// (or of the entries `a.new_entries` lists) when `a` carries one, and returns every
    /// (entry, KV head)'s view, entry-major.
    fn prepare(&self, a: &Attend, timeline: &Arc<Timeline>) -> Result<Vec<crate::HeadView>, KvError> {
        for (i, s) in a.seqs.iter().enumerate() {
            if a.seqs[..i].contains(s) {
                return Err(KvError::BadRequest(format!("sequence {s} appears twice in one attention request")));
            }
        }
        if let Some(groups) = &a.groups {
            if groups.len() != a.seqs.len() * a.heads {
                return Err(KvError::BadRequest(format!("{} token-group lists for {} entries x {} KV heads", groups.len(), a.seqs.len(), a.heads)));
            }
        }
        if let Some((k, v)) = &a.new_kv {
            let n = a.heads * a.head_dim;
            let entries: Vec<usize> = match &a.new_entries {
                Some(list) => {
                    check_new_entries(list, a.seqs.len())?;
                    list.clone()
                }
                None => (0..a.seqs.len()).collect(),
            };
            if k.len() != entries.len() * n || v.len() != k.len() {
                return Err(KvError::BadRequest(format!("new K and V of {} values for {} entries x {n}", k.len(), entries.len())));
            }
            for (j, e) in entries.into_iter().enumerate() {
                self.append(a.seqs[e], a.layer, 1, &k[j * n..(j + 1) * n], &v[j * n..(j + 1) * n])?;
            }
        }
        a.seqs.iter().flat_map(|s| (0..a.heads).map(move |h| self.head_on(*s, a.layer, h, Some(timeline)))).collect()
    }
}
