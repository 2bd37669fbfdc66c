// SPDX-License-Identifier: Apache-2.0
//! `GET /containers/{id}/json`: every field of moby's `ContainerInspectResponse` for the
//! advertised API version, `Config` and `HostConfig` with the values given at create
//! (over the defaults Docker reports for fields left out) and what the container runs
//! with (its command, environment, working directory, user as resolved from the image).

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::body::{json, ApiBody};
use super::containers::{exposed, fail, mounts, network_ports, port_bindings_asked, secs};
use super::images::rfc3339;
use crate::runtime::{Container, RunState, Runtime};

/// The `HostConfig` Docker reports for a container created with none of its options.
fn host_config_defaults() -> Value {
    json!({
        "Binds": null, "ContainerIDFile": "", "LogConfig": {"Type": "json-file", "Config": {}}, "NetworkMode": "bridge",
        "PortBindings": {}, "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "AutoRemove": false, "VolumeDriver": "",
        "VolumesFrom": null, "ConsoleSize": [0, 0], "Annotations": null, "CapAdd": null, "CapDrop": null, "CgroupnsMode": "private",
        "Dns": [], "DnsOptions": [], "DnsSearch": [], "ExtraHosts": null, "GroupAdd": null, "IpcMode": "private", "Cgroup": "",
        "Links": null, "OomScoreAdj": 0, "PidMode": "", "Privileged": false, "PublishAllPorts": false, "ReadonlyRootfs": false,
        "SecurityOpt": ["no-new-privileges"], "StorageOpt": null, "Tmpfs": null, "UTSMode": "", "UsernsMode": "", "ShmSize": 67108864,
        "Sysctls": null, "Runtime": "runc", "Isolation": "", "CpuShares": 0, "Memory": 0, "NanoCpus": 0, "CgroupParent": "",
        "BlkioWeight": 0, "BlkioWeightDevice": [], "BlkioDeviceReadBps": [], "BlkioDeviceWriteBps": [], "BlkioDeviceReadIOps": [],
        "BlkioDeviceWriteIOps": [], "CpuPeriod": 0, "CpuQuota": 0, "CpuRealtimePeriod": 0, "CpuRealtimeRuntime": 0, "CpusetCpus": "",
        "CpusetMems": "", "Devices": [], "DeviceCgroupRules": null, "DeviceRequests": null, "MemoryReservation": 0, "MemorySwap": 0,
        "MemorySwappiness": null, "OomKillDisable": false, "PidsLimit": null, "Ulimits": [], "CpuCount": 0, "CpuPercent": 0,
        "IOMaximumIOps": 0, "IOMaximumBandwidth": 0, "Mounts": null, "Init": null,
        "MaskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                        "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/sys/devices/virtual/powercap"],
        "ReadonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    })
}

/// Lays the fields of `given` that carry a value over `base` (a null given leaves the
/// default, as Docker fills a field left out).
fn overlay(base: &mut Value, given: &Value) {
    if let (Some(b), Some(g)) = (base.as_object_mut(), given.as_object()) {
        for (k, v) in g {
            if v.is_null() {
                continue;
            }
            match (b.get_mut(k), v) {
                (Some(bv @ Value::Object(_)), Value::Object(_)) => overlay(bv, v),
                _ => {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// The container's `HostConfig`: the defaults, what was given, and what it runs with.
pub(crate) fn host_config(rt: &Runtime, c: &Container) -> Value {
    let mut hc = host_config_defaults();
    overlay(&mut hc, &c.spec.host_config);
    hc["NetworkMode"] = json!(super::networks::mode_name(c));
    hc["PortBindings"] = port_bindings_asked(c);
    hc["Binds"] = if c.spec.binds.is_empty() { Value::Null } else { json!(c.spec.binds) };
    hc["AutoRemove"] = json!(c.spec.auto_remove);
    hc["Memory"] = json!(c.spec.memory.unwrap_or(0));
    // What `update` changed since create.
    overlay(&mut hc, &Value::Object(c.updates()));
    let links = rt.links_shown(c);
    hc["Links"] = if links.is_empty() { Value::Null } else { json!(links) };
    let policy = c.restart_policy();
    hc["RestartPolicy"] = json!({"Name": if policy.name.is_empty() { "no" } else { &policy.name }, "MaximumRetryCount": policy.max_retries});
    if hc["LogConfig"]["Type"] == "" {
        hc["LogConfig"]["Type"] = json!("json-file");
    }
    if let Some((rows, cols)) = c.spec.console_size {
        hc["ConsoleSize"] = json!([rows, cols]);
    }
    hc
}

/// The container's `Config`: what was given, with the image's defaults filled in as the
/// container runs them.
pub(crate) fn config(c: &Container) -> Value {
    let mut cfg = json!({
        "Hostname": if c.spec.options.uts_host {
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
        } else {
            c.spec.options.hostname.clone().unwrap_or_else(|| c.id[..12].to_string())
        }, "Domainname": "", "User": "",
        "AttachStdin": false, "AttachStdout": false, "AttachStderr": false, "Tty": false, "OpenStdin": false, "StdinOnce": false,
        "Env": [], "Cmd": null, "Image": "", "Volumes": null, "WorkingDir": "", "Entrypoint": null, "OnBuild": null, "Labels": {},
    });
    overlay(&mut cfg, &c.spec.config);
    cfg["Image"] = json!(c.spec.image);
    cfg["Env"] = json!(c.env);
    cfg["Cmd"] = json!(c.cmd);
    cfg["Entrypoint"] = json!(c.entrypoint);
    cfg["WorkingDir"] = json!(c.cwd);
    cfg["User"] = json!(c.spec.options.user.clone().unwrap_or_default());
    cfg["Tty"] = json!(c.spec.tty);
    cfg["OpenStdin"] = json!(c.spec.open_stdin);
    cfg["Labels"] = json!(c.spec.labels);
    let ports = exposed(c);
    if !ports.is_empty() {
        cfg["ExposedPorts"] = Value::Object(ports.iter().map(|p| (p.to_string(), json!({}))).collect());
    }
    cfg
}

/// `State.Health` of a container with a health check: `starting` until its first probe.
fn health(rt: &Runtime, c: &Container) -> Value {
    let nanos = |t: std::time::SystemTime| {
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        format!("{}.{:09}Z", rfc3339(d.as_secs() as i64).trim_end_matches('Z'), d.subsec_nanos())
    };
    match rt.health(&c.id) {
        Some(h) => json!({"Status": h.status, "FailingStreak": h.failing_streak,
            "Log": h.log.iter().map(|p| json!({"Start": nanos(p.start), "End": nanos(p.end), "ExitCode": p.exit_code, "Output": p.output})).collect::<Vec<_>>()}),
        None => json!({"Status": "starting", "FailingStreak": 0, "Log": []}),
    }
}

/// `GET /containers/{id}/json`.
pub fn inspect(rt: &Runtime, id: &str) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let zero = "0001-01-01T00:00:00Z".to_string();
    let paused = c.paused();
    let (status_word, running, pid, code, started, finished) = match c.state() {
        RunState::Created => ("created", false, 0, 0, zero.clone(), zero.clone()),
        RunState::Running { started, pid } => (if paused { "paused" } else { "running" }, true, pid, 0, rfc3339(secs(started)), zero.clone()),
        RunState::Exited { code, started, finished } => {
            (if c.restarting() { "restarting" } else { "exited" }, false, 0, code, started.map_or(zero.clone(), |s| rfc3339(secs(s))), rfc3339(secs(finished)))
        }
    };
    let args = if c.args.len() > 1 { c.args[1..].to_vec() } else { Vec::new() };
    let networks = super::networks::container_networks(rt, &c);
    let mut state = json!({"Status": status_word, "Running": running, "Paused": paused, "Restarting": c.restarting(), "OOMKilled": false,
                           "Dead": false, "Pid": pid, "ExitCode": code, "Error": c.error(), "StartedAt": started, "FinishedAt": finished});
    if c.spec.health.is_some() {
        state["Health"] = health(rt, &c);
    }
    json(
        StatusCode::OK,
        &json!({
            "Id": c.id, "Created": rfc3339(secs(c.created)), "Path": c.args.first(), "Args": args,
            "State": state,
            "Image": c.image_id, "ResolvConfPath": "", "HostnamePath": "", "HostsPath": "", "LogPath": c.log_path(),
            "Name": format!("/{}", c.name()), "RestartCount": c.restarts(), "Driver": "overlay", "Platform": "linux",
            "MountLabel": "", "ProcessLabel": "", "AppArmorProfile": "", "ExecIDs": c.exec_ids(), "Mounts": mounts(rt, &c),
            "HostConfig": host_config(rt, &c), "Config": config(&c),
            "GraphDriver": {"Name": "overlay", "Data": null},
            "NetworkSettings": {"Bridge": "", "SandboxID": "", "SandboxKey": "", "HairpinMode": false, "LinkLocalIPv6Address": "",
                                "LinkLocalIPv6PrefixLen": 0, "Ports": network_ports(&c), "SecondaryIPAddresses": null,
                                "SecondaryIPv6Addresses": null, "EndpointID": "", "Gateway": "", "GlobalIPv6Address": "",
                                "GlobalIPv6PrefixLen": 0, "IPAddress": "", "IPPrefixLen": 0, "IPv6Gateway": "", "MacAddress": "",
                                "Networks": networks},
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_fields_lie_over_the_defaults() {
        let mut base = host_config_defaults();
        overlay(&mut base, &json!({"CpuShares": 512, "LogConfig": {"Type": "local"}, "Dns": null}));
        assert_eq!(base["CpuShares"], 512);
        assert_eq!(base["LogConfig"], json!({"Type": "local", "Config": {}}));
        assert_eq!(base["Dns"], json!([]));
    }

    #[test]
    fn every_host_config_field_of_the_api_has_a_default() {
        // The fields of moby's HostConfig (API 1.47): inspect answers each one.
        let d = host_config_defaults();
        for f in super::super::create::tests_support::HOST_CONFIG_FIELDS {
            assert!(d.get(*f).is_some(), "{f}");
        }
    }
}
