// SPDX-License-Identifier: Apache-2.0
//! `/_ping`, `/version`, `/info`, `/events`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use super::body::{json, ApiBody};
use super::{API_VERSION, MIN_API_VERSION};
use crate::runtime::{RunState, Runtime};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `/_ping`: the CLI reads `API-Version` here and negotiates down to it.
pub fn ping(m: &Method) -> Response<ApiBody> {
    let body = if m == Method::HEAD { Bytes::new() } else { Bytes::from_static(b"OK") };
    Response::builder()
        .status(StatusCode::OK)
        .header("API-Version", API_VERSION)
        .header("OSType", "linux")
        .header("Docker-Experimental", "false")
        .header("Builder-Version", "1")
        .header("Cache-Control", "no-cache, no-store, must-revalidate")
        .header("Content-Type", "text/plain; charset=utf-8")
        .body(Full::new(body).boxed())
        .expect("static response parts")
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// `/version`.
pub fn version() -> Response<ApiBody> {
    let details = json!({"ApiVersion": API_VERSION, "MinAPIVersion": MIN_API_VERSION, "Os": "linux", "Arch": "amd64", "KernelVersion": kernel()});
    json(
        StatusCode::OK,
        &json!({
            "Platform": {"Name": "insitu target (in-storage containers)"},
            "Components": [{"Name": "Engine", "Version": VERSION, "Details": details}],
            "Version": VERSION, "ApiVersion": API_VERSION, "MinAPIVersion": MIN_API_VERSION,
            "GitCommit": "", "GoVersion": "", "Os": "linux", "Arch": std::env::consts::ARCH.replace("x86_64", "amd64"),
            "KernelVersion": kernel(), "BuildTime": "",
        }),
    )
}

/// `/info`.
pub fn info(rt: &Runtime) -> Response<ApiBody> {
    let all = rt.list();
    let running = all.iter().filter(|c| matches!(c.state(), RunState::Running { .. })).count();
    let images = rt.images().list().map(|l| l.len()).unwrap_or(0);
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(0)
        * 1024;
    json(
        StatusCode::OK,
        &json!({
            "ID": "insitu", "Name": "insitu-target", "ServerVersion": VERSION,
            "Containers": all.len(), "ContainersRunning": running, "ContainersPaused": 0, "ContainersStopped": all.len() - running,
            "Images": images, "Driver": "overlay", "DriverStatus": [["Backing Filesystem", "the target's private namespace"]],
            "Plugins": {"Volume": ["local"], "Network": ["none"], "Log": ["insitu"]},
            "MemoryLimit": true, "SwapLimit": true, "CpuCfsPeriod": true, "CpuCfsQuota": true, "PidsLimit": true,
            "OomKillDisable": false, "IPv4Forwarding": false, "Debug": false, "NFd": 0, "NGoroutines": 0,
            "LoggingDriver": "insitu", "CgroupDriver": "cgroupfs", "CgroupVersion": if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() { "2" } else { "1" },
            "KernelVersion": kernel(), "OperatingSystem": "insitu target", "OSType": "linux", "OSVersion": "",
            "Architecture": std::env::consts::ARCH, "NCPU": ncpu, "MemTotal": mem, "DockerRootDir": "(private namespace)",
            "IndexServerAddress": "https://index.docker.io/v1/",
            "RegistryConfig": {"InsecureRegistryCIDRs": ["127.0.0.0/8", "::1/128"], "IndexConfigs": {}, "Mirrors": []},
            "Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc",
            "Swarm": {"LocalNodeState": "inactive", "NodeID": "", "NodeAddr": "", "ControlAvailable": false, "Error": "", "RemoteManagers": null},
            "SecurityOptions": ["name=seccomp,profile=insitu-default", "name=no-new-privileges"],
            "Labels": [], "ExperimentalBuild": false, "Warnings": [],
        }),
    )
}

/// `/events`: no events are published; the stream stays open and empty.
pub fn events() -> Response<ApiBody> {
    let (r, tx) = super::body::stream(StatusCode::OK, "application/json");
    tokio::spawn(async move {
        tx.closed().await;
    });
    r
}
