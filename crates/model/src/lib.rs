// SPDX-License-Identifier: Apache-2.0
//! Device models for insitu: deterministic timing of NAND flash, links and an offload
//! engine's CPU, used to emulate SSDs and computational storage devices (CSDs) on ordinary
//! storage.
//!
//! Emulation is explicit. Nothing in this crate runs unless a caller builds a model; with no
//! model configured, insitu runs at the real speed of its media, network and CPU.
//!
//! * [`Flash`] ([`FlashConfig`]): channels and dies with next-free times, a page-mapped FTL
//!   and greedy garbage collection, so sustained random writes slow down
//!   ([`FlashStats::write_amplification`]).
//! * [`Link`] ([`LinkConfig`]): a serial link with bandwidth and latency; named PCIe and
//!   Ethernet rates via [`LinkConfig::named`].
//! * [`ComputeBudget`] ([`ComputeConfig`]): caps the CPU time of the host threads that stand
//!   in for an embedded engine (`workers × cpu_share` host cores).
//! * [`Pacer`]: runs the flash and link models against the wall clock and sleeps callers
//!   until the modelled completion times; it implements [`insitu_media::Pacing`], so a
//!   [`Backing`](insitu_media::Backing) given one with `with_pacing` is as slow as the model.
//! * [`DeviceModel`]: a bundle of the above with its sources; [`presets`], [`preset`],
//!   [`parse`] (`newport`, `smartssd@2000`, `custom:3000`) and
//!   [`DeviceModel::with_internal_read_mb_s`].
//!
//! The models are pure functions of their request sequences (times in ns on the caller's
//! clock), so their results do not depend on the speed of the machine. Formulas, parameters
//! and sources are in `docs/device-models.md`.
//!
//! ```
//! use insitu_model::{preset, Flash, FlashConfig};
//!
//! // One channel, one die: a page read is a 50 µs sense plus 4096 B at 400 MB/s (10.24 µs).
//! let cfg = FlashConfig { channels: 1, dies_per_channel: 1, page_bytes: 4096, read_us: 50.0,
//!                         channel_mb_s: 400.0, ..FlashConfig::default() };
//! let mut flash = Flash::new(cfg, 1 << 30).unwrap();
//! assert_eq!(flash.read(0, 0, 4096), 60_240);
//! assert_eq!(flash.read(0, 4096, 4096), 120_480); // the die was busy
//!
//! // A Newport-class CSD: its engine sees 1404 MB/s, its host 3200 MB/s.
//! let newport = preset("newport").unwrap();
//! assert_eq!(newport.internal_read_mb_s().unwrap().round(), 1404.0);
//! assert_eq!(newport.host_read_mb_s().unwrap().round(), 3200.0);
//! // The same device re-timed for a 2 GB/s internal-bandwidth experiment.
//! let fast = newport.with_internal_read_mb_s(2000.0).unwrap();
//! assert_eq!(fast.internal_read_mb_s().unwrap().round(), 2000.0);
//! ```
#![deny(missing_docs)]

mod busy;
mod compute;
mod error;
mod flash;
mod flash_config;
mod ftl;
mod link;
mod pace;
mod preset;
mod stream;
mod write_cache;

pub use compute::{thread_cpu_ns, ChargeCpu, ComputeBudget, ComputeConfig};
pub use error::ModelError;
pub use flash::Flash;
pub use flash_config::{FlashConfig, FlashStats};
pub use link::{Link, LinkConfig, ETHERNET_TCP_EFFICIENCY, LINK_NAMES};
pub use pace::{PaceStats, Pacer, WRITE_CACHE_NS};
pub use preset::{custom, parse, preset, presets, DeviceModel};
pub use stream::{ReadStream, ReadStreams, StreamSlot, READAHEAD_WINDOW, STREAMS};
