// SPDX-License-Identifier: Apache-2.0
//! `/_ping`, `/version`, `/info`, `/events`, `/system/df`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use super::body::{json, ApiBody};
use super::filters::Filters;
use super::Target;
use super::{API_VERSION, MIN_API_VERSION};
use crate::runtime::events::Event;
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
    let paused = all.iter().filter(|c| c.paused()).count();
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
            "Containers": all.len(), "ContainersRunning": running - paused, "ContainersPaused": paused, "ContainersStopped": all.len() - running,
            "Images": images, "Driver": "overlay", "DriverStatus": [["Backing Filesystem", "the target's private namespace"]],
            "Plugins": {"Volume": ["local"], "Network": ["none"], "Log": ["json-file", "local"]},
            "MemoryLimit": true, "SwapLimit": true, "CpuCfsPeriod": true, "CpuCfsQuota": true, "PidsLimit": true,
            "OomKillDisable": true, "IPv4Forwarding": false, "Debug": false, "NFd": 0, "NGoroutines": 0,
            "LoggingDriver": "json-file", "CgroupDriver": "cgroupfs", "CgroupVersion": if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() { "2" } else { "1" },
            "KernelVersion": kernel(), "OperatingSystem": "insitu target", "OSType": "linux", "OSVersion": "",
            "Architecture": std::env::consts::ARCH, "NCPU": ncpu, "MemTotal": mem, "DockerRootDir": "(private namespace)",
            "IndexServerAddress": "https://index.docker.io/v1/",
            "RegistryConfig": rt.images().registries().to_json(),
            "Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc",
            "Swarm": {"LocalNodeState": "inactive", "NodeID": "", "NodeAddr": "", "ControlAvailable": false, "Error": "", "RemoteManagers": null},
            "SecurityOptions": ["name=seccomp,profile=insitu-default", "name=no-new-privileges"],
            "Labels": [], "ExperimentalBuild": false, "Warnings": [],
        }),
    )
}

/// An event as the API sends it (the current fields and the legacy `status`/`id`/`from`).
fn event_json(e: &Event) -> serde_json::Value {
    let d = e.time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut v = json!({
        "Type": e.kind, "Action": e.action, "Actor": {"ID": e.id, "Attributes": e.attributes}, "scope": "local",
        "time": d.as_secs(), "timeNano": d.as_nanos() as u64,
    });
    if e.kind == "container" {
        v["status"] = json!(e.action);
        v["id"] = json!(e.id);
        v["from"] = json!(e.attributes.get("image"));
    }
    v
}

/// Whether `e` passes the filters of `/events` (`type`, `event`/`action`, `container`,
/// `image`, `volume`, `label`).
fn event_passes(e: &Event, f: &Filters) -> bool {
    let any = |k: &str, ok: &dyn Fn(&str) -> bool| {
        let v = f.values(k);
        v.is_empty() || v.iter().any(|x| ok(x))
    };
    let name = e.attributes.get("name").map(String::as_str).unwrap_or("");
    let action = e.action.split(':').next().unwrap_or("");
    any("type", &|x| x == e.kind)
        && any("event", &|x| x == action || x == e.action)
        && any("action", &|x| x == action || x == e.action)
        && any("container", &|x| e.kind == "container" && (e.id.starts_with(x) || name == x))
        && any("image", &|x| (e.kind == "image" && (e.id == x || name == x)) || e.attributes.get("image").is_some_and(|i| i == x))
        && any("volume", &|x| e.kind == "volume" && e.id == x)
        && f.labels_match("label", &e.attributes)
}

/// `/events?since=T&until=T&filters=...`: the events since `since` (from the history),
/// then those that come, until `until` (at once when it has passed) or the client leaves.
pub fn events(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")).and_then(|f| f.only(&["type", "event", "action", "container", "image", "volume", "label"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return super::body::error(400, &m),
    };
    let time = |k: &str| t.get(k).map(crate::runtime::log::parse_time).transpose().map_err(|m| format!("{k}: {m}"));
    let (since, until) = match (time("since"), time("until")) {
        (Ok(s), Ok(u)) => (s, u),
        (Err(m), _) | (_, Err(m)) => return super::body::error(400, &m),
    };
    let (past, mut rx) = rt.events().follow();
    let (r, tx) = super::body::stream(StatusCode::OK, "application/json");
    tokio::spawn(async move {
        let in_range = |e: &Event| since.is_none_or(|s| e.time >= s) && until.is_none_or(|u| e.time <= u);
        if since.is_some() {
            for e in past.iter().filter(|e| in_range(e) && event_passes(e, &f)) {
                if tx.send(Bytes::from(event_json(e).to_string() + "\n")).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let left = until.map(|u| u.duration_since(std::time::SystemTime::now()).unwrap_or_default());
            let next = async {
                loop {
                    match rx.recv().await {
                        Ok(e) => return Some(e),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(_) => return None,
                    }
                }
            };
            let got = match left {
                Some(d) => match tokio::time::timeout(d, next).await {
                    Ok(g) => g,
                    Err(_) => return,
                },
                None => tokio::select! {
                    g = next => g,
                    _ = tx.closed() => return,
                },
            };
            let Some(e) = got else { return };
            if in_range(&e) && event_passes(&e, &f) && tx.send(Bytes::from(event_json(&e).to_string() + "\n")).await.is_err() {
                return;
            }
        }
    });
    r
}

/// `/system/df`: what images, containers and volumes take in the private namespace.
pub fn df(rt: &Runtime) -> Response<ApiBody> {
    let containers = rt.list();
    let images = rt.images().list().unwrap_or_default();
    let size_rw = |c: &crate::runtime::Container| crate::image::layer_size(&c.upper_dir());
    let image_rows: Vec<_> = images
        .iter()
        .map(|i| {
            let users = containers.iter().filter(|c| c.image_id == i.id).count();
            json!({"Id": i.id, "ParentId": "", "RepoTags": i.repo_tags, "RepoDigests": i.repo_digests, "Created": i.created,
                   "Size": i.size, "SharedSize": 0, "VirtualSize": i.size, "Labels": i.config.labels, "Containers": users})
        })
        .collect();
    let container_rows: Vec<_> = containers
        .iter()
        .map(|c| {
            let (state, status) = super::containers::status(rt, c);
            json!({"Id": c.id, "Names": [format!("/{}", c.name())], "Image": c.spec.image, "ImageID": c.image_id,
                   "Command": c.args.join(" "), "Created": super::containers::secs(c.created), "State": state, "Status": status,
                   "SizeRw": size_rw(c), "SizeRootFs": size_rw(c) + images.iter().find(|i| i.id == c.image_id).map_or(0, |i| i.size),
                   "Labels": c.spec.labels, "Mounts": super::containers::mounts(rt, c)})
        })
        .collect();
    let volume_rows: Vec<_> = rt
        .volume_list()
        .iter()
        .map(|v| {
            json!({"Name": v.name, "Driver": "local", "Mountpoint": v.mountpoint, "CreatedAt": super::images::rfc3339(v.created as i64),
                   "Labels": v.labels, "Scope": "local", "Options": {},
                   "UsageData": {"Size": crate::image::layer_size(&v.mountpoint), "RefCount": rt.volume_users(&v.name).len()}})
        })
        .collect();
    let layers: u64 = images.iter().map(|i| i.size).sum();
    json(StatusCode::OK, &json!({"LayersSize": layers, "Images": image_rows, "Containers": container_rows, "Volumes": volume_rows, "BuildCache": []}))
}
