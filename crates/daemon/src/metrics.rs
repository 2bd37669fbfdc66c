// SPDX-License-Identifier: Apache-2.0
//! `GET /metrics` in the Prometheus text format, served with hyper on a thread of its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::Error;

/// Serves the target's metrics on `addr` (bound before this returns, so a taken address is
/// reported to the caller).
pub(crate) fn serve(addr: SocketAddr, metrics: Arc<insitu_nvmf::Metrics>) -> Result<(), Error> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| format!("metrics on {addr}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| format!("metrics on {addr}: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().map_err(|e| format!("metrics on {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let metrics = metrics.clone();
                    tokio::task::spawn(async move {
                        let service = hyper::service::service_fn(move |req| answer(req, metrics.clone()));
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            })
        })
        .map_err(|e| format!("metrics on {addr}: {e}"))?;
    Ok(())
}

/// Only `GET /metrics` exists (with or without a query).
async fn answer(req: Request<Incoming>, metrics: Arc<insitu_nvmf::Metrics>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = if req.method() == Method::GET && req.uri().path() == "/metrics" {
        (StatusCode::OK, metrics.render())
    } else {
        (StatusCode::NOT_FOUND, "only GET /metrics is served\n".to_string())
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"));
    Ok(r)
}
