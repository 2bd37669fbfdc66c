// SPDX-License-Identifier: Apache-2.0
//! `POST /containers/create`: the request checked field by field.
//!
//! Every field of `Config` and `HostConfig` that moby's API defines is either honoured
//! (parsed here into a [`CreateSpec`] the runtime applies) or, when given a value other
//! than its default, refused with a 400 that names it and says why. Nothing is accepted
//! and then ignored. The request's `Config` and `HostConfig` are kept as given, so that
//! `inspect` answers them back.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use std::sync::Arc;

use super::body::{error, json, ApiBody};
use super::host_config::{console_size, flag, is_default, mounts, number, options, strings, text, REFUSED_CONFIG, REFUSED_HOST};
use super::{read_json, Target};
use crate::runtime::networks::PREDEFINED;
use crate::runtime::{exposed_ports, port_bindings, CreateSpec, NetworkMode, Runtime, RuntimeError};

/// The `Config` fields a create request may carry, besides `HostConfig` and
/// `NetworkingConfig`.
const CONFIG_FIELDS: &[&str] = &[
    "Hostname",
    "Domainname",
    "User",
    "AttachStdin",
    "AttachStdout",
    "AttachStderr",
    "ExposedPorts",
    "Tty",
    "OpenStdin",
    "StdinOnce",
    "Env",
    "Cmd",
    "Healthcheck",
    "ArgsEscaped",
    "Image",
    "Volumes",
    "WorkingDir",
    "Entrypoint",
    "NetworkDisabled",
    "MacAddress",
    "OnBuild",
    "Labels",
    "StopSignal",
    "StopTimeout",
    "Shell",
];

/// The parts of a create request the runtime honours, type-checked; an option that
/// cannot be honoured is an error naming it.
pub(crate) fn create_spec(body: &Value) -> Result<CreateSpec, String> {
    if !body.is_object() {
        return Err("the create request must be a JSON object".into());
    }
    let image = body.get("Image").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or("Image is required")?.to_string();
    let hc = body.get("HostConfig").cloned().unwrap_or(Value::Null);
    if !hc.is_object() && !hc.is_null() {
        return Err("HostConfig must be an object".into());
    }
    for (field, why) in REFUSED_HOST {
        if hc.get(field).is_some_and(|v| !is_default(v)) {
            return Err(format!("HostConfig.{field} is not supported on this target: {why}"));
        }
    }
    for (field, why) in REFUSED_CONFIG {
        if body.get(field).is_some_and(|v| !is_default(v)) {
            return Err(format!("Config.{field} is not supported on this target: {why}"));
        }
    }
    let health = crate::runtime::health::HealthSpec::parse(body.get("Healthcheck").unwrap_or(&Value::Null))?;
    let nano = number(&hc, "NanoCpus")?.filter(|&n| n > 0);
    let quota = number(&hc, "CpuQuota")?.filter(|&n| n > 0);
    let period = number(&hc, "CpuPeriod")?.filter(|&n| n > 0).unwrap_or(100_000);
    if nano.is_some() && quota.is_some() {
        return Err("conflicting options: NanoCpus and CpuQuota cannot both be set".into());
    }
    let cpus = nano.map(|n| n as f64 / 1e9).or(quota.map(|q| q as f64 / period as f64));
    let labels = match body.get("Labels") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| format!("label {k:?} must be a string")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("Labels must be an object of strings".into()),
    };
    let mut options = options(body, &hc)?;
    let mut binds = strings(&hc, "Binds")?.unwrap_or_default();
    mounts(&hc, &mut binds, &mut options.tmpfs)?;
    // Config.Volumes lists mount points; one not bound otherwise gets a volume of its own
    // (an anonymous one: a random name, removed with the container by `rm -v` or `--rm`).
    let mut anonymous_volumes = Vec::new();
    match body.get("Volumes") {
        None | Some(Value::Null) => {}
        Some(Value::Object(v)) => {
            for dst in v.keys() {
                if !dst.starts_with('/') || dst.contains(':') || dst.split('/').any(|p| p == "..") {
                    return Err(format!("Config.Volumes {dst:?}: a mount point is an absolute path without ':' or '..'"));
                }
                let bound = binds.iter().any(|b| b.split(':').nth(1) == Some(dst.as_str())) || options.tmpfs.contains_key(dst);
                if !bound {
                    let name = crate::runtime::random_id();
                    binds.push(format!("{name}:{dst}"));
                    anonymous_volumes.push(name);
                }
            }
        }
        Some(_) => return Err("Config.Volumes must be an object of mount points".into()),
    }
    let network_disabled = flag(body, "NetworkDisabled")?;
    let mut network = NetworkMode::parse(match hc.get("NetworkMode") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err("HostConfig.NetworkMode must be a string".into()),
    })?;
    if network_disabled {
        network = NetworkMode::None;
    }
    let mut endpoints = super::networks::endpoints(body.get("NetworkingConfig"))?;
    if let Some(name) = endpoints.iter().find(|(n, e)| PREDEFINED.contains(&n.as_str()) && !e.link_local_ips.is_empty()).map(|(n, _)| n) {
        return Err(format!(
            "NetworkingConfig.EndpointsConfig[{name:?}]: IPAMConfig.LinkLocalIPs is not supported on the predefined networks: the default network \
             gives a container loopback only, which has no interface to take the addresses; give them on a user-defined network's endpoint"
        ));
    }
    let mac = text(body, "MacAddress")?.map(|m| crate::runtime::networks::parse_mac(&m).map_err(|e| format!("Config.MacAddress: {e}"))).transpose()?;
    if network == NetworkMode::User {
        let name = hc.get("NetworkMode").and_then(Value::as_str).unwrap_or_default().to_string();
        let ep = endpoints.entry(name).or_default();
        // As moby from API 1.44: the deprecated Config.MacAddress is the endpoint's of the
        // network NetworkMode names.
        match (&ep.mac, mac) {
            (Some(a), Some(b)) if *a != b => {
                return Err(format!("conflicting options: Config.MacAddress {b} and the endpoint settings' MacAddress {a}"));
            }
            (_, Some(b)) => ep.mac = Some(b),
            (_, None) => {}
        }
    } else if mac.is_some() {
        return Err(format!(
            "Config.MacAddress is not supported with --network {}: the default network gives a container loopback only, which has no MAC \
             address to set; run it on a user-defined network, whose interface takes the address",
            network.name()
        ));
    }
    let config: Map<String, Value> = CONFIG_FIELDS.iter().filter_map(|k| body.get(*k).map(|v| (k.to_string(), v.clone()))).collect();
    Ok(CreateSpec {
        image,
        cmd: strings(body, "Cmd")?,
        entrypoint: strings(body, "Entrypoint")?,
        env: strings(body, "Env")?.unwrap_or_default(),
        working_dir: text(body, "WorkingDir")?,
        tty: flag(body, "Tty")?,
        open_stdin: flag(body, "OpenStdin")?,
        console_size: console_size(&hc)?,
        binds,
        cpus,
        memory: number(&hc, "Memory")?.filter(|&m| m > 0),
        auto_remove: flag(&hc, "AutoRemove")?,
        labels,
        network,
        endpoints,
        health,
        anonymous_volumes,
        volumes_from: strings(&hc, "VolumesFrom")?.unwrap_or_default(),
        links: crate::runtime::links::parse_links(&strings(&hc, "Links")?.unwrap_or_default())?,
        ports: port_bindings(body, &hc)?,
        exposed: exposed_ports(body)?,
        options,
        config: Value::Object(config),
        host_config: hc,
    })
}

/// `POST /containers/create?name=NAME`.
pub async fn create(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let spec = match t.platform().and_then(|_| create_spec(&body)) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    let image = spec.image.clone();
    match rt.create(t.get("name"), spec) {
        Ok(c) => json(StatusCode::CREATED, &json!({"Id": c.id, "Warnings": []})),
        // The CLI pulls on a 404 at create and tries again.
        Err(RuntimeError::NotFound(_)) => error(404, &format!("No such image: {image}")),
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}

/// The fields of moby's `HostConfig` (API 1.47), for tests that go through every one.
#[cfg(test)]
pub(crate) mod tests_support {
    /// Every field name.
    pub(crate) const HOST_CONFIG_FIELDS: &[&str] = &[
        "Annotations",
        "AutoRemove",
        "Binds",
        "BlkioDeviceReadBps",
        "BlkioDeviceReadIOps",
        "BlkioDeviceWriteBps",
        "BlkioDeviceWriteIOps",
        "BlkioWeight",
        "BlkioWeightDevice",
        "CapAdd",
        "CapDrop",
        "Cgroup",
        "CgroupParent",
        "CgroupnsMode",
        "ConsoleSize",
        "ContainerIDFile",
        "CpuCount",
        "CpuPercent",
        "CpuPeriod",
        "CpuQuota",
        "CpuRealtimePeriod",
        "CpuRealtimeRuntime",
        "CpuShares",
        "CpusetCpus",
        "CpusetMems",
        "DeviceCgroupRules",
        "DeviceRequests",
        "Devices",
        "Dns",
        "DnsOptions",
        "DnsSearch",
        "ExtraHosts",
        "GroupAdd",
        "IOMaximumBandwidth",
        "IOMaximumIOps",
        "Init",
        "IpcMode",
        "Isolation",
        "Links",
        "LogConfig",
        "MaskedPaths",
        "Memory",
        "MemoryReservation",
        "MemorySwap",
        "MemorySwappiness",
        "Mounts",
        "NanoCpus",
        "NetworkMode",
        "OomKillDisable",
        "OomScoreAdj",
        "PidMode",
        "PidsLimit",
        "PortBindings",
        "Privileged",
        "PublishAllPorts",
        "ReadonlyPaths",
        "ReadonlyRootfs",
        "RestartPolicy",
        "Runtime",
        "SecurityOpt",
        "ShmSize",
        "StorageOpt",
        "Sysctls",
        "Tmpfs",
        "UTSMode",
        "Ulimits",
        "UsernsMode",
        "VolumeDriver",
        "VolumesFrom",
    ];
}

#[cfg(test)]
mod tests {
    use super::super::host_config::HONOURED_HOST;
    use super::*;

    #[test]
    fn create_requests_are_type_checked() {
        let ok = create_spec(&json!({"Image": "busybox", "Cmd": ["sh", "-c", "exit 3"], "HostConfig": {"NanoCpus": 1500000000, "Memory": 1048576, "AutoRemove": true, "Binds": ["/d:/in:ro"]}})).unwrap();
        assert_eq!(ok.cmd.unwrap(), ["sh", "-c", "exit 3"]);
        assert_eq!(ok.cpus, Some(1.5));
        assert!(ok.auto_remove);
        assert!(create_spec(&json!({"Cmd": ["x"]})).unwrap_err().contains("Image"));
        assert!(create_spec(&json!({"Image": "b", "Cmd": 3})).unwrap_err().contains("Cmd"));
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"Memory": "lots"}})).unwrap_err().contains("Memory"));
        assert!(create_spec(&json!([1, 2])).is_err());
        let tty = create_spec(&json!({"Image": "b", "Tty": true, "OpenStdin": true, "HostConfig": {"ConsoleSize": [40, 120]}})).unwrap();
        assert!(tty.tty && tty.open_stdin);
        assert_eq!(tty.console_size, Some((40, 120)));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"ConsoleSize": [0, 0]}})).unwrap().console_size, None);
        let net = create_spec(&json!({"Image": "b", "ExposedPorts": {"80/tcp": {}}, "HostConfig": {"NetworkMode": "default", "PortBindings": {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18080"}]}}})).unwrap();
        assert_eq!((net.network, net.ports.len(), net.exposed.clone()), (NetworkMode::Default, 1, vec![crate::runtime::PortKey::tcp(80)]));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "host"}})).unwrap().network, NetworkMode::Host);
        let user = create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "mynet"}})).unwrap();
        assert_eq!((user.network, user.endpoints.keys().collect::<Vec<_>>()), (NetworkMode::User, vec![&"mynet".to_string()]));
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "container:x"}})).unwrap_err().contains("not supported"));
        let ll = |net: &str| json!({"Image": "b", "HostConfig": {"NetworkMode": net}, "NetworkingConfig": {"EndpointsConfig": {net: {"IPAMConfig": {"LinkLocalIPs": ["169.254.1.1"]}}}}});
        assert_eq!(create_spec(&ll("mynet")).unwrap().endpoints["mynet"].link_local_ips, [std::net::Ipv4Addr::new(169, 254, 1, 1)]);
        assert!(create_spec(&ll("bridge")).unwrap_err().contains("LinkLocalIPs"));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"PortBindings": {"53/udp": [{"HostPort": "53"}]}}})).unwrap().ports.len(), 1);
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"PortBindings": {"53/sctp": [{"HostPort": "53"}]}}}))
            .unwrap_err()
            .contains("TCP and UDP only"));
        assert!(create_spec(&json!({"Image": "b", "ExposedPorts": {"x/tcp": {}}})).unwrap_err().contains("invalid port"));
        for bad in [json!([1]), json!([1, -1]), json!([70000, 1]), json!("40x120"), json!([1.5, 2])] {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {"ConsoleSize": bad}})).unwrap_err();
            assert!(e.contains("ConsoleSize"), "{e}");
        }
    }

    #[test]
    fn defaults_pass_and_every_refused_option_is_named() {
        // What the docker CLI and the SDK send for options left alone.
        let defaults = json!({"Image": "b", "HostConfig": {"CpuShares": 0, "Dns": [], "Privileged": false, "LogConfig": {"Type": "", "Config": {}},
            "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "CgroupnsMode": "", "IpcMode": "", "MemorySwappiness": -1, "Isolation": "",
            "Mounts": null, "Init": null, "OomKillDisable": false, "PidsLimit": 0}});
        create_spec(&defaults).unwrap();
        for (field, _) in REFUSED_HOST {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {*field: [1]}})).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        for (field, v) in [
            ("PidMode", json!("host")),
            ("CapAdd", json!(["SYS_ADMIN"])),
            ("SecurityOpt", json!(["seccomp=unconfined"])),
            ("LogConfig", json!({"Type": "syslog"})),
        ] {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {field: v}})).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn every_host_config_field_is_honoured_or_refused_by_name() {
        // ContainerIDFile is the client's own (the CLI writes the file): the server only keeps it.
        for f in tests_support::HOST_CONFIG_FIELDS.iter().filter(|f| **f != "ContainerIDFile") {
            let handled = REFUSED_HOST.iter().any(|(r, _)| r == f) || HONOURED_HOST.contains(f);
            assert!(handled, "HostConfig.{f} is neither honoured nor refused");
        }
    }

    #[test]
    fn honoured_options_are_parsed() {
        let s = create_spec(&json!({"Image": "b", "User": "nobody", "Hostname": "box", "StopSignal": "SIGINT", "StopTimeout": 3,
            "HostConfig": {"CpuShares": 512, "CpusetCpus": "0", "Memory": 8388608, "MemorySwap": 16777216, "Tmpfs": {"/t": "size=1m"},
                           "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 2}, "GroupAdd": ["wheel"], "CapDrop": ["NET_RAW"],
                           "Ulimits": [{"Name": "nofile", "Soft": 100, "Hard": 200}],
                           "Mounts": [{"Type": "volume", "Source": "vol", "Target": "/v"}, {"Type": "tmpfs", "Target": "/m", "TmpfsOptions": {"SizeBytes": 1024}}]}}))
        .unwrap();
        let o = &s.options;
        assert_eq!(
            (o.user.as_deref(), o.hostname.as_deref(), o.stop_signal.as_deref(), o.stop_timeout),
            (Some("nobody"), Some("box"), Some("SIGINT"), Some(3))
        );
        assert_eq!((o.cpu_shares, o.memory_swap, o.restart.max_retries), (Some(512), Some(16777216), 2));
        assert_eq!(o.cap_drop, ["CAP_NET_RAW"]);
        assert_eq!(s.binds, ["vol:/v"]);
        let anon = create_spec(&json!({"Image": "b", "Volumes": {"/anon": {}}, "Healthcheck": {"Test": ["CMD", "true"]}})).unwrap();
        assert_eq!((anon.binds.len(), anon.anonymous_volumes.len(), anon.health.is_some()), (1, 1, true));
        assert_eq!(anon.binds[0], format!("{}:/anon", anon.anonymous_volumes[0]));
        assert_eq!(o.tmpfs.get("/m").map(String::as_str), Some("size=1024"));
        assert_eq!(s.host_config["CpuShares"], 512);
        let devices = create_spec(&json!({"Image": "b", "HostConfig": {"DeviceCgroupRules": ["c 42:* rm"]}})).unwrap();
        assert_eq!(devices.options.device_rules[0].to_oci(), json!({"allow": true, "type": "c", "major": 42, "access": "rm"}));
        assert_eq!(devices.host_config["DeviceCgroupRules"], json!(["c 42:* rm"]));
        for bad in [
            json!({"HostConfig": {"MemorySwap": 1, "Memory": 2}}),
            json!({"HostConfig": {"RestartPolicy": {"Name": "always"}, "AutoRemove": true}}),
            json!({"HostConfig": {"RestartPolicy": {"Name": "sometimes"}}}),
            json!({"HostConfig": {"Tmpfs": {"rel": ""}}}),
            json!({"HostConfig": {"CpusetCpus": "a-b"}}),
            json!({"HostConfig": {"Ulimits": [{"Name": "nofile", "Soft": 3, "Hard": 2}]}}),
            json!({"Volumes": {"rel": {}}}),
            json!({"Volumes": ["/anon"]}),
            json!({"Healthcheck": {"Test": ["BOGUS", "true"]}}),
            json!({"HostConfig": {"DeviceCgroupRules": ["c 1:3 rwx"]}}),
            json!({"HostConfig": {"DeviceCgroupRules": ["b 7:* rwm"]}}),
            json!({"HostConfig": {"DeviceCgroupRules": "c 1:3"}}),
        ] {
            let mut b = bad.clone();
            b["Image"] = json!("b");
            assert!(create_spec(&b).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_create_bodies_never_panic(s in ".{0,200}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = create_spec(&v);
            }
        }

        #[test]
        fn random_host_configs_never_panic(k in "[A-Za-z]{1,20}", v in "[-0-9a-z\\[\\]{}\":,]{0,40}") {
            if let Ok(v) = serde_json::from_str::<Value>(&v) {
                let _ = create_spec(&json!({"Image": "b", "HostConfig": {k: v}}));
            }
        }
    }
}
