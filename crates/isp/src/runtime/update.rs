// SPDX-License-Identifier: Apache-2.0
//! `docker update`: new cgroup limits and restart policy for a container, applied to a
//! running one at once (`runc update`) and to every later run, kept beside its record.

use serde_json::{json, Map, Value};

use super::{RunState, Runtime, RuntimeError};

/// The `HostConfig` fields `update` may change.
pub const UPDATABLE: &[&str] =
    &["CpuShares", "CpuPeriod", "CpuQuota", "NanoCpus", "CpusetCpus", "CpusetMems", "Memory", "MemorySwap", "MemoryReservation", "PidsLimit", "RestartPolicy"];

/// The `runc update` options of `changes`.
fn runc_flags(changes: &Map<String, Value>) -> Vec<String> {
    let mut v = Vec::new();
    let num = |k: &str| changes.get(k).and_then(Value::as_i64);
    if let Some(n) = num("CpuShares") {
        v.push(format!("--cpu-share={n}"));
    }
    if let Some(n) = num("NanoCpus").filter(|&n| n > 0) {
        v.push("--cpu-period=100000".into());
        v.push(format!("--cpu-quota={}", n / 10_000));
    }
    if let Some(n) = num("CpuPeriod") {
        v.push(format!("--cpu-period={n}"));
    }
    if let Some(n) = num("CpuQuota") {
        v.push(format!("--cpu-quota={n}"));
    }
    for (k, flag) in [("CpusetCpus", "--cpuset-cpus"), ("CpusetMems", "--cpuset-mems")] {
        if let Some(s) = changes.get(k).and_then(Value::as_str) {
            v.push(format!("{flag}={s}"));
        }
    }
    for (k, flag) in [("Memory", "--memory"), ("MemoryReservation", "--memory-reservation"), ("MemorySwap", "--memory-swap"), ("PidsLimit", "--pids-limit")] {
        if let Some(n) = num(k) {
            v.push(format!("{flag}={n}"));
        }
    }
    // As at create: without a swap limit of its own, memory and swap are one limit (the
    // kernel refuses a memory limit above the swap limit).
    if let (Some(n), None) = (num("Memory"), num("MemorySwap")) {
        v.push(format!("--memory-swap={n}"));
    }
    v
}

/// Applies recorded `updates` to a runc configuration made at start.
pub fn apply(updates: &Map<String, Value>, config: &mut Value) {
    let res = &mut config["linux"]["resources"];
    let num = |k: &str| updates.get(k).and_then(Value::as_i64);
    let mut set = |group: &str, key: &str, v: Value| {
        if !res[group].is_object() {
            res[group] = json!({});
        }
        res[group][key] = v;
    };
    if let Some(n) = num("CpuShares") {
        set("cpu", "shares", json!(n));
    }
    if let Some(n) = num("NanoCpus").filter(|&n| n > 0) {
        set("cpu", "period", json!(100_000));
        set("cpu", "quota", json!(n / 10_000));
    }
    if let Some(n) = num("CpuPeriod") {
        set("cpu", "period", json!(n));
    }
    if let Some(n) = num("CpuQuota") {
        set("cpu", "quota", json!(n));
    }
    if let Some(s) = updates.get("CpusetCpus") {
        set("cpu", "cpus", s.clone());
    }
    if let Some(s) = updates.get("CpusetMems") {
        set("cpu", "mems", s.clone());
    }
    if let Some(n) = num("Memory") {
        set("memory", "limit", json!(n));
        // The swap limit follows the memory limit unless it was updated too.
        if num("MemorySwap").is_none() {
            set("memory", "swap", json!(n));
        }
    }
    if let Some(n) = num("MemorySwap") {
        set("memory", "swap", json!(n));
    }
    if let Some(n) = num("MemoryReservation") {
        set("memory", "reservation", json!(n));
    }
    if let Some(n) = num("PidsLimit").filter(|&n| n > 0) {
        set("pids", "limit", json!(n));
    }
}

impl Runtime {
    /// `docker update`: `changes` (checked by the API, [`UPDATABLE`] fields only) reach a
    /// running container through `runc update`, then are recorded for later runs.
    pub async fn update(&self, key: &str, changes: Map<String, Value>) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        let flags = runc_flags(&changes);
        if matches!(c.state(), RunState::Running { .. }) && !flags.is_empty() {
            let out = tokio::process::Command::new("runc")
                .arg("--root")
                .arg(&self.runc_root)
                .arg("update")
                .args(&flags)
                .arg(&c.id)
                .output()
                .await
                .map_err(|e| RuntimeError::Setup(format!("runc update: {e}")))?;
            if !out.status.success() {
                return Err(RuntimeError::BadRequest(format!("Cannot update container {}: {}", &c.id[..12], String::from_utf8_lossy(&out.stderr).trim())));
            }
        }
        c.record_updates(&changes)?;
        self.container_event(&c, "update", &[]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_become_runc_flags_and_configuration() {
        let ch: Map<String, Value> = serde_json::from_value(json!({"Memory": 20971520, "CpuShares": 256, "CpusetCpus": "0"})).unwrap();
        let f = runc_flags(&ch);
        assert!(f.contains(&"--memory=20971520".to_string()) && f.contains(&"--cpu-share=256".to_string()) && f.contains(&"--cpuset-cpus=0".to_string()));
        let mut cfg = json!({"linux": {"resources": {}}});
        apply(&ch, &mut cfg);
        assert_eq!(cfg["linux"]["resources"]["memory"], json!({"limit": 20971520, "swap": 20971520}));
        assert_eq!(cfg["linux"]["resources"]["cpu"], json!({"shares": 256, "cpus": "0"}));
    }
}
