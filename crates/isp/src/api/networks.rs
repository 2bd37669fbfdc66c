// SPDX-License-Identifier: Apache-2.0
//! `/networks`: Docker's predefined networks — `bridge` (the default: a namespace of the
//! container's own with loopback only, reachable through published ports), `host` (the
//! target's) and `none` — and user-defined bridge networks (see
//! [`crate::runtime::networks`]): create, inspect, list with filters, connect,
//! disconnect, remove, prune. Containers on a user-defined network find one another by
//! name and aliases; no network reaches outside the target.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::body::{error, json, ApiBody};
use super::filters::Filters;
use super::images::rfc3339;
use super::{read_json, Target};
use crate::runtime::networks::{parse_cidr, parse_mac, EndpointConfig, Network, NetworkRequest, PREDEFINED};
use crate::runtime::{NetworkMode, Runtime, RuntimeError};

/// The predefined networks: (name, driver, the `NetworkMode` of containers on it).
const NETWORKS: &[(&str, &str, NetworkMode)] =
    &[("bridge", "bridge", NetworkMode::Default), ("host", "host", NetworkMode::Host), ("none", "null", NetworkMode::None)];

/// A predefined network's id: fixed, 64 hex digits derived from its name.
fn id_of(name: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("insitu-network-{name}").as_bytes()))
}

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

fn predefined_doc(rt: &Runtime, name: &str, driver: &str, mode: NetworkMode) -> Value {
    let containers: Map<String, Value> = rt
        .list()
        .iter()
        .filter(|c| c.spec.network == mode && matches!(c.state(), crate::runtime::RunState::Running { .. }))
        .map(|c| (c.id.clone(), json!({"Name": c.name(), "EndpointID": "", "MacAddress": "", "IPv4Address": "", "IPv6Address": ""})))
        .collect();
    json!({
        "Name": name, "Id": id_of(name), "Created": "0001-01-01T00:00:00Z", "Scope": "local", "Driver": driver,
        "EnableIPv4": name == "bridge", "EnableIPv6": false, "IPAM": {"Driver": "default", "Options": null, "Config": []},
        "Internal": false, "Attachable": false, "Ingress": false, "ConfigFrom": {"Network": ""}, "ConfigOnly": false,
        "Containers": containers, "Options": {}, "Labels": {},
    })
}

/// An endpoint's id: stable for a container on a network.
pub(crate) fn endpoint_id(cid: &str, nid: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("insitu-endpoint-{cid}-{nid}").as_bytes()))
}

fn ipam_config(n: &Network) -> Value {
    let mut c = json!({"Subnet": format!("{}/{}", n.subnet.0, n.subnet.1), "Gateway": n.gateway.to_string()});
    if let Some((a, l)) = n.ip_range {
        c["IPRange"] = json!(format!("{a}/{l}"));
    }
    if !n.aux.is_empty() {
        c["AuxiliaryAddresses"] = json!(n.aux.iter().map(|(k, a)| (k.clone(), a.to_string())).collect::<BTreeMap<_, _>>());
    }
    c
}

fn user_doc(rt: &Runtime, n: &Network) -> Value {
    let containers: Map<String, Value> = n
        .members
        .keys()
        .filter_map(|cid| {
            let a = rt.networks().attachment(cid, &n.id)?;
            let name = rt.get(cid).ok()?.name();
            Some((
                cid.clone(),
                json!({"Name": name, "EndpointID": endpoint_id(cid, &n.id), "MacAddress": a.mac,
                       "IPv4Address": format!("{}/{}", a.ip, n.subnet.1), "IPv6Address": ""}),
            ))
        })
        .collect();
    json!({
        "Name": n.name, "Id": n.id, "Created": rfc3339(n.created as i64), "Scope": "local", "Driver": "bridge",
        "EnableIPv4": true, "EnableIPv6": false, "IPAM": {"Driver": "default", "Options": null, "Config": [ipam_config(n)]},
        "Internal": n.internal, "Attachable": n.attachable, "Ingress": false, "ConfigFrom": {"Network": ""}, "ConfigOnly": false,
        "Containers": containers, "Options": {}, "Labels": n.labels,
    })
}

/// An endpoint's `IPAMConfig` as given (moby leaves out the fields not given), or null.
fn ipam_settings(e: &EndpointConfig) -> Option<Value> {
    let mut m = Map::new();
    if let Some(a) = e.ipv4 {
        m.insert("IPv4Address".into(), json!(a.to_string()));
    }
    if !e.link_local_ips.is_empty() {
        m.insert("LinkLocalIPs".into(), json!(e.link_local_ips.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>()));
    }
    (!m.is_empty()).then_some(Value::Object(m))
}

/// The settings of container `cid` on each network it is on, for inspect's
/// `NetworkSettings.Networks`.
pub(crate) fn container_networks(rt: &Runtime, c: &crate::runtime::Container) -> Value {
    let mut out = Map::new();
    let settings = |cfg: Option<&EndpointConfig>| {
        json!({"IPAMConfig": cfg.and_then(ipam_settings), "Links": cfg.map(|e| e.links.clone()).filter(|l| !l.is_empty()),
               "Aliases": cfg.map(|e| e.aliases.clone()).filter(|a| !a.is_empty()), "MacAddress": "", "DriverOpts": cfg.map(|e| &e.driver_opts).filter(|o| !o.is_empty()),
               "NetworkID": "", "EndpointID": "", "Gateway": "", "IPAddress": "", "IPPrefixLen": 0, "IPv6Gateway": "",
               "GlobalIPv6Address": "", "GlobalIPv6PrefixLen": 0, "DNSNames": null})
    };
    if c.spec.network == NetworkMode::Default {
        let mut s = settings(c.spec.endpoints.get("bridge"));
        s["NetworkID"] = json!(id_of("bridge"));
        out.insert("bridge".into(), s);
    }
    for (n, cfg) in rt.networks().of_container(&c.id) {
        let mut s = settings(Some(&cfg));
        s["NetworkID"] = json!(n.id);
        let mut dns = vec![c.name()];
        dns.extend(cfg.aliases.iter().cloned());
        dns.push(c.id[..12].to_string());
        s["DNSNames"] = json!(dns);
        if let Some(m) = &cfg.mac {
            s["MacAddress"] = json!(m);
        }
        if let Some(a) = rt.networks().attachment(&c.id, &n.id) {
            s["EndpointID"] = json!(endpoint_id(&c.id, &n.id));
            s["Gateway"] = json!(n.gateway.to_string());
            s["IPAddress"] = json!(a.ip.to_string());
            s["IPPrefixLen"] = json!(n.subnet.1);
            s["MacAddress"] = json!(a.mac);
        }
        out.insert(n.name.clone(), s);
    }
    Value::Object(out)
}

/// The name `HostConfig.NetworkMode` shows for a container.
pub(crate) fn mode_name(c: &crate::runtime::Container) -> String {
    match c.spec.network {
        NetworkMode::User => c.spec.host_config.get("NetworkMode").and_then(Value::as_str).unwrap_or("user").to_string(),
        m => m.name().to_string(),
    }
}

/// `GET /networks?filters=...` (`name`, `id`, `driver`, `type`, `scope`, `label`,
/// `dangling`).
pub fn list(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters"))
        .and_then(|f| f.only(&["name", "id", "driver", "type", "scope", "label", "label!", "dangling"]).map(|_| f))
        .and_then(|f| f.bool("dangling").map(|d| (f, d)))
    {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let (f, dangling) = f;
    for t in f.values("type") {
        if t != "builtin" && t != "custom" {
            return error(400, &format!("invalid filter: 'type'='{t}' (builtin or custom)"));
        }
    }
    let any = |k: &str, ok: &dyn Fn(&str) -> bool| {
        let v = f.values(k);
        v.is_empty() || v.iter().any(|x| ok(x))
    };
    let keep = |name: &str, id: &str, driver: &str, kind: &str, labels: &BTreeMap<String, String>, used: bool| {
        any("name", &|x| name.contains(x))
            && any("id", &|x| id.starts_with(x))
            && any("driver", &|x| x == driver)
            && any("type", &|x| x == kind)
            && any("scope", &|x| x == "local")
            && f.labels_match("label", labels)
            && dangling.is_none_or(|d| d != used)
    };
    let none = BTreeMap::new();
    let mut out: Vec<Value> =
        NETWORKS.iter().filter(|(n, d, _)| keep(n, &id_of(n), d, "builtin", &none, true)).map(|(n, d, m)| predefined_doc(rt, n, d, *m)).collect();
    out.extend(rt.networks().list().iter().filter(|n| keep(&n.name, &n.id, "bridge", "custom", &n.labels, !n.members.is_empty())).map(|n| user_doc(rt, n)));
    json(StatusCode::OK, &Value::Array(out))
}

/// `GET /networks/{id}`.
pub fn inspect(rt: &Runtime, key: &str) -> Response<ApiBody> {
    if let Some((n, d, m)) = NETWORKS.iter().find(|(n, _, _)| *n == key || (key.len() >= 4 && id_of(n).starts_with(key))) {
        return json(StatusCode::OK, &predefined_doc(rt, n, d, *m));
    }
    match rt.networks().find(key) {
        Some(n) => json(StatusCode::OK, &user_doc(rt, &n)),
        None => error(404, &format!("network {key} not found")),
    }
}

fn flag(body: &Value, k: &str) -> Result<bool, String> {
    match body.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{k} must be a boolean")),
    }
}

fn string_map(v: Option<&Value>, what: &str) -> Result<BTreeMap<String, String>, String> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => {
            m.iter().map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| format!("{what}[{k:?}] must be a string"))).collect()
        }
        Some(_) => Err(format!("{what} must be an object of strings")),
    }
}

fn text<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("{k} must be a string")),
    }
}

fn ipv4(s: &str, what: &str) -> Result<Ipv4Addr, String> {
    s.parse().map_err(|_| format!("invalid {what} {s:?}: an IPv4 address (IPv6 is not offered on this target)"))
}

/// Parses the body of `POST /networks/create`; what cannot be honoured is named.
pub(crate) fn network_request(body: &Value) -> Result<NetworkRequest, String> {
    if !body.is_object() {
        return Err("the network create request must be a JSON object".into());
    }
    let name = text(body, "Name")?;
    if name.is_empty() {
        return Err("Name is required".into());
    }
    if name.len() > 128 || name.chars().any(|c| c.is_control() || c == '/' || c == ':') {
        return Err(format!("invalid network name {name:?}: at most 128 characters, without '/', ':' or control characters"));
    }
    match text(body, "Driver")? {
        "" | "bridge" => {}
        d => return Err(format!("network driver {d:?} is not supported on this target: only bridge networks between its containers are offered")),
    }
    match text(body, "Scope")? {
        "" | "local" => {}
        s => return Err(format!("network scope {s:?} is not supported on this target: a drive's networks are local")),
    }
    for (k, why) in [
        ("Ingress", "a drive is not a swarm member"),
        ("EnableIPv6", "containers get IPv4 addresses only"),
        ("ConfigOnly", "configuration-only networks are not offered"),
    ] {
        if flag(body, k)? {
            return Err(format!("{k} is not supported on this target: {why}"));
        }
    }
    if body.get("EnableIPv4").is_some_and(|v| v == &Value::Bool(false)) {
        return Err("EnableIPv4=false is not supported on this target: containers get IPv4 addresses only".into());
    }
    if body.get("ConfigFrom").and_then(|c| c.get("Network")).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
        return Err("ConfigFrom is not supported on this target: configuration-only networks are not offered".into());
    }
    if let Some((k, _)) = string_map(body.get("Options"), "Options")?.into_iter().next() {
        return Err(format!("network option {k:?} is not supported on this target: its bridges are made and named by the target"));
    }
    let mut req = NetworkRequest {
        name: name.into(),
        labels: string_map(body.get("Labels"), "Labels")?,
        internal: flag(body, "Internal")?,
        attachable: flag(body, "Attachable")?,
        ..Default::default()
    };
    let ipam = body.get("IPAM").cloned().unwrap_or(Value::Null);
    if !ipam.is_null() {
        match text(&ipam, "Driver")? {
            "" | "default" => {}
            d => return Err(format!("IPAM driver {d:?} is not supported on this target: use default")),
        }
        if let Some((k, _)) = string_map(ipam.get("Options"), "IPAM.Options")?.into_iter().next() {
            return Err(format!("IPAM option {k:?} is not supported on this target"));
        }
        let configs = match ipam.get("Config") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err("IPAM.Config must be a list".into()),
        };
        if configs.len() > 1 {
            return Err("IPAM.Config: one pool per network is offered on this target".into());
        }
        if let Some(c) = configs.first() {
            let subnet = text(c, "Subnet")?;
            if !subnet.is_empty() {
                req.subnet = Some(parse_cidr(subnet)?);
            }
            let gw = text(c, "Gateway")?;
            if !gw.is_empty() {
                req.gateway = Some(ipv4(gw, "gateway")?);
            }
            let range = text(c, "IPRange")?;
            if !range.is_empty() {
                req.ip_range = Some(parse_cidr(range)?);
            }
            for (k, a) in string_map(c.get("AuxiliaryAddresses"), "AuxiliaryAddresses")? {
                req.aux.insert(k, ipv4(&a, "auxiliary address")?);
            }
            if req.subnet.is_none() && (req.gateway.is_some() || req.ip_range.is_some() || !req.aux.is_empty()) {
                return Err("IPAM.Config: a gateway, IPRange or auxiliary address needs a Subnet".into());
            }
        }
    }
    Ok(req)
}

/// Parses one `EndpointSettings` (the fields a client sets; those the server fills in
/// are ignored, as clients send them back empty).
pub(crate) fn endpoint_config(v: &Value) -> Result<EndpointConfig, String> {
    if v.is_null() {
        return Ok(EndpointConfig::default());
    }
    if !v.is_object() {
        return Err("EndpointSettings must be an object".into());
    }
    let list = |k: &str| -> Result<Vec<String>, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map(String::from).ok_or_else(|| format!("{k} must be a list of strings"))).collect(),
            Some(_) => Err(format!("{k} must be a list of strings")),
        }
    };
    let mut cfg =
        EndpointConfig { aliases: list("Aliases")?, links: list("Links")?, driver_opts: string_map(v.get("DriverOpts"), "DriverOpts")?, ..Default::default() };
    if let Some(l) = cfg.links.iter().find(|l| l.is_empty()) {
        return Err(format!("invalid link {l:?}: CONTAINER or CONTAINER:ALIAS"));
    }
    let mac = text(v, "MacAddress")?;
    if !mac.is_empty() {
        cfg.mac = Some(parse_mac(mac)?);
    }
    if let Some(ipam) = v.get("IPAMConfig").filter(|x| !x.is_null()) {
        let a = text(ipam, "IPv4Address")?;
        if !a.is_empty() {
            cfg.ipv4 = Some(ipv4(a, "IPv4Address")?);
        }
        if !text(ipam, "IPv6Address")?.is_empty() {
            return Err("IPAMConfig.IPv6Address is not supported on this target: containers get IPv4 addresses only".into());
        }
        match ipam.get("LinkLocalIPs") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for a in list {
                    let a = a.as_str().ok_or("IPAMConfig.LinkLocalIPs must be a list of addresses")?;
                    // moby's words for what is no address, or the unspecified one.
                    cfg.link_local_ips.push(match a.parse::<IpAddr>() {
                        Ok(IpAddr::V4(v4)) if !v4.is_unspecified() => v4,
                        Ok(IpAddr::V6(v6)) if !v6.is_unspecified() => {
                            return Err(format!("IPAMConfig.LinkLocalIPs {a}: containers get IPv4 addresses only on this target"));
                        }
                        _ => return Err(format!("IPAMConfig.LinkLocalIPs: invalid link-local IP address: {a}")),
                    });
                }
            }
            Some(_) => return Err("IPAMConfig.LinkLocalIPs must be a list of addresses".into()),
        }
    }
    Ok(cfg)
}

/// `NetworkingConfig.EndpointsConfig` of a create request, by network name.
pub(crate) fn endpoints(v: Option<&Value>) -> Result<BTreeMap<String, EndpointConfig>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(BTreeMap::new()) };
    match v.get("EndpointsConfig") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => {
            m.iter().map(|(k, e)| endpoint_config(e).map(|c| (k.clone(), c)).map_err(|m| format!("NetworkingConfig.EndpointsConfig[{k:?}]: {m}"))).collect()
        }
        Some(_) => Err("NetworkingConfig.EndpointsConfig must be an object".into()),
    }
}

/// `POST /networks/create`.
pub async fn create(rt: &Runtime, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let nreq = match network_request(&body) {
        Ok(r) => r,
        Err(m) => return error(400, &m),
    };
    if PREDEFINED.contains(&nreq.name.as_str()) {
        return error(403, &format!("{} is a pre-defined network and cannot be created", nreq.name));
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    match rt.networks().create(nreq, crate::runtime::random_id(), now) {
        Ok(n) => json(StatusCode::CREATED, &json!({"Id": n.id, "Warning": ""})),
        Err(e) => fail(e),
    }
}

/// `DELETE /networks/{id}`.
pub fn remove(rt: &Runtime, key: &str) -> Response<ApiBody> {
    if NETWORKS.iter().any(|(n, _, _)| *n == key || id_of(n) == key) {
        return error(403, &format!("{key} is a pre-defined network and cannot be removed"));
    }
    match rt.network_remove(key) {
        Ok(_) => super::body::empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `POST /networks/{id}/connect`.
pub async fn connect(rt: &Arc<Runtime>, key: &str, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let parsed = text(&body, "Container").and_then(|c| endpoint_config(body.get("EndpointConfig").unwrap_or(&Value::Null)).map(|e| (c.to_string(), e)));
    let (container, cfg) = match parsed {
        Ok((c, _)) if c.is_empty() => return error(400, "Container is required"),
        Ok(x) => x,
        Err(m) => return error(400, &m),
    };
    match rt.network_connect(key, &container, cfg) {
        Ok(()) => super::body::empty(StatusCode::OK),
        Err(e) => fail(e),
    }
}

/// `POST /networks/{id}/disconnect` (`Force` changes nothing: the link goes either way).
pub async fn disconnect(rt: &Runtime, key: &str, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let container = match text(&body, "Container").and_then(|c| flag(&body, "Force").map(|_| c)) {
        Ok("") => return error(400, "Container is required"),
        Ok(c) => c.to_string(),
        Err(m) => return error(400, &m),
    };
    match rt.network_disconnect(key, &container) {
        Ok(()) => super::body::empty(StatusCode::OK),
        Err(e) => fail(e),
    }
}

/// `POST /networks/prune?filters=...` (`label`, `label!`, `until`): user-defined
/// networks no container is on.
pub fn prune(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")).and_then(|f| f.only(&["label", "label!", "until"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let mut until = None;
    for u in f.values("until") {
        match crate::runtime::log::parse_time(u) {
            Ok(t) => until = Some(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())),
            Err(m) => return error(400, &format!("until: {m}")),
        }
    }
    let mut gone = Vec::new();
    for n in rt.networks().list() {
        if n.members.is_empty() && f.labels_match("label", &n.labels) && until.is_none_or(|u| n.created <= u) && rt.network_remove(&n.id).is_ok() {
            gone.push(n.name);
        }
    }
    json(StatusCode::OK, &json!({"NetworksDeleted": gone}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(id_of("bridge"), id_of("bridge"));
        assert_ne!(id_of("bridge"), id_of("host"));
    }

    #[test]
    fn create_requests_are_checked_and_what_is_not_offered_is_named() {
        let r = network_request(&json!({"Name": "n", "Labels": {"a": "b"}, "Internal": true,
            "IPAM": {"Driver": "default", "Config": [{"Subnet": "172.28.0.0/16", "IPRange": "172.28.5.0/24", "Gateway": "172.28.5.254", "AuxiliaryAddresses": {"a": "172.28.1.5"}}]}}))
        .unwrap();
        assert_eq!((r.subnet, r.gateway, r.internal), (Some((Ipv4Addr::new(172, 28, 0, 0), 16)), Some(Ipv4Addr::new(172, 28, 5, 254)), true));
        for (body, named) in [
            (json!({"Name": "n", "Driver": "host"}), "host"),
            (json!({"Name": "n", "Driver": "overlay"}), "overlay"),
            (json!({"Name": "n", "EnableIPv6": true}), "EnableIPv6"),
            (json!({"Name": "n", "Options": {"com.docker.network.bridge.name": "x"}}), "bridge.name"),
            (json!({"Name": "n", "Labels": ["a=b"]}), "Labels"),
            (json!({"Name": "n", "IPAM": {"Config": [{"Subnet": "2001:db8::/64"}]}}), "IPv6"),
            (json!({"Name": "n", "IPAM": {"Config": [{"Gateway": "10.0.0.1"}]}}), "Subnet"),
            (json!({"Name": "bad/name"}), "invalid network name"),
            (json!({"Name": "container:x"}), "invalid network name"),
            (json!({}), "Name is required"),
            (json!([]), "JSON object"),
        ] {
            let e = network_request(&body).unwrap_err();
            assert!(e.contains(named), "{body}: {e}");
        }
    }

    #[test]
    fn endpoint_settings_are_checked() {
        let e = endpoint_config(&json!({"Aliases": ["a"], "IPAMConfig": {"IPv4Address": "172.28.5.24"}, "MacAddress": "02:42:ac:11:00:09", "NetworkID": "x"}))
            .unwrap();
        assert_eq!((e.aliases.len(), e.ipv4, e.mac.as_deref()), (1, Some(Ipv4Addr::new(172, 28, 5, 24)), Some("02:42:ac:11:00:09")));
        let ll = endpoint_config(&json!({"IPAMConfig": {"LinkLocalIPs": ["169.254.10.10", "169.254.7.1"]}})).unwrap();
        assert_eq!(ll.link_local_ips, [Ipv4Addr::new(169, 254, 10, 10), Ipv4Addr::new(169, 254, 7, 1)]);
        assert_eq!(ipam_settings(&ll), Some(json!({"LinkLocalIPs": ["169.254.10.10", "169.254.7.1"]})));
        for (bad, says) in [
            (json!(["fe80::1"]), "IPv4 addresses only"),
            (json!(["baz"]), "invalid link-local IP address: baz"),
            (json!(["0.0.0.0"]), "invalid link-local IP address: 0.0.0.0"),
            (json!("169.254.1.1"), "must be a list"),
            (json!([7]), "must be a list"),
        ] {
            let e = endpoint_config(&json!({"IPAMConfig": {"LinkLocalIPs": bad}})).unwrap_err();
            assert!(e.contains("LinkLocalIPs") && e.contains(says), "{e}");
        }
        for bad in [
            json!({"Aliases": "a"}),
            json!({"IPAMConfig": {"IPv4Address": "x"}}),
            json!({"IPAMConfig": {"IPv6Address": "2001:db8::1"}}),
            json!({"MacAddress": "zz"}),
            json!(3),
        ] {
            assert!(endpoint_config(&bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_create_bodies_never_panic(s in "\\PC{0,80}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = network_request(&v);
                let _ = endpoint_config(&v);
                let _ = endpoints(Some(&v));
            }
        }
    }
}
