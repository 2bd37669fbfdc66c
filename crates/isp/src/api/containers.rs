// SPDX-License-Identifier: Apache-2.0
//! `/containers/...`: create, list, inspect, start, stop, restart, kill, wait, attach,
//! logs, remove.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokio::sync::{mpsc, watch};

use super::body::{empty, error, json, stream, ApiBody};
use super::detach::{self, EscapeMatcher, ParkedStdins, Scan};
use super::images::rfc3339;
use super::{read_json, Target};
use crate::runtime::{exposed_ports, frame, port_bindings, Container, CreateSpec, ExitEvent, NetworkMode, RunState, Runtime, RuntimeError};

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

fn strings(v: &Value, field: &str) -> Result<Option<Vec<String>>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("{field} must be a list of strings"))).collect::<Result<_, _>>().map(Some)
        }
        Some(_) => Err(format!("{field} must be a list of strings")),
    }
}

fn number(v: &Value, field: &str) -> Result<Option<i64>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_i64().map(Some).ok_or_else(|| format!("{field} must be an integer")),
    }
}

/// `HostConfig.ConsoleSize`: `[rows, columns]`; absent, null or `[0, 0]` is no size.
fn console_size(hc: &Value) -> Result<Option<(u16, u16)>, String> {
    let bad = || "HostConfig.ConsoleSize must be [height, width], two whole numbers from 0 to 65535".to_string();
    match hc.get("ConsoleSize") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 2 => {
            let dim = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok()).ok_or_else(bad);
            let (rows, cols) = (dim(&a[0])?, dim(&a[1])?);
            Ok(Some((rows, cols)).filter(|_| rows > 0 && cols > 0))
        }
        Some(_) => Err(bad()),
    }
}

/// The parts of a create request the runtime honours, type-checked.
pub(crate) fn create_spec(body: &Value) -> Result<CreateSpec, String> {
    if !body.is_object() {
        return Err("the create request must be a JSON object".into());
    }
    let image = body.get("Image").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or("Image is required")?.to_string();
    let hc = body.get("HostConfig").cloned().unwrap_or(Value::Null);
    let nano = number(&hc, "NanoCpus")?.filter(|&n| n > 0);
    let quota = number(&hc, "CpuQuota")?.filter(|&n| n > 0);
    let period = number(&hc, "CpuPeriod")?.filter(|&n| n > 0).unwrap_or(100_000);
    let cpus = nano.map(|n| n as f64 / 1e9).or(quota.map(|q| q as f64 / period as f64));
    let labels = match body.get("Labels") {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect(),
        _ => Default::default(),
    };
    Ok(CreateSpec {
        image,
        cmd: strings(body, "Cmd")?,
        entrypoint: strings(body, "Entrypoint")?,
        env: strings(body, "Env")?.unwrap_or_default(),
        working_dir: body.get("WorkingDir").and_then(Value::as_str).map(str::to_string),
        tty: body.get("Tty").and_then(Value::as_bool).unwrap_or(false),
        open_stdin: body.get("OpenStdin").and_then(Value::as_bool).unwrap_or(false),
        console_size: console_size(&hc)?,
        binds: strings(&hc, "Binds")?.unwrap_or_default(),
        cpus,
        memory: number(&hc, "Memory")?.filter(|&m| m > 0),
        auto_remove: hc.get("AutoRemove").and_then(Value::as_bool).unwrap_or(false),
        labels,
        network: NetworkMode::parse(match hc.get("NetworkMode") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s,
            Some(_) => return Err("HostConfig.NetworkMode must be a string".into()),
        })?,
        ports: port_bindings(body, &hc)?,
        exposed: exposed_ports(body)?,
    })
}

/// `POST /containers/create?name=NAME`.
pub async fn create(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let spec = match create_spec(&body) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    let image = spec.image.clone();
    match rt.create(t.get("name"), spec) {
        Ok(c) => json(StatusCode::CREATED, &json!({"Id": c.id, "Warnings": []})),
        // The CLI pulls on a 404 at create and tries again.
        Err(RuntimeError::NotFound(_)) => error(404, &format!("No such image: {image}")),
        Err(e) => fail(e),
    }
}

fn secs(t: SystemTime) -> i64 {
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

fn status(c: &Container) -> (&'static str, String) {
    match c.state() {
        RunState::Created => ("created", "Created".into()),
        RunState::Running { started, .. } => ("running", format!("Up {}", ago(started))),
        RunState::Exited { code, finished, .. } => ("exited", format!("Exited ({code}) {} ago", ago(finished))),
    }
}

fn image_name(c: &Container) -> &str {
    &c.spec.image
}

/// `GET /containers/json?all=1`.
pub fn list(rt: &Runtime, all: bool) -> Response<ApiBody> {
    let list: Vec<Value> = rt
        .list()
        .iter()
        .filter(|c| all || matches!(c.state(), RunState::Running { .. }))
        .map(|c| {
            let (state, status) = status(c);
            json!({
                "Id": c.id, "Names": [format!("/{}", c.name)], "Image": image_name(c), "ImageID": c.image_id,
                "Command": c.args.join(" "), "Created": secs(c.created), "Ports": ps_ports(c), "Labels": c.spec.labels,
                "State": state, "Status": status, "HostConfig": {"NetworkMode": c.spec.network.name()},
                "NetworkSettings": {"Networks": {}}, "Mounts": mounts(c),
            })
        })
        .collect();
    json(StatusCode::OK, &Value::Array(list))
}

/// `ps`'s ports: those published now, and the exposed ones that are not; none for a
/// container that does not run (as Docker lists them).
fn ps_ports(c: &Container) -> Value {
    if !matches!(c.state(), RunState::Running { .. }) {
        return Value::Array(Vec::new());
    }
    let published = c.published();
    let mut v: Vec<Value> =
        published.iter().map(|p| json!({"IP": p.host.ip().to_string(), "PrivatePort": p.container_port, "PublicPort": p.host.port(), "Type": "tcp"})).collect();
    for port in exposed(c) {
        if !published.iter().any(|p| p.container_port == port) {
            v.push(json!({"PrivatePort": port, "Type": "tcp"}));
        }
    }
    Value::Array(v)
}

/// The container's TCP ports: exposed, or to be published.
fn exposed(c: &Container) -> Vec<u16> {
    let mut v: Vec<u16> = c.spec.exposed.iter().copied().chain(c.spec.ports.iter().map(|p| p.container_port)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `NetworkSettings.Ports` of `inspect` (what `docker port` reads): every port, with
/// where it is published now or null.
fn network_ports(c: &Container) -> Value {
    let published = c.published();
    let mut m = serde_json::Map::new();
    for port in exposed(c) {
        let here: Vec<Value> = published
            .iter()
            .filter(|p| p.container_port == port)
            .map(|p| json!({"HostIp": p.host.ip().to_string(), "HostPort": p.host.port().to_string()}))
            .collect();
        m.insert(format!("{port}/tcp"), if here.is_empty() { Value::Null } else { Value::Array(here) });
    }
    Value::Object(m)
}

/// `HostConfig.PortBindings` as asked for.
fn port_bindings_asked(c: &Container) -> Value {
    let mut m = serde_json::Map::new();
    for p in &c.spec.ports {
        let e = m.entry(format!("{}/tcp", p.container_port)).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = e {
            let port = if p.host_port == 0 { String::new() } else { p.host_port.to_string() };
            a.push(json!({"HostIp": p.host_ip.map(|ip| ip.to_string()).unwrap_or_default(), "HostPort": port}));
        }
    }
    Value::Object(m)
}

fn mounts(c: &Container) -> Value {
    Value::Array(
        c.spec
            .binds
            .iter()
            .map(|b| {
                let mut p = b.split(':');
                json!({"Source": p.next().unwrap_or(""), "Destination": p.next().unwrap_or(""), "RW": p.next() == Some("rw")})
            })
            .collect(),
    )
}

/// `GET /containers/{id}/json`.
pub fn inspect(rt: &Runtime, id: &str) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let zero = "0001-01-01T00:00:00Z".to_string();
    let (status_word, running, pid, code, started, finished) = match c.state() {
        RunState::Created => ("created", false, 0, 0, zero.clone(), zero.clone()),
        RunState::Running { started, pid } => ("running", true, pid, 0, rfc3339(secs(started)), zero.clone()),
        RunState::Exited { code, started, finished } => ("exited", false, 0, code, started.map_or(zero.clone(), |s| rfc3339(secs(s))), rfc3339(secs(finished))),
    };
    let cmd = if c.args.len() > 1 { c.args[1..].to_vec() } else { Vec::new() };
    json(
        StatusCode::OK,
        &json!({
            "Id": c.id, "Created": rfc3339(secs(c.created)), "Path": c.args.first(), "Args": cmd,
            "State": {"Status": status_word, "Running": running, "Paused": false, "Restarting": false, "OOMKilled": false,
                      "Dead": false, "Pid": pid, "ExitCode": code, "Error": "", "StartedAt": started, "FinishedAt": finished},
            "Image": c.image_id, "Name": format!("/{}", c.name), "RestartCount": c.restarts(), "Driver": "overlay",
            "Platform": "linux", "LogPath": "", "Mounts": mounts(&c),
            "HostConfig": {"Binds": c.spec.binds, "AutoRemove": c.spec.auto_remove, "NetworkMode": c.spec.network.name(),
                           "PortBindings": port_bindings_asked(&c), "PublishAllPorts": false,
                           "NanoCpus": c.spec.cpus.map_or(0, |x| (x * 1e9) as i64), "Memory": c.spec.memory.unwrap_or(0)},
            "Config": {"Hostname": &c.id[..12], "Image": c.spec.image, "Cmd": c.spec.cmd, "Entrypoint": c.spec.entrypoint,
                       "Env": c.env, "WorkingDir": c.cwd, "Tty": c.spec.tty, "OpenStdin": c.spec.open_stdin,
                       "AttachStdin": false, "AttachStdout": !c.spec.tty, "AttachStderr": !c.spec.tty, "Labels": c.spec.labels,
                       "ExposedPorts": exposed(&c).iter().map(|p| (format!("{p}/tcp"), json!({}))).collect::<serde_json::Map<String, Value>>()},
            "NetworkSettings": {"Networks": {}, "Ports": network_ports(&c)},
        }),
    )
}

/// `POST /containers/{id}/start`.
pub async fn start(rt: &Arc<Runtime>, id: &str) -> Response<ApiBody> {
    match rt.start(id).await {
        Ok(true) => empty(StatusCode::NO_CONTENT),
        Ok(false) => empty(StatusCode::NOT_MODIFIED),
        Err(e) => fail(e),
    }
}

/// The `t=SECONDS` of stop and restart (10 when absent or unreadable, as Docker).
pub(crate) fn timeout(t: &Target) -> Duration {
    Duration::from_secs(t.get("t").and_then(|s| s.parse::<i64>().ok()).map_or(10, |s| s.max(0) as u64))
}

/// `POST /containers/{id}/stop?t=SECONDS`.
pub async fn stop(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    match rt.stop(id, timeout(t)).await {
        Ok(true) => empty(StatusCode::NO_CONTENT),
        Ok(false) => empty(StatusCode::NOT_MODIFIED),
        Err(e) => fail(e),
    }
}

/// `POST /containers/{id}/restart?t=SECONDS`.
pub async fn restart(rt: &Arc<Runtime>, id: &str, t: &Target) -> Response<ApiBody> {
    match rt.restart(id, timeout(t)).await {
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

/// `DELETE /containers/{id}?force=1`.
pub async fn remove(rt: &Runtime, id: &str, force: bool) -> Response<ApiBody> {
    match rt.remove(id, force).await {
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

/// `POST /containers/{id}/attach?stream=1&stdin=1&stdout=1&stderr=1&detachKeys=KEYS`: the
/// connection is hijacked (101) and carries the container's input and output. This is
/// the attach of `docker run -i`, `docker start -a` and `docker attach` alike.
///
/// With a terminal and standard input, the input is watched for the detach sequence
/// (`detachKeys`, ctrl-p,ctrl-q by default; see [`super::detach`]): on it the attach ends
/// and the container keeps running. When a TTY attach's input ends, detached or not, its
/// output ends too (as Docker's) and the container's input is kept for the next attach.
/// A bad `detachKeys` is refused on any attach, as Docker does.
pub fn attach(rt: &Runtime, parked: &Arc<ParkedStdins>, id: &str, t: &Target, mut req: Request<Incoming>) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let keys = match detach::keys_of(t.get("detachKeys")) {
        Ok(k) => k,
        Err(m) => return error(400, &m),
    };
    let tty = c.spec.tty;
    let (want_out, want_err) = (t.flag("stdout"), t.flag("stderr"));
    // Read before the input is taken, so that an input parked later is not kept for a
    // run that began after this one ended.
    let exits = c.exits();
    let exits_before = exits.borrow().exits;
    let want_in = t.flag("stdin");
    let stdin = if want_in { c.take_stdin().or_else(|| if tty { parked.take(&c.id) } else { None }) } else { None };
    let park = tty.then(|| (parked.clone(), c.id.clone(), exits, exits_before));
    let Some(mut out) = c.subscribe(true) else { return error(409, "the container is not running") };
    let upgrade = hyper::upgrade::on(&mut req);
    let (parked, id) = (parked.clone(), c.id.clone());
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let (rd, mut wr) = tokio::io::split(TokioIo::new(upgraded));
        // A TTY's input may still be held by the attach that just detached (see
        // `ParkedStdins::take_within`); without a terminal it is handed over once only.
        let waits = want_in && tty && stdin.is_none();
        let input = (stdin.is_some() || waits).then(|| {
            tokio::spawn(async move {
                let tx = match stdin {
                    Some(tx) => Some(tx),
                    None => parked.take_within(&id, PARKED_INPUT_PATIENCE).await,
                };
                match tx {
                    Some(tx) => forward_input(rd, StdinLease { tx: Some(tx), park }, tty.then(|| EscapeMatcher::new(keys))).await,
                    // No input to give: the attach carries output until the run ends.
                    None => std::future::pending().await,
                }
            })
        });
        let output = async {
            while let Some((s, data)) = out.recv().await {
                if (s == crate::runtime::STDOUT && !want_out) || (s == crate::runtime::STDERR && !want_err) {
                    continue;
                }
                let bytes = if tty { data.to_vec() } else { frame(s, &data) };
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        };
        match input {
            // A terminal's input ending (the detach sequence, or the client hanging up,
            // which is how the docker CLI detaches) ends the attach.
            Some(input) if tty => {
                tokio::select! {
                    _ = output => {}
                    _ = input => {}
                }
            }
            _ => output.await,
        }
        let _ = wr.flush().await;
        let _ = wr.shutdown().await;
    });
    let ct = if tty { "application/vnd.docker.raw-stream" } else { "application/vnd.docker.multiplexed-stream" };
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("Content-Type", ct)
        .header("Connection", "Upgrade")
        .header("Upgrade", "tcp")
        .body(http_body_util::BodyExt::boxed(http_body_util::Empty::new()))
        .expect("static response parts")
}

/// How long a TTY attach waits for the container's input to be released by the attach
/// before it (a detach is seen by the server a moment after the client hangs up).
const PARKED_INPUT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// A container's standard input, held by one attach. Dropped, it closes the input of a
/// container without a terminal (as Docker's `docker run -i` does at the client's end of
/// input) and parks that of a TTY container (a terminal has no end of input to pass on,
/// and `docker attach` may come back to it).
struct StdinLease {
    tx: Option<mpsc::UnboundedSender<Bytes>>,
    park: Option<(Arc<ParkedStdins>, String, watch::Receiver<ExitEvent>, u64)>,
}

impl Drop for StdinLease {
    fn drop(&mut self) {
        if let (Some(tx), Some((parked, id, exits, before))) = (self.tx.take(), self.park.take()) {
            parked.park(&id, tx, exits, before);
        }
    }
}

/// Copies the client's input to the container until it ends or, when `escape` watches
/// for it, the detach sequence arrives (swallowed: the container never sees it).
async fn forward_input<R: tokio::io::AsyncRead + Unpin>(mut rd: R, stdin: StdinLease, mut escape: Option<EscapeMatcher>) {
    let Some(tx) = stdin.tx.as_ref() else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (data, detached) = match escape.as_mut().map(|m| m.scan(&buf[..n])) {
            None => (Bytes::copy_from_slice(&buf[..n]), false),
            Some(Scan::Forward(b)) => (Bytes::from(b), false),
            Some(Scan::Detach(b)) => (Bytes::from(b), true),
        };
        if !data.is_empty() && tx.send(data).is_err() {
            return;
        }
        if detached {
            return;
        }
    }
    // A sequence begun but never finished was the client's input after all.
    if let Some(rest) = escape.as_mut().map(EscapeMatcher::finish).filter(|r| !r.is_empty()) {
        let _ = tx.send(Bytes::from(rest));
    }
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

/// `GET /containers/{id}/logs?stdout=1&stderr=1&follow=1&tail=N`.
pub async fn logs(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let (want_out, want_err, follow) = (t.flag("stdout"), t.flag("stderr"), t.flag("follow"));
    if !want_out && !want_err {
        return error(400, "You must choose at least one stream");
    }
    let tail = t.get("tail").filter(|s| *s != "all").and_then(|s| s.parse::<usize>().ok());
    let (len, live) = if follow { c.follow_log() } else { (u64::MAX, None) };
    let mut logged = tokio::fs::read(c.log_path()).await.unwrap_or_default();
    logged.truncate(len.min(logged.len() as u64) as usize);
    let mut frames: Vec<(u8, Bytes)> = split_frames(&logged).into_iter().map(|(s, d)| (s, Bytes::copy_from_slice(d))).collect();
    if let Some(n) = tail {
        frames = tail_lines(frames, n);
    }
    let tty = c.spec.tty;
    let ct = if tty { "application/vnd.docker.raw-stream" } else { "application/vnd.docker.multiplexed-stream" };
    let (resp, tx) = stream(StatusCode::OK, ct);
    let keep = move |s: u8| (s == crate::runtime::STDOUT && want_out) || (s == crate::runtime::STDERR && want_err);
    let enc = move |s: u8, d: &[u8]| if tty { Bytes::copy_from_slice(d) } else { Bytes::from(frame(s, d)) };
    tokio::spawn(async move {
        for (s, d) in frames {
            if keep(s) && tx.send(enc(s, &d)).await.is_err() {
                return;
            }
        }
        if let Some(mut rx) = live {
            while let Some((s, d)) = rx.recv().await {
                if keep(s) && tx.send(enc(s, &d)).await.is_err() {
                    return;
                }
            }
        }
    });
    resp
}

/// The frames of a log file; a torn last frame (a crash mid-write) is dropped.
fn split_frames(mut b: &[u8]) -> Vec<(u8, &[u8])> {
    let mut v = Vec::new();
    while b.len() >= 8 {
        let n = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) as usize;
        if b.len() < 8 + n {
            break;
        }
        v.push((b[0], &b[8..8 + n]));
        b = &b[8 + n..];
    }
    v
}

/// The frames holding the last `n` lines (whole frames; a frame may hold several lines).
fn tail_lines<T: AsRef<[u8]> + Clone>(frames: Vec<(u8, T)>, n: usize) -> Vec<(u8, T)> {
    let mut lines = 0;
    let mut start = frames.len();
    for (i, (_, d)) in frames.iter().enumerate().rev() {
        let k = d.as_ref().iter().filter(|&&b| b == b'\n').count().max(1);
        if lines + k > n {
            break;
        }
        lines += k;
        start = i;
    }
    frames[start..].to_vec()
}

#[cfg(test)]
mod tests {
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
        assert_eq!((net.network, net.ports.len(), net.exposed.clone()), (NetworkMode::Default, 1, vec![80]));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "host"}})).unwrap().network, NetworkMode::Host);
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "mynet"}})).unwrap_err().contains("not supported"));
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"PortBindings": {"53/udp": [{"HostPort": "53"}]}}})).unwrap_err().contains("TCP only"));
        assert!(create_spec(&json!({"Image": "b", "ExposedPorts": {"x/tcp": {}}})).unwrap_err().contains("invalid port"));
        for bad in [json!([1]), json!([1, -1]), json!([70000, 1]), json!("40x120"), json!([1.5, 2])] {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {"ConsoleSize": bad}})).unwrap_err();
            assert!(e.contains("ConsoleSize"), "{e}");
        }
    }

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
        assert_eq!(signal_name(&target("signal=SIGTERM")), Ok("SIGTERM"));
        assert_eq!(signal_name(&target("signal=9")), Ok("9"));
        assert!(signal_name(&target("signal=SIG")).is_err());
        assert!(signal_name(&target("signal=TERM%20-a")).is_err());
        assert_eq!(timeout(&target("t=-5")), Duration::ZERO);
        assert_eq!(timeout(&target("t=x")), Duration::from_secs(10));
    }

    #[test]
    fn log_frames_split_and_tail() {
        let mut log = frame(1, b"a\nb\n");
        log.extend(frame(2, b"c\n"));
        log.extend(&frame(1, b"torn")[..6]);
        let f = split_frames(&log);
        assert_eq!(f, vec![(1, &b"a\nb\n"[..]), (2, &b"c\n"[..])]);
        assert_eq!(tail_lines(f.clone(), 1), vec![(2, &b"c\n"[..])]);
        assert_eq!(tail_lines(f, 3).len(), 2);
    }

    proptest::proptest! {
        #[test]
        fn random_create_bodies_never_panic(s in ".{0,200}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = create_spec(&v);
            }
        }

        #[test]
        fn random_logs_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let f = split_frames(&b);
            let _ = tail_lines(f, 2);
        }
    }
}
