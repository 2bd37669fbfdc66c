// SPDX-License-Identifier: Apache-2.0
//! `/containers/...`: create, list, inspect, start, stop, restart, kill, wait, attach,
//! logs, remove.

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::body::{empty, error, json, stream, ApiBody};
use super::filters::Filters;
use super::Target;
use crate::runtime::{parse_port_key, Container, PortKey, RunState, Runtime, RuntimeError};

pub(crate) fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

pub(crate) fn secs(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn ago(t: SystemTime) -> String {
    let s = SystemTime::now().duration_since(t).unwrap_or_default().as_secs();
    match s {
        0 => "Less than a second".into(),
        1..=59 => format!("{s} seconds"),
        60..=3599 => format!("{} minutes", s / 60),
        3600..=86_399 => format!("{} hours", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// The state word of `ps` and its filters, and the status line.
/// ` (healthy)` and the like, after a running container's status, as `docker ps` shows.
fn health_note(rt: &Runtime, c: &Container) -> String {
    match (c.spec.health.is_some(), rt.health(&c.id)) {
        (false, _) => String::new(),
        (true, Some(h)) if h.status != "starting" => format!(" ({})", h.status),
        (true, _) => " (health: starting)".into(),
    }
}

pub(crate) fn status(rt: &Runtime, c: &Container) -> (&'static str, String) {
    match c.state() {
        RunState::Created => ("created", "Created".into()),
        RunState::Running { started, .. } if c.paused() => ("paused", format!("Up {} (Paused)", ago(started))),
        RunState::Running { started, .. } => ("running", format!("Up {}{}", ago(started), health_note(rt, c))),
        RunState::Exited { code, finished, .. } if c.restarting() => ("restarting", format!("Restarting ({code}) {} ago", ago(finished))),
        RunState::Exited { code, finished, .. } => ("exited", format!("Exited ({code}) {} ago", ago(finished))),
    }
}

pub(crate) fn image_name(c: &Container) -> &str {
    &c.spec.image
}

/// Whether container `c` passes the `filters` of `ps` and prune (`id`, `name`, `label`,
/// `status`, `exited`, `ancestor`, `before`, `since`, `until`, `network`, `volume`,
/// `expose`, `publish`, `health`, `is-task`); `before`/`since` name other containers of
/// `rt`.
pub(crate) fn passes(rt: &Runtime, c: &Container, f: &Filters) -> Result<bool, String> {
    let (state, _) = status(rt, c);
    let any = |k: &str, ok: &dyn Fn(&str) -> bool| {
        let v = f.values(k);
        v.is_empty() || v.iter().any(|x| ok(x))
    };
    for s in f.values("status") {
        if !["created", "restarting", "running", "removing", "paused", "exited", "dead"].contains(&s) {
            return Err(format!("invalid filter 'status={s}'"));
        }
    }
    let code = match c.state() {
        RunState::Exited { code, .. } => Some(code),
        _ => None,
    };
    let mut ok = any("id", &|x| c.id.starts_with(x))
        && any("name", &|x| c.name().contains(x.trim_start_matches('/')))
        && any("status", &|x| x == state)
        && any("exited", &|x| x.parse::<i32>().ok().is_some_and(|n| code == Some(n)))
        && any("ancestor", &|x| c.spec.image == x || c.image_id == x || rt.images().get(x).is_ok_and(|i| i.id == c.image_id))
        && f.labels_match("label", &c.spec.labels)
        && any("network", &|x| {
            x == c.spec.network.name()
                || (x == "bridge" && c.spec.network.name() == "default")
                || rt.networks().of_container(&c.id).iter().any(|(n, _)| n.name == x || n.id.starts_with(x))
        })
        && any("volume", &|x| c.spec.binds.iter().any(|b| b.split(':').take(2).any(|p| p == x)))
        && any("expose", &|x| port_of(x).is_some_and(|p| exposed(c).contains(&p)))
        && any("publish", &|x| port_of(x).is_some_and(|p| c.spec.ports.iter().any(|b| b.key() == p)))
        // No container has a health check (they are refused at create) or is a task.
        && any("health", &|x| match (c.spec.health.is_some(), rt.health(&c.id)) {
            (false, _) => x == "none",
            (true, Some(h)) if matches!(c.state(), RunState::Running { .. }) => x == h.status,
            (true, _) => x == "starting",
        })
        && any("is-task", &|x| x == "false");
    for (k, newer) in [("before", false), ("since", true)] {
        for other in f.values(k) {
            let o = rt.get(other).map_err(|e| e.to_string())?;
            ok &= if newer { c.created > o.created || (c.created == o.created && c.id != o.id) } else { c.created < o.created };
        }
    }
    for u in f.values("until") {
        let t = super::super::runtime::log::parse_time(u).map_err(|e| format!("until: {e}"))?;
        ok &= c.created <= t;
    }
    Ok(ok)
}

/// A port of the `expose`/`publish` filters: `80`, `80/tcp` or `80/udp`.
fn port_of(x: &str) -> Option<PortKey> {
    parse_port_key(x).ok()
}

/// `GET /containers/json?all=1&limit=N&filters=...`.
pub fn list(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match Filters::parse(t.get("filters")) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    if let Err(m) = f.only(&[
        "id", "name", "label", "label!", "status", "exited", "ancestor", "before", "since", "until", "network", "volume", "expose", "publish", "health",
        "is-task",
    ]) {
        return error(400, &m);
    }
    // A status filter or a limit looks at stopped containers too, as with Docker.
    let limit = t.get("limit").and_then(|l| l.parse::<i64>().ok()).filter(|&l| l > 0);
    let all = t.flag("all") || !f.values("status").is_empty() || limit.is_some() || !f.values("exited").is_empty();
    let mut list = Vec::new();
    for c in rt.list() {
        if !all && !matches!(c.state(), RunState::Running { .. }) {
            continue;
        }
        match passes(rt, &c, &f) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(m) => return error(400, &m),
        }
        let (state, status) = status(rt, &c);
        let mut row = json!({
            "Id": c.id, "Names": std::iter::once(format!("/{}", c.name())).chain(rt.link_names(&c)).collect::<Vec<_>>(), "Image": image_name(&c), "ImageID": c.image_id,
            "Command": c.args.join(" "), "Created": secs(c.created), "Ports": ps_ports(&c), "Labels": c.spec.labels,
            "State": state, "Status": status, "HostConfig": {"NetworkMode": super::networks::mode_name(&c)},
            "NetworkSettings": {"Networks": super::networks::container_networks(rt, &c)}, "Mounts": mounts(rt, &c),
        });
        if t.flag("size") {
            row["SizeRw"] = json!(crate::image::layer_size(&c.upper_dir()));
            row["SizeRootFs"] = json!(rt.images().get(&c.image_id).map_or(0, |i| i.size) + crate::image::layer_size(&c.upper_dir()));
        }
        list.push(row);
        if limit.is_some_and(|l| list.len() as i64 >= l) {
            break;
        }
    }
    json(StatusCode::OK, &Value::Array(list))
}

/// `ps`'s ports: those published now, and the exposed ones that are not; none for a
/// container that does not run (as Docker lists them).
fn ps_ports(c: &Container) -> Value {
    if !matches!(c.state(), RunState::Running { .. }) {
        return Value::Array(Vec::new());
    }
    let published = c.published();
    let mut v: Vec<Value> = published
        .iter()
        .map(|p| json!({"IP": p.host.ip().to_string(), "PrivatePort": p.container_port, "PublicPort": p.host.port(), "Type": p.proto.name()}))
        .collect();
    for port in exposed(c) {
        if !published.iter().any(|p| p.container_port == port.port && p.proto == port.proto) {
            v.push(json!({"PrivatePort": port.port, "Type": port.proto.name()}));
        }
    }
    Value::Array(v)
}

/// The container's ports: exposed, or to be published.
pub(crate) fn exposed(c: &Container) -> Vec<PortKey> {
    let mut v: Vec<PortKey> = c.spec.exposed.iter().copied().chain(c.spec.ports.iter().map(|p| p.key())).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `NetworkSettings.Ports` of `inspect` (what `docker port` reads): every port, with
/// where it is published now or null.
pub(crate) fn network_ports(c: &Container) -> Value {
    let published = c.published();
    let mut m = serde_json::Map::new();
    for port in exposed(c) {
        let here: Vec<Value> = published
            .iter()
            .filter(|p| p.container_port == port.port && p.proto == port.proto)
            .map(|p| json!({"HostIp": p.host.ip().to_string(), "HostPort": p.host.port().to_string()}))
            .collect();
        m.insert(port.to_string(), if here.is_empty() { Value::Null } else { Value::Array(here) });
    }
    Value::Object(m)
}

/// `HostConfig.PortBindings` as asked for.
pub(crate) fn port_bindings_asked(c: &Container) -> Value {
    let mut m = serde_json::Map::new();
    for p in &c.spec.ports {
        let e = m.entry(p.key().to_string()).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = e {
            let port = if p.host_port == 0 { String::new() } else { p.host_port.to_string() };
            a.push(json!({"HostIp": p.host_ip.map(|ip| ip.to_string()).unwrap_or_default(), "HostPort": port}));
        }
    }
    Value::Object(m)
}

pub(crate) fn mounts(rt: &Runtime, c: &Container) -> Value {
    use crate::runtime::{parse_bind, BindSource};
    let mut out: Vec<Value> = c
        .spec
        .binds
        .iter()
        .filter_map(|b| parse_bind(b).ok())
        .map(|(src, dst, ro)| {
            let rw = ro != Some(true);
            let mode = match ro {
                Some(true) => "ro",
                Some(false) => "rw",
                None => "",
            };
            match src {
                BindSource::Volume(v) => {
                    let at = rt.volume_get(&v).map(|x| x.mountpoint.display().to_string()).unwrap_or_default();
                    json!({"Type": "volume", "Name": v, "Source": at, "Destination": dst, "Driver": "local", "Mode": mode, "RW": rw, "Propagation": ""})
                }
                BindSource::Sharable(rel) => {
                    json!({"Type": "bind", "Source": format!("/{rel}"), "Destination": dst, "Mode": mode, "RW": rw, "Propagation": "rprivate"})
                }
            }
        })
        .collect();
    out.extend(c.spec.options.tmpfs.keys().map(|dst| json!({"Type": "tmpfs", "Source": "", "Destination": dst, "Mode": "", "RW": true, "Propagation": ""})));
    Value::Array(out)
}

/// `POST /containers/{id}/start`.
pub async fn start(rt: &Arc<Runtime>, id: &str) -> Response<ApiBody> {
    match rt.start(id).await {
        Ok(true) => empty(StatusCode::NO_CONTENT),
        Ok(false) => empty(StatusCode::NOT_MODIFIED),
        Err(e) => fail(e),
    }
}

/// The `t=SECONDS` of stop and restart (the container's stop timeout when absent or
/// unreadable; -1 waits as long as it takes, here a day).
pub(crate) fn timeout(t: &Target) -> Option<Duration> {
    t.get("t").and_then(|s| s.parse::<i64>().ok()).map(|s| Duration::from_secs(if s < 0 { 86_400 } else { s as u64 }))
}

/// `POST /containers/{id}/stop?t=SECONDS&signal=SIG`.
pub async fn stop(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let signal = match stop_signal(t) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match rt.stop(id, timeout(t), signal).await {
        Ok(true) => empty(StatusCode::NO_CONTENT),
        Ok(false) => empty(StatusCode::NOT_MODIFIED),
        Err(e) => fail(e),
    }
}

/// `POST /containers/{id}/restart?t=SECONDS&signal=SIG`.
pub async fn restart(rt: &Arc<Runtime>, id: &str, t: &Target) -> Response<ApiBody> {
    let signal = match stop_signal(t) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match rt.restart(id, timeout(t), signal).await {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// The `signal=SIG` of kill: a name (`TERM`, `SIGTERM`) or a number; KILL when absent.
/// It reaches runc's command line, so it is letters and digits only.
pub(crate) fn signal_name(t: &Target) -> Result<&str, String> {
    let sig = t.get("signal").unwrap_or("KILL");
    let bare = sig.strip_prefix("SIG").unwrap_or(sig);
    if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("invalid signal {sig:?}: give a name like TERM or a number"));
    }
    Ok(sig)
}

/// The `signal=SIG` of stop and restart (API 1.42): the signal sent in place of the
/// container's stop signal; `None` when absent.
pub(crate) fn stop_signal(t: &Target) -> Result<Option<&str>, String> {
    if t.get("signal").is_none() {
        return Ok(None);
    }
    signal_name(t).map(Some)
}

/// `POST /containers/{id}/kill?signal=SIG`.
pub async fn kill(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let sig = match signal_name(t) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match rt.kill(id, sig).await {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `POST /containers/{id}/pause` and `/unpause`.
pub async fn pause(rt: &Runtime, id: &str, pause: bool) -> Response<ApiBody> {
    match rt.pause(id, pause).await {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `DELETE /containers/{id}?force=1`.
/// With `volumes` (`v=1`), the container's anonymous volumes go too.
pub async fn remove(rt: &Runtime, id: &str, force: bool, volumes: bool) -> Response<ApiBody> {
    let c = rt.get(id).ok();
    match rt.remove(id, force).await {
        Ok(()) => {
            if let Some(c) = c.filter(|_| volumes) {
                rt.remove_anonymous_volumes(&c);
            }
            empty(StatusCode::NO_CONTENT)
        }
        Err(e) => fail(e),
    }
}

/// `DELETE /containers/PARENT/ALIAS?link=1`: removes a legacy link, not a container.
pub fn remove_link(rt: &Runtime, name: &str) -> Response<ApiBody> {
    match rt.remove_link(name) {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => fail(e),
    }
}

/// `POST /containers/{id}/wait?condition=not-running|next-exit|removed`: the headers go
/// out at once (the CLI waits for them before it starts the container), the status when
/// the condition is met.
pub fn wait(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let condition = t.get("condition").unwrap_or("not-running").to_string();
    if !matches!(condition.as_str(), "not-running" | "next-exit" | "removed") {
        return error(400, &format!("invalid condition {condition:?}: use not-running, next-exit or removed"));
    }
    let mut rx = c.exits();
    let before = rx.borrow().exits;
    let running = matches!(c.state(), RunState::Running { .. });
    let (resp, tx) = stream(StatusCode::OK, "application/json");
    tokio::spawn(async move {
        let done = match condition.as_str() {
            "not-running" if !running => Ok(()),
            "not-running" | "next-exit" => rx.wait_for(|e| e.exits > before || e.removed).await.map(|_| ()),
            _ => rx.wait_for(|e| e.removed).await.map(|_| ()),
        };
        let code = rx.borrow().code;
        let _ = done;
        let _ = tx.send(Bytes::from(json!({"StatusCode": code, "Error": null}).to_string() + "\n")).await;
    });
    resp
}

/// The `h=ROWS&w=COLUMNS` of resize, both required.
pub(crate) fn window_size(t: &Target) -> Result<(u16, u16), String> {
    let dim = |k: &str, what: &str| -> Result<u16, String> {
        let v = t.get(k).ok_or_else(|| format!("the terminal's {what} is missing: give {k}=N"))?;
        v.parse::<u16>().map_err(|_| format!("invalid terminal {what} {k}={v:?}: a whole number from 0 to 65535"))
    };
    Ok((dim("h", "height")?, dim("w", "width")?))
}

/// `POST /containers/{id}/resize?h=ROWS&w=COLUMNS`: sets the window size of a TTY
/// container's terminal (its processes get SIGWINCH). A container without a terminal
/// has nothing to resize and answers 200, as Docker does; a TTY container that is not
/// running answers 409.
pub fn resize(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let (rows, cols) = match window_size(t) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match c.resize(rows, cols) {
        Ok(()) => empty(StatusCode::OK),
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(q: &str) -> Target {
        Target::from_parts("/containers/x/resize", Some(q))
    }

    #[test]
    fn resize_and_kill_parameters_are_checked() {
        assert_eq!(window_size(&target("h=40&w=120")), Ok((40, 120)));
        assert!(window_size(&target("w=120")).unwrap_err().contains("height"));
        assert!(window_size(&target("h=40&w=-1")).unwrap_err().contains("width"));
        assert!(window_size(&target("h=99999&w=1")).is_err());
        assert_eq!(signal_name(&target("")), Ok("KILL"));
        assert_eq!(stop_signal(&target("")), Ok(None));
        assert_eq!(stop_signal(&target("signal=SIGINT")), Ok(Some("SIGINT")));
        assert!(stop_signal(&target("signal=a%20b")).is_err());
        assert_eq!(signal_name(&target("signal=SIGTERM")), Ok("SIGTERM"));
        assert_eq!(signal_name(&target("signal=9")), Ok("9"));
        assert!(signal_name(&target("signal=SIG")).is_err());
        assert!(signal_name(&target("signal=TERM%20-a")).is_err());
        assert_eq!(timeout(&target("t=0")), Some(Duration::ZERO));
        assert_eq!(timeout(&target("t=x")), None);
    }
}
