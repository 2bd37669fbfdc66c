// SPDX-License-Identifier: Apache-2.0
//! `insitu model list|show NAME`: the device models a target can emulate.

use crate::Failure;

pub(crate) fn list(json_out: bool) -> Result<i32, Failure> {
    let models = insitu_model::presets();
    if json_out {
        let docs: Vec<serde_json::Value> = models.iter().map(|m| serde_json::from_str(&m.to_json()).unwrap_or_default()).collect();
        println!("{}", serde_json::to_string_pretty(&docs).unwrap_or_default());
        return Ok(0);
    }
    println!("{:<18} {:>11} {:>11} {:>11}  description", "model", "flash MB/s", "engine MB/s", "host MB/s");
    for m in &models {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
        println!("{:<18} {:>11} {:>11} {:>11}  {}", m.name, f(m.flash_read_mb_s()), f(m.internal_read_mb_s()), f(m.host_read_mb_s()), m.description);
    }
    println!("\nAlso: NAME@MBPS (a preset re-timed to an internal read rate) and custom:MBPS.");
    Ok(0)
}

pub(crate) fn show(spec: &str, _json_out: bool) -> Result<i32, Failure> {
    let m = insitu_model::parse(spec).map_err(|e| e.to_string())?;
    println!("{}", m.to_json());
    Ok(0)
}

/// Where an image's device model is recorded: a sidecar file next to it.
pub(crate) fn sidecar(image: &std::path::Path) -> std::path::PathBuf {
    insitu_host::model_sidecar(image)
}

/// Records (or with `None`, removes) the device model of an image.
pub(crate) fn set_image_model(image: &std::path::Path, spec: Option<&str>) -> Result<(), Failure> {
    let path = sidecar(image);
    match spec {
        Some(s) => {
            insitu_model::parse(s).map_err(|e| e.to_string())?;
            std::fs::write(&path, format!("{s}\n")).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        None => {
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(())
}
