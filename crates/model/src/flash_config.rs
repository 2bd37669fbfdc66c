// SPDX-License-Identifier: Apache-2.0
//! Parameters of a NAND flash back-end, its theoretical bandwidths, and the work counters of
//! the [`Flash`](crate::Flash) model.

use serde::{Deserialize, Serialize};

use crate::error::{non_negative, positive};
use crate::ModelError;

/// Geometry and timing of a NAND flash back-end.
///
/// Times are in microseconds, rates in MB/s (1 MB = 10⁶ bytes, so 1 MB/s moves one byte per
/// µs). The [`Default`] is the `samsung-980pro` preset's back-end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlashConfig {
    /// Independent flash channels (buses). Default 8.
    pub channels: u32,
    /// Dies (LUNs) per channel; each die executes one array operation at a time. Default 4.
    pub dies_per_channel: u32,
    /// Planes per die. Geometry only: each die's block count is rounded up to a multiple of
    /// it. Multi-plane operations are not timed separately; to model them, give the
    /// multi-plane page as `page_bytes`. Default 2.
    pub planes_per_die: u32,
    /// Bytes per page: the unit of a die read or program and of the FTL mapping.
    /// Default 32768 (two 16 KiB planes read or programmed together).
    pub page_bytes: u32,
    /// Pages per erase block. Default 256.
    pub pages_per_block: u32,
    /// Array read (sense) time per page, µs. Default 45.
    pub read_us: f64,
    /// Array program time per page, µs. Default 500.
    pub program_us: f64,
    /// Block erase time, µs. Default 3500.
    pub erase_us: f64,
    /// Transfer rate of one channel, MB/s. Default 1400.
    pub channel_mb_s: f64,
    /// Spare physical capacity as a fraction of the logical capacity (0.07 = 7 %).
    /// Default 0.07.
    pub over_provisioning: f64,
    /// Whether the drive's write cache survives a power loss (capacitors, as data-center
    /// drives have): a flush then returns once the cache holds the data, instead of
    /// waiting for the pages to be programmed. Default false (a consumer drive).
    #[serde(default)]
    pub power_loss_protection: bool,
}

impl Default for FlashConfig {
    fn default() -> Self {
        FlashConfig {
            channels: 8,
            dies_per_channel: 4,
            planes_per_die: 2,
            page_bytes: 32 * 1024,
            pages_per_block: 256,
            read_us: 45.0,
            program_us: 500.0,
            erase_us: 3500.0,
            channel_mb_s: 1400.0,
            over_provisioning: 0.07,
            power_loss_protection: false,
        }
    }
}

impl FlashConfig {
    /// Checks every field; the error names the field and the value.
    pub fn validate(&self) -> Result<(), ModelError> {
        let err = |field, reason: String| Err(ModelError::Flash { field, reason });
        for (field, v) in [
            ("channels", self.channels),
            ("dies_per_channel", self.dies_per_channel),
            ("planes_per_die", self.planes_per_die),
            ("pages_per_block", self.pages_per_block),
        ] {
            if v == 0 {
                return err(field, "must be at least 1 (got 0)".into());
            }
        }
        if !(512..=(1 << 20)).contains(&self.page_bytes) {
            return err("page_bytes", format!("must be between 512 and 1048576 (got {})", self.page_bytes));
        }
        for (field, v) in [("read_us", self.read_us), ("program_us", self.program_us), ("erase_us", self.erase_us)] {
            non_negative(v).or_else(|r| err(field, r))?;
        }
        positive(self.channel_mb_s).or_else(|r| err("channel_mb_s", r))?;
        non_negative(self.over_provisioning).or_else(|r| err("over_provisioning", r))?;
        if self.over_provisioning > 10.0 {
            return err("over_provisioning", format!("is a fraction and must be <= 10 (got {})", self.over_provisioning));
        }
        Ok(())
    }

    /// Dies in the drive: `channels × dies_per_channel`.
    pub fn dies(&self) -> u32 {
        self.channels * self.dies_per_channel
    }

    /// Time one full page takes on a channel, µs: `page_bytes / channel_mb_s`.
    pub fn page_transfer_us(&self) -> f64 {
        f64::from(self.page_bytes) / self.channel_mb_s
    }

    /// Theoretical sequential read bandwidth, MB/s, with enough requests outstanding to keep
    /// every die busy: each channel moves `dies_per_channel` pages per
    /// `max(read_us + t_x, dies_per_channel × t_x)`, where `t_x` is
    /// [`page_transfer_us`](Self::page_transfer_us) — the channel or the dies, whichever is
    /// slower, sets the pace.
    pub fn seq_read_mb_s(&self) -> f64 {
        self.pipelined_mb_s(self.read_us)
    }

    /// Theoretical sequential write bandwidth, MB/s, with no garbage collection:
    /// as [`seq_read_mb_s`](Self::seq_read_mb_s) with `program_us` in place of `read_us`.
    pub fn seq_write_mb_s(&self) -> f64 {
        self.pipelined_mb_s(self.program_us)
    }

    fn pipelined_mb_s(&self, array_us: f64) -> f64 {
        let tx = self.page_transfer_us();
        let d = f64::from(self.dies_per_channel);
        let per_channel_us = (array_us + tx).max(d * tx);
        f64::from(self.channels) * d * f64::from(self.page_bytes) / per_channel_us
    }
}

/// Work counters of a [`Flash`](crate::Flash) model.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlashStats {
    /// Pages read for the host (a partial page counts as one).
    pub host_pages_read: u64,
    /// Pages programmed for the host (a partial page counts as one).
    pub host_pages_written: u64,
    /// Valid pages copied by garbage collection.
    pub gc_pages_moved: u64,
    /// Blocks erased by garbage collection.
    pub erases: u64,
}

impl FlashStats {
    /// Pages programmed per host page programmed: `(host + gc moved) / host`; 1.0 before any
    /// write.
    pub fn write_amplification(&self) -> f64 {
        if self.host_pages_written == 0 {
            return 1.0;
        }
        (self.host_pages_written + self.gc_pages_moved) as f64 / self.host_pages_written as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(channels: u32, dies: u32) -> FlashConfig {
        FlashConfig { channels, dies_per_channel: dies, page_bytes: 4096, read_us: 50.0, program_us: 200.0, channel_mb_s: 400.0, ..FlashConfig::default() }
    }

    #[test]
    fn bandwidth_is_set_by_the_channel_or_the_dies() {
        // 1 channel × 2 dies is die-bound: 2 pages per (50 + 10.24) µs.
        assert!((small(1, 2).seq_read_mb_s() - 2.0 * 4096.0 / 60.24).abs() < 1e-9);
        // 2 × 8 is channel-bound: 2 × 400 MB/s.
        assert!((small(2, 8).seq_read_mb_s() - 800.0).abs() < 1e-9);
        assert!((small(1, 1).seq_write_mb_s() - 4096.0 / 210.24).abs() < 1e-9);
        assert!((small(1, 1).page_transfer_us() - 10.24).abs() < 1e-12);
        let d = FlashConfig::default();
        assert_eq!(d.dies(), 32);
        assert!((d.seq_read_mb_s() - 11_200.0).abs() < 1e-6);
    }

    #[test]
    fn amplification_counts_collection_copies() {
        assert_eq!(FlashStats::default().write_amplification(), 1.0);
        let s = FlashStats { host_pages_written: 100, gc_pages_moved: 150, ..FlashStats::default() };
        assert_eq!(s.write_amplification(), 2.5);
    }

    #[test]
    fn validation_names_the_field_and_value() {
        let msg = |c: FlashConfig| c.validate().unwrap_err().to_string();
        assert!(msg(FlashConfig { dies_per_channel: 0, ..small(1, 1) }).contains("`dies_per_channel` must be at least 1"));
        assert!(msg(FlashConfig { page_bytes: 2 << 20, ..small(1, 1) }).contains("got 2097152"));
        assert!(msg(FlashConfig { over_provisioning: 11.0, ..small(1, 1) }).contains("fraction"));
        assert!(msg(FlashConfig { erase_us: f64::INFINITY, ..small(1, 1) }).contains("`erase_us`"));
    }
}
