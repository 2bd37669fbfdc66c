// SPDX-License-Identifier: Apache-2.0
//! `/volumes`: named volumes of the private namespace (see
//! [`crate::runtime::volumes`]): list (filters `name`, `label`, `dangling`, `driver`),
//! create, inspect, remove, prune. The `local` driver only; driver options are refused.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::body::{empty, error, json, ApiBody};
use super::filters::Filters;
use super::images::rfc3339;
use super::{read_json, Target};
use crate::runtime::volumes::Volume;
use crate::runtime::{Runtime, RuntimeError};

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

fn doc(v: &Volume) -> Value {
    json!({
        "Name": v.name, "Driver": "local", "Mountpoint": v.mountpoint, "CreatedAt": rfc3339(v.created as i64),
        "Labels": v.labels, "Scope": "local", "Options": {}, "Status": null, "UsageData": null,
    })
}

/// Whether `v` passes `f`.
fn passes(rt: &Runtime, v: &Volume, f: &Filters) -> Result<bool, String> {
    let dangling = f.bool("dangling")?;
    let names = f.values("name");
    let drivers = f.values("driver");
    Ok((names.is_empty() || names.iter().any(|n| v.name.contains(n)))
        && (drivers.is_empty() || drivers.contains(&"local"))
        && f.labels_match("label", &v.labels)
        && dangling.is_none_or(|d| d == rt.volume_users(&v.name).is_empty()))
}

/// `GET /volumes?filters=...`.
pub fn list(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")).and_then(|f| f.only(&["name", "label", "label!", "dangling", "driver"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let mut out = Vec::new();
    for v in rt.volume_list() {
        match passes(rt, &v, &f) {
            Ok(true) => out.push(doc(&v)),
            Ok(false) => {}
            Err(m) => return error(400, &m),
        }
    }
    json(StatusCode::OK, &json!({"Volumes": out, "Warnings": []}))
}

/// `POST /volumes/create`.
pub async fn create(rt: &Runtime, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !body.is_object() {
        return error(400, "the volume request must be a JSON object");
    }
    let name = match body.get("Name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return error(400, "Name must be a string"),
    };
    match body.get("Driver").and_then(Value::as_str) {
        None | Some("") | Some("local") => {}
        Some(d) => return error(400, &format!("volume driver {d:?} is not supported on this target: only \"local\"")),
    }
    if body.get("DriverOpts").and_then(Value::as_object).is_some_and(|o| !o.is_empty()) {
        return error(400, "DriverOpts are not supported on this target: a volume is a directory of the private namespace");
    }
    if body.get("ClusterVolumeSpec").is_some_and(|v| !v.is_null()) {
        return error(400, "ClusterVolumeSpec is not supported on this target: a drive is not a cluster member");
    }
    let labels = match body.get("Labels") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(m)) => match m.iter().map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect::<Option<_>>() {
            Some(l) => l,
            None => return error(400, "Labels must be an object of strings"),
        },
        Some(_) => return error(400, "Labels must be an object of strings"),
    };
    match rt.volume_create(name, labels) {
        Ok(v) => json(StatusCode::CREATED, &doc(&v)),
        Err(e) => fail(e),
    }
}

/// `GET /volumes/{name}`.
pub fn inspect(rt: &Runtime, name: &str) -> Response<ApiBody> {
    match rt.volume_get(name) {
        Ok(v) => json(StatusCode::OK, &doc(&v)),
        Err(e) => fail(e),
    }
}

/// `DELETE /volumes/{name}?force=1`.
pub fn remove(rt: &Runtime, name: &str, t: &Target) -> Response<ApiBody> {
    match rt.volume_remove(name, t.flag("force")) {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `POST /volumes/prune?filters=...`: removes volumes no container binds. As Docker's
/// API 1.42 and later, only anonymous volumes (those labelled
/// [`ANONYMOUS_LABEL`](crate::runtime::volumes::ANONYMOUS_LABEL): made without a name)
/// go unless `all=true`; before 1.42, every unused one.
pub fn prune(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")).and_then(|f| f.only(&["label", "label!", "all"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let all = match f.bool("all") {
        Ok(a) => a.unwrap_or(false) || !t.at_least(1, 42),
        Err(m) => return error(400, &m),
    };
    let mut gone = Vec::new();
    let mut space = 0u64;
    for v in rt.volume_list() {
        let chosen = all || v.labels.contains_key(crate::runtime::volumes::ANONYMOUS_LABEL);
        if chosen && f.labels_match("label", &v.labels) && rt.volume_users(&v.name).is_empty() {
            if let Ok(n) = rt.volume_remove(&v.name, false) {
                gone.push(v.name.clone());
                space += n;
            }
        }
    }
    json(StatusCode::OK, &json!({"VolumesDeleted": gone, "SpaceReclaimed": space}))
}
