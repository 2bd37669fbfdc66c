// SPDX-License-Identifier: Apache-2.0
//! Response bodies: whole (JSON, errors) or streamed from a channel (pull progress, logs,
//! `wait`, whose headers must reach the client before the container even starts).

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::{Body, Frame};
use hyper::{Response, StatusCode};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// The body type of every response.
pub type ApiBody = BoxBody<Bytes, Infallible>;

/// A body fed by a channel; it ends when every sender is gone.
pub struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// A streamed response and the sender that feeds it.
pub fn stream(status: StatusCode, content_type: &str) -> (Response<ApiBody>, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(64);
    let r = Response::builder().status(status).header("Content-Type", content_type).body(ChannelBody(rx).boxed()).expect("static response parts");
    (r, tx)
}

/// A JSON response.
pub fn json(status: StatusCode, v: &serde_json::Value) -> Response<ApiBody> {
    Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("static response parts")
}

/// The Docker API's error form: `{"message": ...}` with a real status code.
pub fn error(status: u16, message: &str) -> Response<ApiBody> {
    json(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &serde_json::json!({ "message": message }))
}

/// An empty response (204, 304).
pub fn empty(status: StatusCode) -> Response<ApiBody> {
    Response::builder().status(status).body(Empty::new().boxed()).expect("static response parts")
}
