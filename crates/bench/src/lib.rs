// SPDX-License-Identifier: Apache-2.0
//! The insitu benchmark rig: measurements that compare offloaded and conventional work side
//! by side, in one run, and return their results as JSON-serialisable reports.
//!
//! Benchmarks on this machine's real hardware:
//!
//! * [`scan`] ([`ScanOptions`]): raw direct reads of a file's blocks vs an offloaded checksum
//!   over them vs the conventional host path, with cold caches;
//! * [`fabric`] ([`FabricOptions`]): what NVMe/TCP on loopback costs next to local access
//!   and to plain TCP ([`tcp_loopback`]), for reads and for EXEC;
//! * [`exec_scaling`] ([`ExecScalingOptions`]): 1, 2, 4, 8 concurrent EXECs on one
//!   namespace, with its buffer pool and without, and the pool's memory.
//!
//! Benchmarks on emulated drives (embedded targets paced by `insitu-model` device and link
//! models; see [`ModelChoice`]):
//!
//! * [`scrub_scaling`] ([`ScrubScalingOptions`]): conventional vs offloaded scrubbing for
//!   1..N targets behind one link;
//! * [`break_even`] ([`BreakEvenOptions`]): host vs in-drive kernels and CSDPLAN's
//!   break-even number of drives;
//! * [`latency`] ([`LatencyOptions`]): one grep query split into compute, media, link and
//!   protocol time;
//! * [`model_check`] ([`ModelCheckOptions`]): do the emulated devices deliver their rates?
//!
//! Every benchmark takes an option struct whose [`Default`] is the standard run and returns
//! a typed report ([`ScanReport`], [`FabricReport`], ...) that serialises to the JSON
//! `insitu bench ... --json` prints: the command line, the parameters, the models
//! ([`ModelsReport`]), the measurements and the machine ([`Machine`]). A field that may be
//! missing is an [`Option`]: `None` is `null` in the JSON, or the key is absent where its
//! docs say so. Long benchmarks also take a `progress`
//! callback that receives one line of text per finished step. Failures are [`Error`]s whose
//! message names the object and the fix.
//!
//! The crate also holds the helpers the benchmarks share with the `insitu demo`: the
//! deterministic data generator ([`Rng`], [`generate_dataset`]), disk images
//! ([`create_image`], [`mount_image`], [`Scratch`]) and human sizes ([`parse_size`],
//! [`human`]).
//!
//! ```no_run
//! use insitu_bench::{scrub_scaling, ModelChoice, ScrubScalingOptions};
//!
//! // Four intel-p4600 drives behind one 40GbE link, 20 files of 4 MiB each.
//! let opts = ScrubScalingOptions {
//!     model: ModelChoice { drive: Some("intel-p4600".into()), link: Some("40gbe".into()), ..Default::default() },
//!     targets: 4,
//!     files: 20,
//!     file_size: 4 << 20,
//!     ..Default::default()
//! };
//! let report = scrub_scaling(&opts, &mut |line| eprintln!("{line}"))?;
//! println!("offload / conventional at 4 targets: {}", report.summary.offload_to_conventional_at_max);
//! println!("{}", serde_json::to_string_pretty(&report).unwrap());
//! # Ok::<(), insitu_bench::Error>(())
//! ```
#![deny(missing_docs)]

mod common;
mod dataset;
mod dbbench;
mod exec_scaling;
mod fabric;
mod genome;
mod io_engine;
mod kv;
mod model;
mod scan;
mod tcp;
mod throttle;
mod ycsb;

pub use common::{command, machine, Machine};
pub use dataset::{generate as generate_dataset, Dataset, Rng};
pub use dbbench::{db_bench_key, DbBench, DbBenchValues, DB_BENCH_VALUE_SIZES};
pub use exec_scaling::{exec_scaling, ExecScaling, ExecScalingOptions, ExecScalingReport, ExecScalingRow, PoolReport};
pub use fabric::{fabric, fabric_wire_check, FabricOptions, FabricReport, FabricRequests, FabricSeconds, SessionWireBytes};
pub use genome::{GenomeRun, GenomeSteps};
pub use insitu_image::{create as create_image, human, mount as mount_image, parse_size, umount as umount_image, Fs, Scratch};
pub use io_engine::{io_engine, IoEngineOptions, IoEngineReport, IoEngineRow, IoEngineSeconds};
pub use kv::{
    kv, DbBenchParams, DriveApplied, KernelThrottle, KvBenchOptions, KvRatios, KvReport, KvRow, StackPacing, YcsbParams, KV_DEFAULT_DRIVE, KV_SYSTEMS,
    KV_WORKLOADS,
};
pub use model::{break_even, latency, model_check, scrub_scaling, BreakEvenOptions, LatencyOptions, ModelCheckOptions, ModelChoice, ScrubScalingOptions};
pub use model::{BreakEvenData, BreakEvenMethod, BreakEvenReport, BreakEvenTerms, KernelBreakEven, SeriesPoint};
pub use model::{DerivedRates, DriveReport, LinkReport, ModelsReport};
pub use model::{LatencyModelSeconds, LatencyParts, LatencyQuery, LatencyReport, QueryTimes};
pub use model::{ModelCheck, ModelCheckCeilings, ModelCheckMethod, ModelCheckReport};
pub use model::{PerPath, ScrubData, ScrubMethod, ScrubPoint, ScrubReport, ScrubSummary};
pub use scan::{scan, ScanOptions, ScanReport, ScanSeconds};
pub use tcp::{tcp_loopback, Source as TcpSource, TcpLoad};
pub use throttle::Limits as ThrottleLimits;
pub use ycsb::{fnvhash64, key_for, Op, Workload, Ycsb, YcsbConfig, FIELD_COUNT, FIELD_LEN, MAX_SCAN_LEN, RECORD_LEN};

/// A benchmark that could not run, or whose two paths disagree. The message says what
/// failed, on which object, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error(message.to_string())
    }
}

impl From<insitu_image::Error> for Error {
    fn from(e: insitu_image::Error) -> Self {
        Error(e.to_string())
    }
}

impl From<insitu_host::OasError> for Error {
    fn from(e: insitu_host::OasError) -> Self {
        Error(e.to_string())
    }
}
