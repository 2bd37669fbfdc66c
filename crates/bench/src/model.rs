// SPDX-License-Identifier: Apache-2.0
//! Benchmarks on emulated drives: scrub scaling, break-even, latency and the model check.
//!
//! Each runs N embedded targets in this process, one namespace image each (in memory by
//! default), holding objects laid out as extents and addressed by virtual objects built
//! here. The real code paths run end to end (EXEC through the target's streams and kernels;
//! conventional reads through `Target::read` and the same kernels on the host); the device
//! models only pace them: each drive's media obeys its own flash model, its kernels its own
//! CPU budget, and every byte between the targets and the host crosses one shared link
//! model. With `--drive none --link none` nothing is paced and nothing sleeps.
//!
//! Option names follow the `insitu bench` flags, and error messages name the flags.
//!
//! Every report records the command line, the models and their parameters ([`ModelsReport`]),
//! the data sizes and the machine.

mod breakeven;
mod check;
mod emu;
mod latency;
mod math;
mod meter;
mod pull;
mod rig;
mod scrub;
mod workload;

pub use breakeven::{run as break_even, BreakEvenData, BreakEvenMethod, BreakEvenOptions, BreakEvenReport, BreakEvenTerms, KernelBreakEven, SeriesPoint};
pub use check::{run as model_check, ModelCheck, ModelCheckCeilings, ModelCheckMethod, ModelCheckOptions, ModelCheckReport};
pub use latency::{run as latency, LatencyModelSeconds, LatencyOptions, LatencyParts, LatencyQuery, LatencyReport, QueryTimes};
pub use scrub::{run as scrub_scaling, PerPath, ScrubData, ScrubMethod, ScrubPoint, ScrubReport, ScrubScalingOptions, ScrubSummary};

use crate::Error;
use insitu_model::{DeviceModel, LinkConfig, LINK_NAMES};
use serde::Serialize;

/// The drive and link every emulated-drive benchmark runs on. `None` fields take the
/// benchmark's default, given in its options.
#[derive(Debug, Clone, Default)]
pub struct ModelChoice {
    /// Drive model (`--drive`): a preset (samsung-980pro, intel-p4600, daisyplus-openssd,
    /// newport, smartssd), PRESET@MB_S (re-timed to that internal read rate), custom:MB_S,
    /// or `none` (real speed). Default `None`.
    pub drive: Option<String>,
    /// A generic drive whose offload engine reads sequentially at this many MB/s
    /// (`--drive-mb-s`, the same as `custom:MB_S`); wins over `drive`. Default `None`.
    pub drive_mb_s: Option<f64>,
    /// The one link between the targets and the host (`--link`): 10gbe, 25gbe, 40gbe,
    /// 100gbe, pcie-gen3-x4, pcie-gen4-x4, a payload rate in MB/s, or `none` (not paced).
    /// Default `None`.
    pub link: Option<String>,
}

/// A resolved drive and link.
pub(crate) struct Models {
    pub(crate) drive: Option<DeviceModel>,
    pub(crate) link: Option<LinkConfig>,
    pub(crate) link_name: String,
}

impl ModelChoice {
    /// The models asked for, with these defaults for flags not given.
    pub(crate) fn resolve(&self, default_drive: &str, default_link: &str) -> Result<Models, Error> {
        let drive = match (self.drive_mb_s, self.drive.as_deref()) {
            (Some(r), _) => Some(insitu_model::custom(r).map_err(|e| format!("--drive-mb-s {r}: {e}"))?),
            (None, spec) => parse_drive(spec.unwrap_or(default_drive))?,
        };
        let link_name = self.link.clone().unwrap_or_else(|| default_link.to_string());
        Ok(Models { drive, link: parse_link(&link_name)?, link_name })
    }
}

/// A drive spec, or `none`.
pub(crate) fn parse_drive(spec: &str) -> Result<Option<DeviceModel>, Error> {
    if spec == "none" {
        return Ok(None);
    }
    insitu_model::parse(spec).map(Some).map_err(|e| format!("--drive {spec}: {e} (or none for real speed)").into())
}

/// A link name, a rate in MB/s (10 µs latency, like Ethernet), or `none`.
pub(crate) fn parse_link(s: &str) -> Result<Option<LinkConfig>, Error> {
    if s == "none" {
        return Ok(None);
    }
    if let Some(l) = LinkConfig::named(s) {
        return Ok(Some(l));
    }
    match s.parse::<f64>() {
        Ok(mb_s) if mb_s > 0.0 && mb_s.is_finite() => Ok(Some(LinkConfig { mb_s, latency_us: 10.0 })),
        _ => Err(format!("--link {s}: unknown link; use one of {}, a payload rate in MB/s such as 1200, or none", LINK_NAMES.join(", ")).into()),
    }
}

/// The drive and link a benchmark ran on, in its report.
#[derive(Debug, Clone, Serialize)]
pub struct ModelsReport {
    /// The drive model with its derived rates; `None` (null) for real speed.
    pub drive: Option<DriveReport>,
    /// The link.
    pub link: LinkReport,
}

/// A drive model in a report: the model's own fields and its derived rates, as
/// [`DeviceModel::to_json`] writes them.
#[derive(Debug, Clone, Serialize)]
pub struct DriveReport {
    /// The model.
    #[serde(flatten)]
    pub model: DeviceModel,
    /// The rates the model implies.
    pub derived: DerivedRates,
}

/// The rates a drive model implies, MB/s; `None` (null) where it has no flash model.
#[derive(Debug, Clone, Serialize)]
pub struct DerivedRates {
    /// Sequential read of the flash back-end ([`DeviceModel::flash_read_mb_s`]).
    pub flash_read_mb_s: Option<f64>,
    /// Sequential write of the flash back-end.
    pub flash_write_mb_s: Option<f64>,
    /// Sequential read seen by the offload engine ([`DeviceModel::internal_read_mb_s`]).
    pub internal_read_mb_s: Option<f64>,
    /// Sequential read seen by the host ([`DeviceModel::host_read_mb_s`]).
    pub host_read_mb_s: Option<f64>,
}

impl DriveReport {
    /// The report of `model`.
    pub fn new(model: &DeviceModel) -> DriveReport {
        let derived = DerivedRates {
            flash_read_mb_s: model.flash_read_mb_s(),
            flash_write_mb_s: model.flash.as_ref().map(insitu_model::FlashConfig::seq_write_mb_s),
            internal_read_mb_s: model.internal_read_mb_s(),
            host_read_mb_s: model.host_read_mb_s(),
        };
        DriveReport { model: model.clone(), derived }
    }
}

/// The link of [`ModelsReport`].
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    /// As given: a name, a rate in MB/s, or `none`.
    pub name: String,
    /// Its rate and latency; `None` (null) for no link model.
    pub config: Option<LinkConfig>,
}

impl ModelsReport {
    /// The report of resolved models.
    pub(crate) fn new(m: &Models) -> ModelsReport {
        ModelsReport { drive: m.drive.as_ref().map(DriveReport::new), link: LinkReport { name: m.link_name.clone(), config: m.link.clone() } }
    }

    /// The drive model's name, or `none (real speed)`.
    pub fn drive_name(&self) -> &str {
        self.drive.as_ref().map_or("none (real speed)", |d| d.model.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_resolve_with_defaults_and_errors_name_the_fix() {
        let m = ModelChoice::default().resolve("custom:500", "10gbe").map_err(|f| f.to_string()).unwrap();
        assert!((m.drive.unwrap().internal_read_mb_s().unwrap() - 500.0).abs() < 1e-6);
        assert!((m.link.unwrap().mb_s - 1186.6).abs() < 0.1);
        let m = ModelChoice { drive: Some("none".into()), link: Some("none".into()), ..Default::default() }
            .resolve("newport", "40gbe")
            .map_err(|f| f.to_string())
            .unwrap();
        assert!(m.drive.is_none() && m.link.is_none());
        let m = ModelChoice { drive_mb_s: Some(800.0), link: Some("2500".into()), ..Default::default() }
            .resolve("newport", "40gbe")
            .map_err(|f| f.to_string())
            .unwrap();
        assert!((m.drive.unwrap().internal_read_mb_s().unwrap() - 800.0).abs() < 1e-6);
        assert_eq!(m.link.unwrap().mb_s, 2500.0);
        let e = parse_link("token-ring").unwrap_err().to_string();
        assert!(e.contains("token-ring") && e.contains("40gbe") && e.contains("none"), "{e}");
        assert!(parse_drive("floppy").unwrap_err().to_string().contains("newport"));
    }

    #[test]
    fn drive_reports_are_the_models_own_json() {
        let mut models = insitu_model::presets();
        models.push(insitu_model::custom(500.0).unwrap());
        models.push(DeviceModel { flash: None, ..models[0].clone() });
        // Both texts parsed the same way: equal keys, types and printed numbers. (Parsing
        // is not exact in the last digit, so a parsed value must not be compared with one
        // that never was text.)
        let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        for m in models {
            let ours = serde_json::to_string(&DriveReport::new(&m)).unwrap();
            assert_eq!(parse(&ours), parse(&m.to_json()), "{}", m.name);
        }
    }
}
