// SPDX-License-Identifier: Apache-2.0
//! Timing of a serial link: PCIe lanes between a drive and its host, or an Ethernet fabric.
//!
//! A [`Link`] carries one transfer at a time in one direction: a transfer of `n` bytes issued
//! at `t` starts when the link is free, occupies it for `n / mb_s`, and is delivered
//! `latency_us` after its last byte left (latency overlaps the next transfer, so it is paid
//! once per transfer, not once per byte). Use two links to model a full-duplex pair.
//!
//! Named rates ([`LinkConfig::named`]) are payload rates, derived as follows:
//!
//! * **PCIe**: lanes × transfer rate × 128/130 (the Gen3/Gen4 line code) / 8 bits. Gen3
//!   runs 8 GT/s, so x4 carries 4 × 8e9 × 128/130 / 8 = 3938.5 MB/s; Gen4 doubles it to
//!   7876.9 MB/s. TLP headers (another 5–10 % on real drives) are not subtracted.
//! * **Ethernet**: line rate × 1460/1538. A 1500-byte MTU frame occupies 1538 byte times
//!   on the wire (preamble 8, header 14, FCS 4, inter-frame gap 12) and carries 1460 bytes
//!   of TCP payload (IP 20 and TCP 20 headers off): 94.9 %. So 10 GbE carries 1186.6 MB/s;
//!   the virtual-objects paper measured its 40 GbE path gating at about 4.5 GB/s against our
//!   4746 MB/s.
//!
//! Latencies are estimates: 1 µs for a PCIe DMA, 10 µs one way for NVMe/TCP through two
//! kernel network stacks and a switch.

use serde::{Deserialize, Serialize};

use crate::error::{non_negative, positive};
use crate::ModelError;

/// Share of an Ethernet line rate left for TCP payload with a 1500-byte MTU.
pub const ETHERNET_TCP_EFFICIENCY: f64 = 1460.0 / 1538.0;

/// Bandwidth and latency of a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    /// Payload bandwidth, MB/s (1 MB = 10⁶ bytes). Default 3938.5 (PCIe Gen3 x4).
    pub mb_s: f64,
    /// One-way latency added to every transfer, µs. Default 1.0.
    pub latency_us: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig::pcie(3, 4)
    }
}

/// Names accepted by [`LinkConfig::named`].
pub const LINK_NAMES: &[&str] = &["pcie-gen3-x4", "pcie-gen4-x4", "10gbe", "25gbe", "40gbe", "100gbe"];

impl LinkConfig {
    /// A PCIe link of generation `gen` (3 = 8 GT/s, 4 = 16 GT/s, 5 = 32 GT/s per lane, each
    /// with 128b/130b coding) and `lanes` lanes, with 1 µs latency. Generations outside 3–5
    /// are treated as 3.
    pub fn pcie(gen: u32, lanes: u32) -> LinkConfig {
        let gt_s = match gen {
            4 => 16.0,
            5 => 32.0,
            _ => 8.0,
        };
        LinkConfig { mb_s: f64::from(lanes) * gt_s * 1000.0 * 128.0 / 130.0 / 8.0, latency_us: 1.0 }
    }

    /// A TCP path over Ethernet of `gbit_s` line rate (1500-byte MTU, see
    /// [`ETHERNET_TCP_EFFICIENCY`]), with 10 µs latency.
    pub fn ethernet(gbit_s: f64) -> LinkConfig {
        LinkConfig { mb_s: gbit_s * 1000.0 / 8.0 * ETHERNET_TCP_EFFICIENCY, latency_us: 10.0 }
    }

    /// The link called `name` (one of [`LINK_NAMES`]), or `None`.
    pub fn named(name: &str) -> Option<LinkConfig> {
        Some(match name {
            "pcie-gen3-x4" => LinkConfig::pcie(3, 4),
            "pcie-gen4-x4" => LinkConfig::pcie(4, 4),
            "10gbe" => LinkConfig::ethernet(10.0),
            "25gbe" => LinkConfig::ethernet(25.0),
            "40gbe" => LinkConfig::ethernet(40.0),
            "100gbe" => LinkConfig::ethernet(100.0),
            _ => return None,
        })
    }

    /// Like [`named`](Self::named), with an error listing the known names.
    pub fn lookup(name: &str) -> Result<LinkConfig, ModelError> {
        LinkConfig::named(name).ok_or_else(|| ModelError::Unknown { kind: "link", name: name.to_owned(), known: LINK_NAMES.join(", ") })
    }

    /// Checks both fields; the error names the field and the value.
    pub fn validate(&self) -> Result<(), ModelError> {
        positive(self.mb_s).map_err(|reason| ModelError::Link { field: "mb_s", reason })?;
        non_negative(self.latency_us).map_err(|reason| ModelError::Link { field: "latency_us", reason })
    }
}

/// Stateful timing of one link direction.
#[derive(Debug, Clone)]
pub struct Link {
    cfg: LinkConfig,
    ns_per_byte: f64,
    latency_ns: u64,
    next_free: u64,
    bytes: u64,
}

impl Link {
    /// An idle link.
    pub fn new(cfg: LinkConfig) -> Result<Link, ModelError> {
        cfg.validate()?;
        Ok(Link { ns_per_byte: 1000.0 / cfg.mb_s, latency_ns: (cfg.latency_us * 1000.0).round() as u64, next_free: 0, bytes: 0, cfg })
    }

    /// The configuration the link was built with.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Books `bytes` issued at `at_ns`; returns the time, ns, the last byte is delivered:
    /// `max(at_ns, link free) + bytes / mb_s + latency`.
    pub fn transfer(&mut self, at_ns: u64, bytes: u64) -> u64 {
        let end = at_ns.max(self.next_free) + (bytes as f64 * self.ns_per_byte).round() as u64;
        self.next_free = end;
        self.bytes += bytes;
        end + self.latency_ns
    }

    /// Time, ns, at which the link is next free.
    pub fn idle_at(&self) -> u64 {
        self.next_free
    }

    /// Bytes carried so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_rates_follow_their_derivation() {
        let close = |name: &str, mb_s: f64| {
            let l = LinkConfig::named(name).unwrap();
            assert!((l.mb_s - mb_s).abs() < 0.1, "{name}: {} vs {mb_s}", l.mb_s);
        };
        close("pcie-gen3-x4", 3938.5);
        close("pcie-gen4-x4", 7876.9);
        close("10gbe", 1186.6);
        close("25gbe", 2966.5);
        close("40gbe", 4746.4);
        close("100gbe", 11866.1);
        assert!(LINK_NAMES.iter().all(|n| LinkConfig::named(n).is_some()));
        let e = LinkConfig::lookup("token-ring").unwrap_err().to_string();
        assert!(e.contains("token-ring") && e.contains("25gbe"), "{e}");
    }

    #[test]
    fn bytes_at_a_rate_take_bytes_over_rate_plus_latency_once() {
        let mut link = Link::new(LinkConfig { mb_s: 1000.0, latency_us: 5.0 }).unwrap();
        // 1 MB at 1000 MB/s = 1 ms, plus 5 µs.
        assert_eq!(link.transfer(0, 1_000_000), 1_005_000);
        // Issued while the first is on the wire: serialised behind it, latency once more.
        assert_eq!(link.transfer(10, 500_000), 1_505_000);
        // Issued after the link went idle: starts at issue time.
        assert_eq!(link.transfer(2_000_000, 1000), 2_006_000);
        assert_eq!(link.idle_at(), 2_001_000);
        assert_eq!(link.bytes(), 1_501_000);
        assert_eq!(link.transfer(3_000_000, 0), 3_005_000);
    }

    #[test]
    fn back_to_back_transfers_reach_the_link_rate() {
        let mut link = Link::new(LinkConfig::named("10gbe").unwrap()).unwrap();
        let mut done = 0;
        for _ in 0..1000 {
            done = link.transfer(0, 1 << 20);
        }
        let mb_s = 1000.0 * (1u64 << 20) as f64 * 1000.0 / (done - 10_000) as f64;
        assert!((mb_s - 1186.6).abs() < 1.0, "{mb_s}");
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = Link::new(LinkConfig { mb_s: 0.0, latency_us: 1.0 }).unwrap_err().to_string();
        assert!(e.contains("mb_s") && e.contains("got 0"), "{e}");
        let e = LinkConfig { mb_s: 1.0, latency_us: -1.0 }.validate().unwrap_err().to_string();
        assert!(e.contains("latency_us"), "{e}");
    }
}
