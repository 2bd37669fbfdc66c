// SPDX-License-Identifier: Apache-2.0
//! `docker exec`: `POST /containers/{id}/exec` (create), `POST /exec/{id}/start` (detached,
//! or hijacked like attach: multiplexed frames, raw with a terminal), `GET
//! /exec/{id}/json`, `POST /exec/{id}/resize`.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::body::{empty, error, json, ApiBody};
use super::containers::window_size;
use super::detach::{self, EscapeMatcher, Scan};
use super::{json_body, read_json, Target};
use crate::runtime::{frame, ExecSpec, ExecState, Runtime, RuntimeError};

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

fn strings(v: &Value, field: &str) -> Result<Vec<String>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("{field} must be a list of strings"))).collect(),
        Some(_) => Err(format!("{field} must be a list of strings")),
    }
}

fn flag(v: &Value, field: &str) -> Result<bool, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{field} must be true or false")),
    }
}

fn text(v: &Value, field: &str) -> Result<Option<String>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

fn size(v: &Value) -> Result<Option<(u16, u16)>, String> {
    match v.get("ConsoleSize") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 2 => {
            let dim = |x: &Value| x.as_u64().and_then(|n| u16::try_from(n).ok()).ok_or("ConsoleSize must be [height, width]");
            let (r, c) = (dim(&a[0])?, dim(&a[1])?);
            Ok(Some((r, c)).filter(|_| r > 0 && c > 0))
        }
        Some(_) => Err("ConsoleSize must be [height, width]".into()),
    }
}

/// An exec-create request, checked; every field is honoured or refused.
pub(crate) fn exec_spec(v: &Value) -> Result<ExecSpec, String> {
    if !v.is_object() {
        return Err("the exec request must be a JSON object".into());
    }
    if flag(v, "Privileged")? {
        return Err("Privileged is not supported on this target: an exec keeps the container's capabilities".into());
    }
    // Docker reads JSON field names regardless of case, and clients send this one as
    // `detachKeys` (the Docker SDK for Python, from its configuration file).
    let detach_field = v.as_object().and_then(|m| m.keys().find(|k| k.eq_ignore_ascii_case("DetachKeys")).cloned()).unwrap_or_else(|| "DetachKeys".into());
    let detach_keys = text(v, &detach_field)?.unwrap_or_default();
    detach::keys_of(Some(&detach_keys).filter(|k| !k.is_empty()).map(String::as_str))?;
    let cmd = strings(v, "Cmd")?;
    if cmd.is_empty() {
        return Err("No exec command specified".into());
    }
    let env = strings(v, "Env")?;
    if let Some(bad) = env.iter().find(|e| e.split('=').next().is_none_or(str::is_empty)) {
        return Err(format!("invalid environment variable {bad:?}: NAME=value"));
    }
    let user = text(v, "User")?;
    if let Some(u) = &user {
        if !u.chars().all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c)) {
            return Err(format!("invalid User {u:?}: user[:group], names or numbers"));
        }
    }
    Ok(ExecSpec {
        cmd,
        env,
        working_dir: text(v, "WorkingDir")?,
        user,
        tty: flag(v, "Tty")?,
        attach_stdin: flag(v, "AttachStdin")?,
        attach_stdout: flag(v, "AttachStdout")?,
        attach_stderr: flag(v, "AttachStderr")?,
        console_size: size(v)?,
        detach_keys,
    })
}

/// `POST /containers/{id}/exec`.
pub async fn create(rt: &Runtime, id: &str, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let spec = match exec_spec(&body) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match rt.exec_create(id, spec) {
        Ok(e) => json(StatusCode::CREATED, &json!({"Id": e.id})),
        Err(e) => fail(e),
    }
}

/// `POST /exec/{id}/start`: `{"Detach": true}` starts it and answers at once; otherwise
/// the connection carries its streams (101 when the client asked to upgrade, else 200
/// with the raw stream) and closes when the process has ended.
pub async fn start(rt: &Runtime, id: &str, mut req: Request<Incoming>) -> Response<ApiBody> {
    let e = match rt.exec_get(id) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let upgrade_asked = req.headers().get(hyper::header::UPGRADE).is_some();
    let upgrade = upgrade_asked.then(|| hyper::upgrade::on(&mut req));
    // The body is small JSON, read before the connection is taken over.
    let bytes = match http_body_util::BodyExt::collect(http_body_util::Limited::new(req.into_body(), 64 << 10)).await {
        Ok(b) => b.to_bytes(),
        Err(err) => return error(400, &format!("request body: {err}")),
    };
    let body = match json_body(&bytes) {
        Ok(v) => v,
        Err(m) => return error(400, &m),
    };
    let detach = match flag(&body, "Detach") {
        Ok(d) => d,
        Err(m) => return error(400, &m),
    };
    // The stream's framing follows the start request, as Docker's: raw with `Tty`, else
    // multiplexed, whether or not the process got a terminal at create (a terminal's
    // output then comes framed as standard output). Absent, it follows create.
    let raw = match body.get("Tty") {
        None | Some(Value::Null) => e.spec.tty,
        Some(Value::Bool(t)) => *t,
        Some(_) => return error(400, "Tty must be a boolean"),
    };
    let start_size = match size(&body) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    let io = match rt.exec_start(&e).await {
        Ok(io) => io,
        Err(err) => return fail(err),
    };
    // The terminal's size as the client has it now (it may differ from create's).
    if let Some((rows, cols)) = start_size {
        let _ = e.resize(rows, cols);
    }
    if detach {
        // Nobody reads the output: it is dropped as it comes.
        tokio::spawn(async move {
            let mut out = io.output;
            while out.recv().await.is_some() {}
        });
        return empty(StatusCode::OK);
    }
    let tty = e.spec.tty;
    let (want_out, want_err) = (e.spec.attach_stdout, e.spec.attach_stderr);
    let keys = detach::keys_of(Some(&e.spec.detach_keys).filter(|k| !k.is_empty()).map(String::as_str)).unwrap_or_default();
    let ct = if raw { "application/vnd.docker.raw-stream" } else { "application/vnd.docker.multiplexed-stream" };
    let Some(upgrade) = upgrade else {
        // No upgrade asked for: the output is the response body.
        let (resp, tx) = super::body::stream(StatusCode::OK, ct);
        drop(io.input);
        let mut ended = e.watch();
        tokio::spawn(async move {
            let mut out = io.output;
            while let Some((s, d)) = out.recv().await {
                if (s == crate::runtime::STDOUT && !want_out) || (s == crate::runtime::STDERR && !want_err) {
                    continue;
                }
                let b = if raw { d } else { Bytes::from(frame(s, &d)) };
                if tx.send(b).await.is_err() {
                    return;
                }
            }
            // The body ends once the exit code is known.
            let _ = ended.wait_for(|s| matches!(s, ExecState::Exited { .. })).await;
            drop(tx);
        });
        return resp;
    };
    let mut ended = e.watch();
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        tokio::time::sleep(super::streams::HIJACK_SETTLE).await;
        let (mut rd, mut wr) = tokio::io::split(TokioIo::new(upgraded));
        let input = io.input.map(|tx| {
            tokio::spawn(async move {
                let mut escape = tty.then(|| EscapeMatcher::new(keys));
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    let n = match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => n,
                    };
                    let (data, detached) = match escape.as_mut().map(|m| m.scan(&buf[..n])) {
                        None => (buf[..n].to_vec(), false),
                        Some(Scan::Forward(b)) => (b, false),
                        Some(Scan::Detach(b)) => (b, true),
                    };
                    if !data.is_empty() && tx.send(Bytes::from(data)).is_err() {
                        return false;
                    }
                    if detached {
                        return true;
                    }
                }
                // The input dropped here ends the process's standard input.
            })
        });
        let mut out = io.output;
        let output = super::streams::pump_output(&mut out, &mut wr, raw, want_out, want_err);
        let detached = match input {
            // The detach sequence ends the attach at once; the process keeps running.
            Some(input) if tty => {
                tokio::pin!(input);
                tokio::select! {
                    _ = output => false,
                    r = &mut input => {
                        let detached = matches!(r, Ok(true));
                        if !detached {
                            output_rest(&mut out).await;
                        }
                        detached
                    }
                }
            }
            _ => {
                output.await;
                false
            }
        };
        if !detached {
            // The exit code is known before the client, seeing the end, asks for it.
            let _ = ended.wait_for(|s| matches!(s, ExecState::Exited { .. })).await;
        }
        let _ = wr.flush().await;
        let _ = wr.shutdown().await;
    });
    hyper::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("Content-Type", ct)
        .header("Connection", "Upgrade")
        .header("Upgrade", "tcp")
        .body(http_body_util::BodyExt::boxed(http_body_util::Empty::new()))
        .expect("static response parts")
}

/// Drains what is left of an output whose client stopped sending (not detached): the
/// connection stays until the process ends.
async fn output_rest(out: &mut tokio::sync::mpsc::UnboundedReceiver<(u8, Bytes)>) {
    while out.recv().await.is_some() {}
}

/// `GET /exec/{id}/json`.
pub fn inspect(rt: &Runtime, id: &str) -> Response<ApiBody> {
    let e = match rt.exec_get(id) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let (running, code, pid) = match e.state() {
        ExecState::Created => (false, Value::Null, 0),
        ExecState::Running { pid } => (true, Value::Null, pid),
        ExecState::Exited { code } => (false, json!(code), 0),
    };
    let s = &e.spec;
    json(
        StatusCode::OK,
        &json!({
            "ID": e.id, "Running": running, "ExitCode": code, "Pid": pid, "ContainerID": e.container_id,
            "OpenStdin": s.attach_stdin, "OpenStdout": s.attach_stdout, "OpenStderr": s.attach_stderr, "CanRemove": false,
            "DetachKeys": s.detach_keys,
            "ProcessConfig": {"tty": s.tty, "entrypoint": s.cmd[0], "arguments": &s.cmd[1..], "privileged": false,
                              "user": s.user.clone().unwrap_or_default()},
        }),
    )
}

/// `POST /exec/{id}/resize?h=ROWS&w=COLUMNS`.
pub fn resize(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let e = match rt.exec_get(id) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let (rows, cols) = match window_size(t) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    match e.resize(rows, cols) {
        Ok(()) => empty(StatusCode::OK),
        Err(err) => fail(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_requests_are_checked() {
        let s =
            exec_spec(&json!({"Cmd": ["sh", "-c", "id"], "Env": ["A=1"], "Tty": true, "AttachStdout": true, "User": "nobody", "WorkingDir": "/tmp"})).unwrap();
        assert_eq!((s.cmd.len(), s.tty, s.attach_stdout, s.user.as_deref()), (3, true, true, Some("nobody")));
        assert!(exec_spec(&json!({})).unwrap_err().contains("command"));
        assert!(exec_spec(&json!({"Cmd": ["x"], "Privileged": true})).unwrap_err().contains("Privileged"));
        assert!(exec_spec(&json!({"Cmd": ["x"], "Env": ["=x"]})).unwrap_err().contains("environment"));
        assert!(exec_spec(&json!({"Cmd": ["x"], "DetachKeys": "ctrl-"})).is_err());
        assert!(exec_spec(&json!({"Cmd": ["x"], "detachKeys": "ctrl-"})).is_err());
        assert_eq!(exec_spec(&json!({"Cmd": ["x"], "detachKeys": "ctrl-p"})).unwrap().detach_keys, "ctrl-p");
        assert!(exec_spec(&json!({"Cmd": ["x"], "User": "a b"})).is_err());
        assert!(exec_spec(&json!([1])).is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_exec_bodies_never_panic(s in ".{0,120}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = exec_spec(&v);
            }
        }
    }
}
