// SPDX-License-Identifier: Apache-2.0
//! `/networks`: the networks a container can be on, as Docker's predefined ones: `bridge`
//! (the default: a namespace of the container's own with loopback only, reachable through
//! published ports), `host` (the target's) and `none`. User-defined networks are refused:
//! containers on a drive do not reach one another by name.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::body::{error, json, ApiBody};
use super::filters::Filters;
use super::Target;
use crate::runtime::Runtime;

/// The predefined networks: (name, driver, the `NetworkMode` of containers on it).
const NETWORKS: &[(&str, &str, &str)] = &[("bridge", "bridge", "default"), ("host", "host", "host"), ("none", "null", "none")];

/// A network's id: fixed, 64 hex digits derived from its name.
fn id_of(name: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("insitu-network-{name}").as_bytes()))
}

fn doc(rt: &Runtime, name: &str, driver: &str, mode: &str) -> Value {
    let containers: serde_json::Map<String, Value> = rt
        .list()
        .iter()
        .filter(|c| c.spec.network.name() == mode && matches!(c.state(), crate::runtime::RunState::Running { .. }))
        .map(|c| (c.id.clone(), json!({"Name": c.name(), "EndpointID": "", "MacAddress": "", "IPv4Address": "", "IPv6Address": ""})))
        .collect();
    json!({
        "Name": name, "Id": id_of(name), "Created": "0001-01-01T00:00:00Z", "Scope": "local", "Driver": driver,
        "EnableIPv4": name == "bridge", "EnableIPv6": false, "IPAM": {"Driver": "default", "Options": null, "Config": []},
        "Internal": false, "Attachable": false, "Ingress": false, "ConfigFrom": {"Network": ""}, "ConfigOnly": false,
        "Containers": containers, "Options": {}, "Labels": {},
    })
}

fn find(key: &str) -> Option<&'static (&'static str, &'static str, &'static str)> {
    NETWORKS.iter().find(|(n, _, _)| *n == key || (key.len() >= 4 && id_of(n).starts_with(key)))
}

/// `GET /networks?filters=...` (`name`, `id`, `driver`, `type`).
pub fn list(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")).and_then(|f| f.only(&["name", "id", "driver", "type", "scope"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let any = |k: &str, ok: &dyn Fn(&str) -> bool| {
        let v = f.values(k);
        v.is_empty() || v.iter().any(|x| ok(x))
    };
    let out: Vec<Value> = NETWORKS
        .iter()
        .filter(|(n, d, _)| {
            any("name", &|x| n.contains(x))
                && any("id", &|x| id_of(n).starts_with(x))
                && any("driver", &|x| x == *d)
                && any("type", &|x| x == "builtin")
                && any("scope", &|x| x == "local")
        })
        .map(|(n, d, m)| doc(rt, n, d, m))
        .collect();
    json(StatusCode::OK, &Value::Array(out))
}

/// `GET /networks/{id}`.
pub fn inspect(rt: &Runtime, key: &str) -> Response<ApiBody> {
    match find(key) {
        Some((n, d, m)) => json(StatusCode::OK, &doc(rt, n, d, m)),
        None => error(404, &format!("network {key} not found")),
    }
}

/// `POST /networks/create`, `connect`, `disconnect`, `DELETE`, `prune`: refused.
pub fn refused(what: &str) -> Response<ApiBody> {
    error(
        400,
        &format!("{what} is not supported on this target: containers on a drive have loopback only (or the target's network with host), and do not reach one another by name"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(super::id_of("bridge"), super::id_of("bridge"));
        assert_ne!(super::id_of("bridge"), super::id_of("host"));
        assert!(super::find("bridge").is_some() && super::find(&super::id_of("none")[..12]).is_some() && super::find("mynet").is_none());
    }
}
