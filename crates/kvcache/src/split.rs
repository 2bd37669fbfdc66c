// SPDX-License-Identifier: Apache-2.0
//! The host's side of a sequence split over targets by tokens (split-K): SparF's page
//! choice over every target's page scores, and the merge of the targets' partial outputs.
//!
//! Each target holds every KV head for a share of a sequence's token pages. For SparF,
//! every target first answers with the approximate log-mass of each of its pages (one
//! value per query row, [`crate::wire::PageScores`]); [`choose_pages`] normalises those
//! masses over the whole sequence and keeps what one target holding every page keeps
//! (`sparse.rs`): the first page, the pages of the last tokens, and the budget's best
//! others. Every target then attends over the pages kept on it and returns its partial
//! output and log-sum-exp per row, which [`merge`] combines exactly.

/// One target's page scores as [`choose_pages`] reads them.
#[derive(Clone, Copy, Debug)]
pub struct TargetScores<'a> {
    /// Per sequence, the pages (token groups) it holds of it.
    pub pages: &'a [u32],
    /// Per sequence, `[heads][rows][its pages]` log-masses, sequence after sequence.
    pub log_mass: &'a [f32],
}

/// Where a sequence's pages are fixed, whatever their mass: on which target (an index into
/// the scores given) its first page lies, and per target the first of its pages that hold
/// one of the sequence's last tokens (None: none there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedPages {
    /// The target holding the sequence's first page (the attention sink), if asked.
    pub sink: Option<usize>,
    /// Per target, its first local page.
    pub local_from: Vec<Option<usize>>,
}

/// SparF's pages for every (sequence, KV head) of a batch split over targets, chosen as
/// one target holding the whole sequence chooses them: the fixed pages of `fixed[b]`, and
/// the `budget` other pages on which some query row of the head puts the most mass,
/// normalised over the whole sequence (ties go to the earlier target, then the earlier
/// page). Only pages before a target's local pages compete, as on one target.
///
/// Returns, per target, the chosen pages of each (sequence, KV head), sequence-major,
/// ascending: the `groups` of that target's KV_ATTEND.
///
/// # Panics
/// When a target's scores do not hold `heads × rows` values per page of each sequence,
/// or `fixed` does not give a target list per target.
pub fn choose_pages(scores: &[TargetScores<'_>], heads: usize, rows: usize, fixed: &[FixedPages], budget: usize) -> Vec<Vec<Vec<u32>>> {
    let batch = fixed.len();
    let at: Vec<Vec<usize>> = scores
        .iter()
        .map(|s| {
            assert_eq!(s.pages.len(), batch, "page counts for every sequence");
            let mut off = 0;
            let v: Vec<usize> = s
                .pages
                .iter()
                .map(|&n| {
                    let o = off;
                    off += heads * rows * n as usize;
                    o
                })
                .collect();
            assert_eq!(off, s.log_mass.len(), "heads x rows masses per page");
            v
        })
        .collect();
    let mut out: Vec<Vec<Vec<u32>>> = scores.iter().map(|_| vec![Vec::new(); batch * heads]).collect();
    // Pages of one sequence laid side by side, target after target.
    let mut owner: Vec<(usize, u32)> = Vec::new();
    let mut lm: Vec<f64> = Vec::new();
    let mut mass: Vec<f64> = Vec::new();
    let mut keep: Vec<bool> = Vec::new();
    let mut compete: Vec<bool> = Vec::new();
    let mut order: Vec<usize> = Vec::new();
    for (b, fix) in fixed.iter().enumerate() {
        assert_eq!(fix.local_from.len(), scores.len(), "a local page per target");
        owner.clear();
        for (j, s) in scores.iter().enumerate() {
            owner.extend((0..s.pages[b]).map(|p| (j, p)));
        }
        let total = owner.len();
        keep.clear();
        compete.clear();
        for &(j, p) in &owner {
            let local = fix.local_from[j].is_some_and(|l| p as usize >= l);
            let sink = fix.sink == Some(j) && p == 0;
            keep.push(local || sink);
            compete.push(!(local || sink));
        }
        for h in 0..heads {
            mass.clear();
            mass.resize(total, 0.0);
            for g in 0..rows {
                lm.clear();
                for (j, s) in scores.iter().enumerate() {
                    let n = s.pages[b] as usize;
                    let from = at[j][b] + (h * rows + g) * n;
                    lm.extend(s.log_mass[from..from + n].iter().map(|&x| x as f64));
                }
                let top = lm.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let top = if top.is_finite() { top } else { 0.0 };
                let lz = top + lm.iter().map(|&x| (x - top).exp()).sum::<f64>().ln();
                if lz == f64::NEG_INFINITY {
                    continue; // no mass anywhere: this row prefers no page
                }
                for (m, &x) in mass.iter_mut().zip(&lm) {
                    *m = m.max((x - lz).exp());
                }
            }
            order.clear();
            order.extend((0..total).filter(|&p| compete[p]));
            // Most mass first, the earlier page first among equals (a stable sort).
            order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
            let mut pick = keep.clone();
            for &p in order.iter().take(budget) {
                pick[p] = true;
            }
            for (p, &(j, page)) in owner.iter().enumerate() {
                if pick[p] {
                    out[j][b * heads + h].push(page);
                }
            }
        }
    }
    out
}

/// One target's partial attention for the merge: outputs `[rows][head_dim]` and the
/// log-sum-exp of each row's scaled scores over its tokens, for the rows `rows` (indices
/// into the merged rows, ascending).
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    /// The merged rows this part holds, in its order.
    pub rows: &'a [usize],
    /// Its outputs, `[rows.len()][head_dim]`.
    pub out: &'a [f32],
    /// Its log-sum-exp per row (−∞: no token).
    pub lse: &'a [f64],
}

/// Merges partial attentions over disjoint token sets into `out` (`[rows][head_dim]`):
/// `Σ exp(lse_i − L)·out_i` with `L = log Σ exp(lse_i)`, in f64, part after part; a row
/// no part holds (or whose parts hold no token) is zero.
///
/// # Panics
/// When a part's sizes do not match its rows, or a row is out of range.
pub fn merge(parts: &[Part<'_>], head_dim: usize, out: &mut [f32]) {
    let rows = out.len() / head_dim;
    let mut top = vec![f64::NEG_INFINITY; rows];
    for p in parts {
        assert_eq!(p.out.len(), p.rows.len() * head_dim, "outputs of every row");
        assert_eq!(p.lse.len(), p.rows.len(), "a log-sum-exp per row");
        for (&r, &l) in p.rows.iter().zip(p.lse) {
            top[r] = top[r].max(l);
        }
    }
    let mut sum = vec![0.0f64; rows];
    for p in parts {
        for (&r, &l) in p.rows.iter().zip(p.lse) {
            if top[r].is_finite() {
                sum[r] += (l - top[r]).exp();
            }
        }
    }
    let mut acc = vec![0.0f64; out.len()];
    for p in parts {
        for (k, (&r, &l)) in p.rows.iter().zip(p.lse).enumerate() {
            if !top[r].is_finite() {
                continue;
            }
            let w = (l - top[r]).exp() / sum[r];
            let src = &p.out[k * head_dim..(k + 1) * head_dim];
            for (a, &x) in acc[r * head_dim..(r + 1) * head_dim].iter_mut().zip(src) {
                *a += w * x as f64;
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so the cases need no crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The choice one target holding every page makes, written the plain way: normalise
    /// each row's masses over all pages, take each page's largest, keep the fixed pages
    /// and the `budget` best of the others.
    fn one_target(lm: &[Vec<f64>], fixed: &[bool], budget: usize) -> Vec<bool> {
        let pages = fixed.len();
        let mut mass = vec![0.0f64; pages];
        for row in lm {
            let z: f64 = row.iter().map(|x| x.exp()).sum();
            for (m, x) in mass.iter_mut().zip(row) {
                *m = m.max(x.exp() / z);
            }
        }
        let mut others: Vec<usize> = (0..pages).filter(|&p| !fixed[p]).collect();
        others.sort_by(|&a, &b| mass[b].partial_cmp(&mass[a]).unwrap().then(a.cmp(&b)));
        let mut keep = fixed.to_vec();
        for &p in others.iter().take(budget) {
            keep[p] = true;
        }
        keep
    }

    #[test]
    fn the_split_choice_is_the_choice_of_one_target_holding_every_page() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..200 {
            let targets = 1 + case % 4;
            let (heads, rows, batch) = (1 + case % 3, 1 + case % 2, 1 + case % 3);
            let budget = case % 5;
            let counts: Vec<Vec<u32>> = (0..targets).map(|_| (0..batch).map(|_| (rng.next() * 7.0) as u32).collect()).collect();
            let masses: Vec<Vec<f32>> =
                counts.iter().map(|c| (0..c.iter().sum::<u32>() as usize * heads * rows).map(|_| (rng.next() * 12.0 - 6.0) as f32).collect()).collect();
            let fixed: Vec<FixedPages> = (0..batch)
                .map(|b| FixedPages {
                    sink: (0..targets).find(|&j| counts[j][b] > 0),
                    local_from: (0..targets).map(|j| if counts[j][b] > 1 && rng.next() < 0.5 { Some(counts[j][b] as usize - 1) } else { None }).collect(),
                })
                .collect();
            let scores: Vec<TargetScores> = counts.iter().zip(&masses).map(|(c, m)| TargetScores { pages: c, log_mass: m }).collect();
            let got = choose_pages(&scores, heads, rows, &fixed, budget);
            for b in 0..batch {
                let mut owner = Vec::new();
                for (j, c) in counts.iter().enumerate() {
                    owner.extend((0..c[b]).map(|p| (j, p)));
                }
                let fix: Vec<bool> =
                    owner.iter().map(|&(j, p)| fixed[b].sink == Some(j) && p == 0 || fixed[b].local_from[j].is_some_and(|l| p as usize >= l)).collect();
                for h in 0..heads {
                    let lm: Vec<Vec<f64>> = (0..rows)
                        .map(|g| {
                            let mut row = Vec::new();
                            for (j, c) in counts.iter().enumerate() {
                                let from: usize = c[..b].iter().map(|&n| n as usize * heads * rows).sum::<usize>() + (h * rows + g) * c[b] as usize;
                                row.extend(masses[j][from..from + c[b] as usize].iter().map(|&x| x as f64));
                            }
                            row
                        })
                        .collect();
                    let want = one_target(&lm, &fix, budget);
                    for (j, per) in got.iter().enumerate() {
                        let expect: Vec<u32> = owner.iter().zip(&want).filter(|&(&(o, _), &k)| o == j && k).map(|(&(_, p), _)| p).collect();
                        assert_eq!(per[b * heads + h], expect, "case {case}: sequence {b}, head {h}, target {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn merged_parts_are_attention_over_the_union() {
        // Scores over 6 tokens in 3 parts; the merge of each part's softmax output and
        // log-sum-exp equals one softmax over all of them.
        let scores = [0.3f64, -1.2, 2.0, 0.7, -0.1, 1.1];
        let values: Vec<[f64; 2]> = (0..6).map(|t| [t as f64, (t * t) as f64 * 0.5 - 1.0]).collect();
        let part = |ts: &[usize]| {
            let lse = ts.iter().map(|&t| scores[t].exp()).sum::<f64>().ln();
            let mut out = [0.0f32; 2];
            for &t in ts {
                let w = (scores[t] - lse).exp();
                out[0] += (w * values[t][0]) as f32;
                out[1] += (w * values[t][1]) as f32;
            }
            (out, lse)
        };
        let (a, la) = part(&[0, 3]);
        let (b, lb) = part(&[1, 2, 5]);
        let (c, lc) = part(&[4]);
        let (outs, lses) = ([a, b, c].concat(), [la, lb, lc]);
        let z: f64 = scores.iter().map(|s| s.exp()).sum();
        let want: Vec<f64> = (0..2).map(|d| (0..6).map(|t| scores[t].exp() / z * values[t][d]).sum()).collect();
        // Row 0 gets all three parts; row 1 only the second; row 2 none.
        let parts = [
            Part { rows: &[0], out: &outs[0..2], lse: &lses[0..1] },
            Part { rows: &[0, 1], out: &[outs[2], outs[3], outs[2], outs[3]], lse: &[lses[1], lses[1]] },
            Part { rows: &[0], out: &outs[4..6], lse: &lses[2..3] },
        ];
        let mut out = [9.0f32; 6];
        merge(&parts, 2, &mut out);
        for d in 0..2 {
            assert!((out[d] as f64 - want[d]).abs() < 1e-5, "{} vs {}", out[d], want[d]);
            assert_eq!(out[2 + d], outs[2 + d], "one part alone is itself");
        }
        assert_eq!(&out[4..], &[0.0, 0.0], "a row no part holds is zero");
        let empty = [Part { rows: &[0], out: &[0.0, 0.0], lse: &[f64::NEG_INFINITY] }];
        let mut out = [9.0f32; 2];
        merge(&empty, 2, &mut out);
        assert_eq!(out, [0.0, 0.0], "a part with no token adds nothing");
    }
}
