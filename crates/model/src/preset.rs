// SPDX-License-Identifier: Apache-2.0
//! Named device models: real drives and computational-storage devices, with their sources.
//!
//! Where a paper or spec sheet gives a number it is used; the rest is estimated and each
//! preset's `source` says which is which. Where a drive's flash rate is not published, its
//! back-end is sized to the drive's published sequential read, so an emulated drive never
//! reads faster than its spec sheet. See `docs/device-models.md` for the full table.

use serde::{Deserialize, Serialize};

use crate::error::positive;
use crate::{ComputeBudget, ComputeConfig, FlashConfig, LinkConfig, ModelError, Pacer};

/// A device to emulate: flash back-end, host link, engine link and offload-engine CPU.
/// Each part is optional; a part that is `None` is not emulated (runs at real speed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceModel {
    /// Short name, e.g. `newport`.
    pub name: String,
    /// One line on what the device is.
    pub description: String,
    /// Where the numbers come from, and which are estimates.
    pub source: String,
    /// NAND back-end timing; `None` = media at real speed.
    pub flash: Option<FlashConfig>,
    /// Link between the drive and its host (PCIe); `None` = not paced.
    pub link: Option<LinkConfig>,
    /// Path from the flash back-end to the offload engine when it is narrower than the flash
    /// (e.g. SmartSSD's internal PCIe switch); `None` = the engine reads at flash speed.
    #[serde(default)]
    pub engine_link: Option<LinkConfig>,
    /// CPU of the offload engine; `None` = kernels run at host speed.
    pub compute: Option<ComputeConfig>,
}

impl DeviceModel {
    /// Theoretical sequential read bandwidth of the flash back-end, MB/s
    /// ([`FlashConfig::seq_read_mb_s`]); `None` without a flash model.
    pub fn flash_read_mb_s(&self) -> Option<f64> {
        self.flash.as_ref().map(FlashConfig::seq_read_mb_s)
    }

    /// Theoretical sequential read bandwidth seen by the offload engine, MB/s: the flash
    /// rate, capped by the engine link if there is one; `None` without a flash model.
    pub fn internal_read_mb_s(&self) -> Option<f64> {
        let flash = self.flash_read_mb_s()?;
        Some(self.engine_link.as_ref().map_or(flash, |l| flash.min(l.mb_s)))
    }

    /// Theoretical sequential read bandwidth seen by the host, MB/s: the flash rate capped
    /// by the host link; `None` without a flash model.
    pub fn host_read_mb_s(&self) -> Option<f64> {
        let flash = self.flash_read_mb_s()?;
        Some(self.link.as_ref().map_or(flash, |l| flash.min(l.mb_s)))
    }

    /// The same device with its back-end re-timed so that [`internal_read_mb_s`]
    /// is exactly `mb_s`: each channel gets `mb_s / channels`, dies are added per channel
    /// until the channel (not the dies) sets the pace, and the engine link is dropped. A model
    /// without flash gets the default back-end first. Latencies and the host link are kept.
    ///
    /// [`internal_read_mb_s`]: Self::internal_read_mb_s
    pub fn with_internal_read_mb_s(mut self, mb_s: f64) -> Result<DeviceModel, ModelError> {
        positive(mb_s).map_err(|reason| ModelError::Spec { spec: format!("{}@{mb_s}", self.name), reason })?;
        let mut f = self.flash.take().unwrap_or_default();
        f.channel_mb_s = mb_s / f64::from(f.channels);
        // The channel sets the pace when dies × t_x >= read_us + t_x.
        let need = (f.read_us / f.page_transfer_us()).ceil() as u32 + 1;
        f.dies_per_channel = f.dies_per_channel.max(need);
        f.validate()?;
        self.flash = Some(f);
        self.engine_link = None;
        self.description = format!("{} (re-timed to {mb_s} MB/s internal read)", self.description);
        self.name = format!("{}@{mb_s}", self.name);
        Ok(self)
    }

    /// Checks every configured part.
    pub fn validate(&self) -> Result<(), ModelError> {
        if let Some(f) = &self.flash {
            f.validate()?;
        }
        for l in self.link.iter().chain(&self.engine_link) {
            l.validate()?;
        }
        self.compute.as_ref().map_or(Ok(()), ComputeConfig::validate)
    }

    /// A pacer for this model over a store of `logical_bytes`.
    pub fn pacer(&self, logical_bytes: u64) -> Result<Pacer, ModelError> {
        Pacer::from_model(self, logical_bytes)
    }

    /// The offload engine's CPU budget, if the model has one.
    pub fn compute_budget(&self) -> Result<Option<ComputeBudget>, ModelError> {
        self.compute.clone().map(ComputeBudget::new).transpose()
    }

    /// The model as pretty JSON for reports, with a `derived` object holding the flash read
    /// and write, internal read and host read bandwidths (MB/s, `null` when not modelled).
    pub fn to_json(&self) -> String {
        let mut v = serde_json::to_value(self).expect("a device model always serialises");
        v["derived"] = serde_json::json!({
            "flash_read_mb_s": self.flash_read_mb_s(),
            "flash_write_mb_s": self.flash.as_ref().map(FlashConfig::seq_write_mb_s),
            "internal_read_mb_s": self.internal_read_mb_s(),
            "host_read_mb_s": self.host_read_mb_s(),
        });
        serde_json::to_string_pretty(&v).expect("a JSON value always prints")
    }
}

/// A two-plane, 256-page-per-block back-end: `(channels, dies per channel, page KiB)`,
/// `(read, program, erase)` in µs, channel MB/s and over-provisioning.
fn flash((channels, dies, page_kib): (u32, u32, u32), (read_us, program_us, erase_us): (f64, f64, f64), channel_mb_s: f64, op: f64) -> FlashConfig {
    FlashConfig {
        channels,
        dies_per_channel: dies,
        planes_per_die: 2,
        page_bytes: page_kib * 1024,
        pages_per_block: 256,
        read_us,
        program_us,
        erase_us,
        channel_mb_s,
        over_provisioning: op,
        power_loss_protection: false,
    }
}

/// Every preset, in a fixed order.
pub fn presets() -> Vec<DeviceModel> {
    let gen3 = Some(LinkConfig::pcie(3, 4));
    vec![
        DeviceModel {
            name: "samsung-980pro".into(),
            description: "Samsung 980 PRO NVMe SSD (TLC V-NAND, PCIe Gen4 x4), no offload engine".into(),
            source: "InstInfer (in-storage attention) evaluation: 8 flash channels at 1.4 GB/s to match the 980 PRO, \
                     11.2 GB/s internal; PCIe Gen4 x4 per Samsung spec sheet. Estimated: 4 dies per channel, \
                     32 KiB two-plane page (as NVMeVirt's 970 PRO profile), 45/500/3500 us read/program/erase, 7 % OP."
                .into(),
            flash: Some(flash((8, 4, 32), (45.0, 500.0, 3500.0), 1400.0, 0.07)),
            link: Some(LinkConfig::pcie(4, 4)),
            engine_link: None,
            compute: None,
        },
        DeviceModel {
            name: "instinfer-csd".into(),
            description: "InstInfer's software-defined CSD: 980 PRO-class back-end with 4 KiB KV pages, PCIe Gen3 x4".into(),
            source: "InstInfer implementation section: NVMeVirt-based InstCSD with 8 flash channels at 1.4 GB/s \
                     (11.2 GB/s internal) to match the 980 PRO, connected by PCIe Gen3 x4 as the OpenSSD was; KV pages \
                     are 4 KB (Section IV-C). Estimated: 8 dies per channel so 4 KiB reads (20 us) keep the channels \
                     busy, 300/3000 us program/erase, 7 % OP. The attention engine runs at this machine's speed."
                .into(),
            flash: Some(flash((8, 8, 4), (20.0, 300.0, 3000.0), 1400.0, 0.07)),
            link: gen3.clone(),
            engine_link: None,
            compute: None,
        },
        DeviceModel {
            name: "intel-p4600".into(),
            description: "Intel DC P4600 1.6 TB data-center NVMe SSD (3D TLC, PCIe Gen3 x4), no offload engine".into(),
            source: "Target drive of the virtual-objects evaluation (8 x P4600 1.6 TB behind 40 GbE). Intel P4500/P4600 \
                     family spec: 3.2 GB/s sequential read, 85 us random read. Estimated: 12 channels x 4 dies sized to \
                     3.2 GB/s, 70 us read (85 us less a 4 KiB transfer), 1200/5000 us program/erase, 25 % OP \
                     (mixed-use drive). Power-loss protection, as Intel's data-center drives have: a flush does \
                     not wait for programs."
                .into(),
            flash: Some(FlashConfig { power_loss_protection: true, ..flash((12, 4, 32), (70.0, 1200.0, 5000.0), 3200.0 / 12.0, 0.25) }),
            link: gen3.clone(),
            engine_link: None,
            compute: None,
        },
        DeviceModel {
            name: "daisyplus-openssd".into(),
            description: "Daisyplus OpenSSD CSD (Xilinx ZU17EG: quad Cortex-A53 + FPGA, 4 channels, PCIe Gen3 x4)".into(),
            source: "InstInfer implementation section: Daisyplus OpenSSD, ZU17EG MPSoC with four ARM cores and 2 GB DRAM, \
                     4 flash channels, 64 GB, PCIe Gen3 x4. Estimated: 4 dies per channel, 16 KiB page, 400 MB/s \
                     channels (1.6 GB/s), 50/600/3000 us; CPU 4 x 0.15 (the A53s at up to 1.5 GHz, scaled from newport's \
                     0.1 per 1 GHz core). FPGA accelerators are not modelled."
                .into(),
            flash: Some(flash((4, 4, 16), (50.0, 600.0, 3000.0), 400.0, 0.07)),
            link: gen3.clone(),
            engine_link: None,
            compute: Some(ComputeConfig { workers: 4, cpu_share: 0.15 }),
        },
        DeviceModel {
            name: "newport".into(),
            description: "NGD Newport CSD (4 x Cortex-A53 @ 1 GHz, 8 GB DRAM, PCIe Gen3 x4)".into(),
            source: "CSDPLAN-EC: Table 2 (4 x Cortex-A53 @ 1.0 GHz); Fig. 4 (host-side read bandwidth 2.28x the \
                     engine's, so the engine link is 3200 / 2.28 = 1404 MB/s); Fig. 3 (the 4-thread engine is 1.7x, \
                     6.3x, 2.8x, 1.3x slower than one EPYC 7352 core: geometric mean 2.50x, so 0.40 host core = \
                     4 x 0.1). Estimated: 3.2 GB/s back-end (8 channels x 400 MB/s), 60/700/3500 us, 7 % OP."
                .into(),
            flash: Some(flash((8, 4, 32), (60.0, 700.0, 3500.0), 400.0, 0.07)),
            link: gen3.clone(),
            engine_link: Some(LinkConfig { mb_s: 3200.0 / 2.28, latency_us: 2.0 }),
            compute: Some(ComputeConfig { workers: 4, cpu_share: 0.1 }),
        },
        DeviceModel {
            name: "smartssd".into(),
            description: "Samsung SmartSSD (Xilinx Kintex KU15P FPGA @ 300 MHz behind an internal PCIe Gen3 x4 switch)".into(),
            source: "CSDPLAN-EC: Table 2 (KU15P @ 300 MHz, 4 GB DDR4); Fig. 4 (host read 1.18x the engine's, limited \
                     by the SSD-FPGA PCIe link: engine link 3200 / 1.18 = 2712 MB/s); Fig. 3 (kernels 1.6x, 4.6x, \
                     28.1x, 15.4x slower than one host core: geometric mean 7.5x, so 1 x 0.133). Estimated: 3.2 GB/s \
                     back-end (PM983-class, 8 channels x 4 dies x 400 MB/s), 60/600/3500 us, 7 % OP."
                .into(),
            flash: Some(flash((8, 4, 32), (60.0, 600.0, 3500.0), 400.0, 0.07)),
            link: gen3,
            engine_link: Some(LinkConfig { mb_s: 3200.0 / 1.18, latency_us: 1.0 }),
            compute: Some(ComputeConfig { workers: 1, cpu_share: 0.133 }),
        },
    ]
}

/// The preset called `name`, or `None`.
pub fn preset(name: &str) -> Option<DeviceModel> {
    presets().into_iter().find(|m| m.name == name)
}

/// A generic drive whose offload engine reads sequentially at `mb_s`: the `samsung-980pro`
/// back-end and host link, re-timed with [`DeviceModel::with_internal_read_mb_s`].
pub fn custom(mb_s: f64) -> Result<DeviceModel, ModelError> {
    let mut base = preset("samsung-980pro").expect("the samsung-980pro preset exists");
    base.name = "custom".into();
    base.description = "generic NVMe drive".into();
    base.with_internal_read_mb_s(mb_s)
}

/// Resolves a model specification: a preset name (`newport`), a preset re-timed to an
/// internal read rate in MB/s (`newport@2000`), or a generic drive (`custom:2000`).
pub fn parse(spec: &str) -> Result<DeviceModel, ModelError> {
    let rate = |s: &str| s.trim().parse::<f64>().map_err(|_| ModelError::Spec { spec: spec.into(), reason: format!("`{s}` is not a rate in MB/s") });
    if let Some(r) = spec.strip_prefix("custom:") {
        return custom(rate(r)?);
    }
    let (name, retime) = match spec.split_once('@') {
        Some((n, r)) => (n, Some(rate(r)?)),
        None => (spec, None),
    };
    let model = preset(name.trim()).ok_or_else(|| ModelError::Unknown {
        kind: "device model",
        name: name.into(),
        known: presets().iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
    })?;
    match retime {
        Some(r) => model.with_internal_read_mb_s(r),
        None => Ok(model),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Flash, Link};

    /// Reads 256 MiB sequentially in 1 MiB requests all issued at time 0 and returns the
    /// bandwidth (MB/s) at the flash and after the engine link.
    fn simulated_read_mb_s(model: &DeviceModel) -> (f64, f64) {
        const TOTAL: u64 = 256 << 20;
        const REQ: u64 = 1 << 20;
        let mut flash = Flash::new(model.flash.clone().unwrap(), TOTAL).unwrap();
        let mut engine = model.engine_link.clone().map(|l| Link::new(l).unwrap());
        let (mut flash_done, mut engine_done) = (0, 0);
        for i in 0..TOTAL / REQ {
            let done = flash.read(0, i * REQ, REQ);
            flash_done = flash_done.max(done);
            engine_done = engine_done.max(engine.as_mut().map_or(done, |l| l.transfer(done, REQ)));
        }
        let mb_s = |ns: u64| TOTAL as f64 * 1000.0 / ns as f64;
        (mb_s(flash_done), mb_s(engine_done))
    }

    fn within(got: f64, want: f64, tolerance: f64) -> bool {
        (got - want).abs() <= want * tolerance
    }

    #[test]
    fn every_preset_is_valid_sourced_and_unique() {
        let all = presets();
        assert!(all.len() >= 5);
        for m in &all {
            m.validate().unwrap();
            assert!(!m.source.is_empty() && !m.description.is_empty(), "{}", m.name);
            assert_eq!(preset(&m.name).as_ref(), Some(m));
            assert_eq!(all.iter().filter(|o| o.name == m.name).count(), 1);
        }
        for name in ["samsung-980pro", "instinfer-csd", "intel-p4600", "daisyplus-openssd", "newport", "smartssd"] {
            assert!(preset(name).is_some(), "{name}");
        }
        assert!(preset("nope").is_none());
    }

    #[test]
    fn presets_simulate_within_one_percent_of_their_theoretical_read_rate() {
        for m in presets() {
            let (flash, internal) = simulated_read_mb_s(&m);
            let (want_flash, want_internal) = (m.flash_read_mb_s().unwrap(), m.internal_read_mb_s().unwrap());
            assert!(within(flash, want_flash, 0.01), "{}: flash {flash:.0} vs {want_flash:.0}", m.name);
            assert!(within(internal, want_internal, 0.01), "{}: internal {internal:.0} vs {want_internal:.0}", m.name);
        }
    }

    #[test]
    fn published_numbers_come_out_of_the_parameters() {
        let mb = |n: &str| preset(n).unwrap().internal_read_mb_s().unwrap().round();
        assert_eq!(mb("samsung-980pro"), 11200.0);
        assert_eq!(mb("intel-p4600"), 3200.0);
        assert_eq!(mb("newport"), 1404.0);
        assert_eq!(mb("smartssd"), 2712.0);
        let n = preset("newport").unwrap();
        assert!(within(n.host_read_mb_s().unwrap() / n.internal_read_mb_s().unwrap(), 2.28, 0.001));
        assert!(within(n.compute.unwrap().rate(), 0.4, 1e-9));
        let p = preset("intel-p4600").unwrap().flash.unwrap();
        assert!(within(p.read_us + 4096.0 / p.channel_mb_s, 85.0, 0.01), "random 4 KiB read latency");
    }

    #[test]
    fn retimed_models_deliver_the_asked_rate() {
        for m in presets() {
            for want in [300.0, 2000.0, 7000.0, 25_000.0] {
                let r = m.clone().with_internal_read_mb_s(want).unwrap();
                assert!(within(r.internal_read_mb_s().unwrap(), want, 1e-9), "{}", r.name);
                let (_, got) = simulated_read_mb_s(&r);
                assert!(within(got, want, 0.01), "{} at {want}: {got:.0}", r.name);
            }
        }
        assert!(custom(0.0).is_err());
    }

    #[test]
    fn specs_resolve_presets_retimes_and_custom_drives() {
        assert_eq!(parse("newport").unwrap().name, "newport");
        let r = parse("smartssd@1500").unwrap();
        assert_eq!(r.name, "smartssd@1500");
        assert!(within(r.internal_read_mb_s().unwrap(), 1500.0, 1e-9));
        assert!(r.compute.is_some() && r.engine_link.is_none());
        assert!(within(parse("custom:2000").unwrap().internal_read_mb_s().unwrap(), 2000.0, 1e-9));
        let e = parse("floppy").unwrap_err().to_string();
        assert!(e.contains("floppy") && e.contains("newport"), "{e}");
        assert!(parse("newport@fast").unwrap_err().to_string().contains("fast"));
        assert!(parse("custom:-5").is_err());
    }

    #[test]
    fn json_reports_round_trip_and_carry_derived_rates() {
        let m = preset("smartssd").unwrap();
        let json = m.to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["name"], "smartssd");
        assert!((v["derived"]["internal_read_mb_s"].as_f64().unwrap() - 2711.86).abs() < 0.01);
        let back: DeviceModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
        let bare = DeviceModel { flash: None, engine_link: None, ..m };
        assert!(bare.internal_read_mb_s().is_none());
        assert!(bare.to_json().contains("\"flash_read_mb_s\": null"));
    }

    #[test]
    fn models_build_their_pacer_and_budget() {
        let m = preset("newport").unwrap();
        let pacer = m.pacer(1 << 30).unwrap();
        assert!(pacer.is_active());
        assert!(m.compute_budget().unwrap().is_some());
        assert!(preset("samsung-980pro").unwrap().compute_budget().unwrap().is_none());
    }
}
