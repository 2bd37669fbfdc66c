// SPDX-License-Identifier: Apache-2.0
//! `GET /containers/{id}/attach/ws`: attach over a websocket, as Docker serves it to
//! clients that cannot hijack a connection (browsers, the Python SDK's `ws=True`).
//!
//! The handshake is RFC 6455's (tokio-tungstenite derives the accept key and frames the
//! messages). As Docker's, the streams are not multiplexed: each piece of the container's
//! output (and, with `logs`, of its log first) is one message, binary from API 1.42 on and
//! text before; each message the client sends is written to the container's standard
//! input when `stdin` is asked for. The server closes the socket when the output ends
//! (the run ends, or at once without `stream`).

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::body::{error, ApiBody};
use super::containers::fail;
use super::detach::ParkedStdins;
use super::streams::StdinLease;
use super::Target;
use crate::runtime::{log, Runtime, STDERR, STDOUT};

/// The websocket handshake's key, when `req` asks for a websocket (version 13).
fn handshake_key(req: &Request<Incoming>) -> Result<String, String> {
    let h = |k: &str| req.headers().get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !h("Upgrade").eq_ignore_ascii_case("websocket") || !h("Connection").to_ascii_lowercase().contains("upgrade") {
        return Err("attach/ws needs a websocket handshake (Connection: Upgrade, Upgrade: websocket); use POST /containers/{id}/attach otherwise".into());
    }
    if h("Sec-WebSocket-Version") != "13" {
        return Err(format!("websocket version {:?} is not supported: 13 only", h("Sec-WebSocket-Version")));
    }
    match h("Sec-WebSocket-Key") {
        "" => Err("the websocket handshake has no Sec-WebSocket-Key".into()),
        k => Ok(k.to_string()),
    }
}

/// `GET /containers/{id}/attach/ws?logs=&stream=&stdin=&stdout=&stderr=`.
pub fn attach_ws(rt: &Runtime, parked: &Arc<ParkedStdins>, id: &str, t: &Target, mut req: Request<Incoming>) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let key = match handshake_key(&req) {
        Ok(k) => k,
        Err(m) => return error(400, &m),
    };
    let (want_out, want_err, want_in) = (t.flag("stdout"), t.flag("stderr"), t.flag("stdin"));
    let (replay_logs, carry) = (t.flag("logs"), t.flag("stream"));
    let tty = c.spec.tty;
    let exits = c.exits();
    let exits_before = exits.borrow().exits;
    let (len, out) = if carry { c.log_and_subscribe(true) } else { (u64::MAX, None) };
    let filter = log::Filter { stdout: want_out, stderr: want_err, ..Default::default() };
    let replay = if replay_logs { filter.apply(c.log_records(len)) } else { Vec::new() };
    let stdin = if want_in && carry { c.take_stdin().or_else(|| if tty { parked.take(&c.id) } else { None }) } else { None };
    let lease = stdin.map(|tx| StdinLease { tx: Some(tx), park: tty.then(|| (parked.clone(), c.id.clone(), exits, exits_before)) });
    let binary = t.at_least(1, 42);
    let message = move |b: Bytes| if binary { Message::Binary(b) } else { Message::Text(String::from_utf8_lossy(&b).into_owned().into()) };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let (mut sink, mut source) = ws.split();
        let input = tokio::spawn(async move {
            let lease = lease;
            while let Some(Ok(m)) = source.next().await {
                let data = match m {
                    Message::Binary(b) => b,
                    Message::Text(t) => Bytes::from(t.as_str().to_owned()),
                    Message::Close(_) => break,
                    _ => continue,
                };
                if let Some(tx) = lease.as_ref().and_then(|l| l.tx.as_ref()) {
                    if tx.send(data).is_err() {
                        break;
                    }
                }
            }
        });
        let output = async {
            for r in replay {
                sink.send(message(Bytes::from(r.line))).await?;
            }
            let Some(mut out) = out else { return Ok(()) };
            while let Some((s, data)) = out.recv().await {
                if (s == STDOUT && want_out) || (s == STDERR && want_err) {
                    sink.send(message(data)).await?;
                }
            }
            Ok::<(), tokio_tungstenite::tungstenite::Error>(())
        };
        let _ = output.await;
        let _ = sink.send(Message::Close(None)).await;
        let _ = sink.close().await;
        input.abort();
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Accept", derive_accept_key(key.as_bytes()))
        .body(http_body_util::BodyExt::boxed(http_body_util::Empty::new()))
        .expect("static response parts")
}
