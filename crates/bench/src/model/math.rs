// SPDX-License-Identifier: Apache-2.0
//! The arithmetic the benchmarks report: network traffic reduction and CSDPLAN's break-even
//! model.
//!
//! CSDPLAN (Byun et al.; extended by CSDPLAN-EC) models a kernel over `D` bytes spread
//! evenly over `M` drives. On an SSD array the host pulls the data and computes on one
//! core: `T_host(M) = max(T_tx / M, T_link) + T_host_comp`, where `T_tx` moves `D` from
//! one drive and `T_link = D / link rate` is the shared bus or network that stops the
//! transfer from shrinking beyond `M_bottleneck = T_tx / T_link` drives. On a CSD array
//! every device reads and computes its share in place: `T_csd(M) = T_csd(1) / M`. The
//! break-even point is the smallest `M` with `T_csd(M) < T_host(M)`.

/// Share of the conventional bytes on the link that offloading saved:
/// `1 − offload / conventional` (0 when nothing was moved conventionally).
pub(crate) fn traffic_reduction(offload_bytes: u64, conventional_bytes: u64) -> f64 {
    if conventional_bytes == 0 {
        return 0.0;
    }
    1.0 - offload_bytes as f64 / conventional_bytes as f64
}

/// Largest array the break-even search considers.
pub(crate) const MAX_DRIVES: u32 = 1_000_000;

/// CSDPLAN's model of one kernel, in seconds for the whole data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BreakEvenModel {
    /// Moving all the data from one drive to the host (`D / one drive's host read rate`).
    pub(crate) transfer_one_s: f64,
    /// Moving all the data over the shared link (`D / link rate`); 0 for no link limit.
    pub(crate) transfer_link_s: f64,
    /// The kernel on one host core, data in memory.
    pub(crate) host_compute_s: f64,
    /// The kernel on one CSD over all the data (its internal reads and its compute).
    pub(crate) csd_one_s: f64,
}

impl BreakEvenModel {
    /// `T_host(M)`: transfer (shrinking with M until the link binds) plus host compute.
    pub(crate) fn host_s(&self, m: u32) -> f64 {
        (self.transfer_one_s / f64::from(m.max(1))).max(self.transfer_link_s) + self.host_compute_s
    }

    /// `T_csd(M) = T_csd(1) / M`.
    pub(crate) fn csd_s(&self, m: u32) -> f64 {
        self.csd_one_s / f64::from(m.max(1))
    }

    /// Drives beyond which the link, not the drives, limits the host's transfer.
    pub(crate) fn link_bound_from(&self) -> f64 {
        if self.transfer_link_s > 0.0 {
            self.transfer_one_s / self.transfer_link_s
        } else {
            f64::INFINITY
        }
    }

    /// The smallest number of drives at which the CSD array is faster, or `None` if it never
    /// is within [`MAX_DRIVES`] (only possible when the host neither computes nor waits on
    /// the link, and one CSD is slower than one drive's transfer).
    pub(crate) fn break_even(&self) -> Option<u32> {
        // T_host − T_csd only grows with M once the CSD is slower at M = 1 (both transfer
        // terms shrink as 1/M, the CSD's faster, until the link binds; then only the CSD's
        // does), so the first M that wins is found by bisection on the closed interval.
        let wins = |m: u32| self.csd_s(m) < self.host_s(m);
        if wins(1) {
            return Some(1);
        }
        if !wins(MAX_DRIVES) {
            return None;
        }
        let (mut lo, mut hi) = (1, MAX_DRIVES);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if wins(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_reduction_is_the_share_saved() {
        assert!((traffic_reduction(1_000, 1_000_000) - 0.999).abs() < 1e-12);
        assert_eq!(traffic_reduction(5, 5), 0.0);
        assert_eq!(traffic_reduction(0, 0), 0.0);
        assert!(traffic_reduction(10, 5) < 0.0, "offload moving more is a negative reduction");
        // 800 digests of ~300 bytes against 3.2 GiB of data: far above 99 %.
        assert!(traffic_reduction(800 * 300, 800 * (4 << 20)) > 0.9999);
    }

    #[test]
    fn break_even_follows_the_closed_form() {
        // The link binds from 4 drives; a CSD takes 3 s for everything.
        let m = BreakEvenModel { transfer_one_s: 1.0, transfer_link_s: 0.25, host_compute_s: 0.5, csd_one_s: 3.0 };
        assert_eq!(m.link_bound_from(), 4.0);
        assert_eq!((m.host_s(1), m.csd_s(1)), (1.5, 3.0));
        assert_eq!((m.host_s(4), m.csd_s(4)), (0.75, 0.75), "a tie is not a win");
        assert_eq!(m.host_s(8), 0.75);
        assert_eq!(m.break_even(), Some(5));
        // Without the link limit: (3 − 1) / 0.5 = 4 drives tie, so 5 win.
        assert_eq!(BreakEvenModel { transfer_link_s: 0.0, ..m }.break_even(), Some(5));
        // A CSD faster than the host from the start.
        assert_eq!(BreakEvenModel { csd_one_s: 1.0, ..m }.break_even(), Some(1));
        // A slow CSD needs many: 100 s against 0.75 s per array once the link binds.
        assert_eq!(BreakEvenModel { csd_one_s: 100.0, ..m }.break_even(), Some(134));
    }

    #[test]
    fn a_host_that_neither_computes_nor_waits_on_a_link_is_never_beaten_by_a_slower_csd() {
        let m = BreakEvenModel { transfer_one_s: 1.0, transfer_link_s: 0.0, host_compute_s: 0.0, csd_one_s: 2.0 };
        assert_eq!(m.break_even(), None);
        assert_eq!(BreakEvenModel { csd_one_s: 0.5, ..m }.break_even(), Some(1));
    }

    #[test]
    fn the_break_even_point_is_the_first_winning_array_for_many_models() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut r = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 10_000) as f64 / 1000.0
        };
        for _ in 0..2000 {
            let m = BreakEvenModel { transfer_one_s: r(), transfer_link_s: r() / 4.0, host_compute_s: r() / 2.0 + 0.001, csd_one_s: r() * 3.0 };
            let be = m.break_even().expect("a computing host is always beaten eventually");
            assert!(m.csd_s(be) < m.host_s(be), "{m:?} at {be}");
            assert!((1..be).all(|k| m.csd_s(k) >= m.host_s(k)), "{m:?}: {be} is not the first");
            assert!((be..be + 50).all(|k| m.csd_s(k) < m.host_s(k)), "{m:?}: wins stop after {be}");
        }
    }
}
