// SPDX-License-Identifier: Apache-2.0
//! Container endpoints besides the life cycle and its streams: `rename`, `prune`, `top`
//! (the target's `ps`, limited to the container's processes, as Docker does) and `stats`
//! (from the container's cgroup counters).

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

use super::body::{empty, error, json, stream, ApiBody};
use super::containers::{fail, passes};
use super::filters::Filters;
use super::Target;
use crate::runtime::cgroup::{system_cpu, Cgroup};
use crate::runtime::update::UPDATABLE;
use crate::runtime::{Container, RunState, Runtime, RuntimeError};

/// `POST /containers/{id}/rename?name=NEW`.
pub fn rename(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let Some(name) = t.get("name") else { return error(400, "give name=NEW") };
    match rt.rename(id, name) {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `POST /containers/{id}/update`: new limits and restart policy (the fields of
/// [`UPDATABLE`]); any other field given a value is refused by name, as are values the
/// create would refuse. Fields left at zero are unchanged, as with Docker.
pub async fn update(rt: &Runtime, id: &str, req: hyper::Request<hyper::body::Incoming>) -> Response<ApiBody> {
    let body = match super::read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match update_changes(&body, c.spec.auto_remove) {
        Ok(ch) => match rt.update(id, ch).await {
            Ok(()) => json(StatusCode::OK, &json!({"Warnings": []})),
            Err(e) => fail(e),
        },
        Err(m) => error(400, &m),
    }
}

/// The changes an update request asks for, checked.
pub(crate) fn update_changes(body: &Value, auto_remove: bool) -> Result<serde_json::Map<String, Value>, String> {
    let Some(m) = body.as_object() else { return Err("the update request must be a JSON object".into()) };
    let mut out = serde_json::Map::new();
    for (k, v) in m {
        if super::host_config::is_default(v) {
            continue;
        }
        if !UPDATABLE.contains(&k.as_str()) {
            return Err(format!("{k} cannot be updated on this target: update changes {}", UPDATABLE.join(", ")));
        }
        match k.as_str() {
            "CpusetCpus" | "CpusetMems" => {
                let s = v.as_str().ok_or_else(|| format!("{k} must be a string"))?;
                if !s.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '-') {
                    return Err(format!("invalid {k} {s:?}: a list of numbers and ranges, as 0-2,4"));
                }
            }
            "RestartPolicy" => {
                let name = v.get("Name").and_then(Value::as_str).unwrap_or("");
                let max = v.get("MaximumRetryCount").and_then(Value::as_i64).unwrap_or(0);
                if !matches!(name, "" | "no" | "always" | "unless-stopped" | "on-failure") || max < 0 || (max != 0 && name != "on-failure") {
                    return Err(format!("invalid restart policy {v}: no, always, unless-stopped or on-failure[:N]"));
                }
                if auto_remove && !matches!(name, "" | "no") {
                    return Err("Restart policy cannot be updated because AutoRemove is enabled for the container".into());
                }
            }
            "MemorySwap" => {
                if v.as_i64().is_none_or(|n| n < -1) {
                    return Err("MemorySwap must be -1 (unlimited) or a number of bytes".into());
                }
            }
            _ => {
                if v.as_i64().is_none_or(|n| n < 0) {
                    return Err(format!("{k} must be a number that is not negative"));
                }
            }
        }
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

/// `GET /containers/{id}/changes`: `[{"Path", "Kind"}]` (0 modified, 1 added, 2 deleted).
pub fn changes(rt: &Runtime, id: &str) -> Response<ApiBody> {
    match rt.changes(id) {
        Ok(c) => json(StatusCode::OK, &Value::Array(c.into_iter().map(|(p, k)| json!({"Path": p, "Kind": k as u8})).collect())),
        Err(e) => fail(e),
    }
}

/// `POST /containers/prune?filters=...` (`label`, `label!`, `until`).
pub async fn prune(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    if let Err(m) = f.only(&["label", "label!", "until"]) {
        return error(400, &m);
    }
    // Checked once up front, so a bad filter removes nothing.
    if let Some(c) = rt.list().first() {
        if let Err(m) = passes(rt, c, &f) {
            return error(400, &m);
        }
    }
    let sizes: Vec<(String, u64)> = rt.list().iter().map(|c| (c.id.clone(), crate::image::layer_size(&c.upper_dir()))).collect();
    let chosen: Vec<String> = rt.list().iter().filter(|c| passes(rt, c, &f).unwrap_or(false)).map(|c| c.id.clone()).collect();
    let gone = rt.prune(chosen).await;
    let reclaimed: u64 = sizes.iter().filter(|(id, _)| gone.contains(id)).map(|(_, s)| s).sum();
    json(StatusCode::OK, &json!({"ContainersDeleted": gone, "SpaceReclaimed": reclaimed}))
}

fn running(rt: &Runtime, id: &str) -> Result<std::sync::Arc<Container>, RuntimeError> {
    let c = rt.get(id)?;
    if !matches!(c.state(), RunState::Running { .. }) {
        return Err(RuntimeError::Conflict(format!("Container {} is not running", &c.id[..12])));
    }
    Ok(c)
}

/// `GET /containers/{id}/top?ps_args=ARGS`: the target's `ps ARGS` (`-ef` by default),
/// the lines of the container's processes only.
pub async fn top(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match running(rt, id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let args: Vec<String> = t.get("ps_args").unwrap_or("-ef").split_whitespace().map(str::to_string).collect();
    if args.iter().any(|a| !a.chars().all(|ch| ch.is_ascii_alphanumeric() || "-,=%:_".contains(ch))) {
        return error(400, &format!("invalid ps_args {:?}: ps options only", t.get("ps_args").unwrap_or("")));
    }
    let pids = Cgroup::of(&c.id).pids();
    let out = match tokio::process::Command::new("ps").args(&args).output().await {
        Ok(o) => o,
        Err(e) => return error(500, &format!("ps: {e}")),
    };
    if !out.status.success() {
        return error(500, &format!("ps {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    match ps_table(&String::from_utf8_lossy(&out.stdout), &pids) {
        Ok((titles, rows)) => json(StatusCode::OK, &json!({"Titles": titles, "Processes": rows})),
        Err(m) => error(500, &m),
    }
}

/// The header and the rows of `ps` output whose PID is in `pids`; the last column takes
/// the rest of its line (a command with spaces).
fn ps_table(text: &str, pids: &[i32]) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
    let mut lines = text.lines();
    let titles: Vec<String> = lines.next().unwrap_or("").split_whitespace().map(str::to_string).collect();
    let col = titles.iter().position(|t| t == "PID").ok_or("Couldn't find PID field in ps output")?;
    let mut rows = Vec::new();
    for l in lines {
        let mut fields: Vec<String> = l.split_whitespace().map(str::to_string).collect();
        if fields.len() < titles.len() {
            continue;
        }
        let rest = fields.split_off(titles.len() - 1).join(" ");
        fields.push(rest);
        if fields[col].parse::<i32>().is_ok_and(|p| pids.contains(&p)) {
            rows.push(fields);
        }
    }
    Ok((titles, rows))
}

/// One `stats` sample, moby's shape.
fn sample(c: &Container, pre: &Value) -> Value {
    let cg = Cgroup::of(&c.id);
    let (total, user, system, per) = cg.cpu();
    let (sys, cpus) = system_cpu();
    let (usage, max, limit, stats) = cg.memory();
    let (pids, pids_max) = cg.pids_counts();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let read = format!("{}.{:09}Z", super::images::rfc3339(now.as_secs() as i64).trim_end_matches('Z'), now.subsec_nanos());
    json!({
        "read": read, "preread": pre.get("read").cloned().unwrap_or(json!("0001-01-01T00:00:00Z")),
        "id": c.id, "name": format!("/{}", c.name()), "num_procs": 0,
        "pids_stats": {"current": pids, "limit": pids_max},
        "cpu_stats": {"cpu_usage": {"total_usage": total, "percpu_usage": per, "usage_in_kernelmode": system, "usage_in_usermode": user},
                      "system_cpu_usage": sys, "online_cpus": cpus, "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0}},
        "precpu_stats": pre.get("cpu_stats").cloned().unwrap_or(json!({"cpu_usage": {"total_usage": 0, "usage_in_kernelmode": 0, "usage_in_usermode": 0},
                                                                    "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0}})),
        "memory_stats": {"usage": usage, "max_usage": max, "limit": limit, "stats": stats.into_iter().map(|(k, v)| (k, json!(v))).collect::<serde_json::Map<String, Value>>()},
        "blkio_stats": {"io_service_bytes_recursive": null, "io_serviced_recursive": null, "io_queue_recursive": null,
                        "io_service_time_recursive": null, "io_wait_time_recursive": null, "io_merged_recursive": null,
                        "io_time_recursive": null, "sectors_recursive": null},
        "storage_stats": {},
        "networks": {"lo": {"rx_bytes": 0, "rx_packets": 0, "rx_errors": 0, "rx_dropped": 0, "tx_bytes": 0, "tx_packets": 0, "tx_errors": 0, "tx_dropped": 0}},
    })
}

/// `GET /containers/{id}/stats?stream=1&one-shot=0`: a sample a second while the
/// container runs (`stream=0`: one, with the previous CPU figures of a second before
/// unless `one-shot`). A container that does not run answers zeros, as Docker does.
pub async fn stats(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let streaming = t.get("stream").is_none_or(|s| matches!(s, "1" | "true" | "True"));
    let one_shot = t.flag("one-shot");
    if one_shot && streaming {
        return error(400, "cannot have stream=true and one-shot=true");
    }
    let (resp, tx) = stream(StatusCode::OK, "application/json");
    tokio::spawn(async move {
        let mut pre = json!({});
        if !streaming && !one_shot && matches!(c.state(), RunState::Running { .. }) {
            pre = sample(&c, &json!({}));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        loop {
            let s = sample(&c, &pre);
            if tx.send(Bytes::from(s.to_string() + "\n")).await.is_err() || !streaming || !matches!(c.state(), RunState::Running { .. }) {
                return;
            }
            pre = s;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ps_output_is_cut_to_the_containers_processes() {
        let text = "UID PID PPID C STIME TTY TIME CMD\nroot 10 1 0 10:00 ? 00:00:00 sleep 300\nroot 11 1 0 10:00 ? 00:00:00 sh -c x y\nroot 12 1 0 10:00 ? 00:00:00 other\n";
        let (titles, rows) = ps_table(text, &[10, 11]).unwrap();
        assert_eq!(titles.len(), 8);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1][7], "sh -c x y");
        assert!(ps_table("UID CMD\nroot x\n", &[1]).is_err());
    }

    #[test]
    fn update_requests_are_checked() {
        let ch = update_changes(&json!({"Memory": 20971520, "CpuShares": 0, "BlkioWeight": 0, "RestartPolicy": {"Name": "", "MaximumRetryCount": 0}}), false)
            .unwrap();
        assert_eq!(ch.keys().collect::<Vec<_>>(), ["Memory"]);
        assert!(update_changes(&json!({"BlkioWeight": 300}), false).unwrap_err().contains("BlkioWeight"));
        assert!(update_changes(&json!({"Memory": "lots"}), false).is_err());
        assert!(update_changes(&json!({"RestartPolicy": {"Name": "always"}}), true).is_err());
        assert!(update_changes(&json!({"CpusetCpus": "a"}), false).is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_update_bodies_never_panic(s in ".{0,120}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = update_changes(&v, false);
            }
        }

        #[test]
        fn random_ps_output_never_panics(s in "[ a-zA-Z0-9\n]{0,200}") {
            let _ = ps_table(&s, &[1, 2, 3]);
        }
    }
}
