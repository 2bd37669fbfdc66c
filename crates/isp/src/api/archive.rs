// SPDX-License-Identifier: Apache-2.0
//! `docker cp`: `HEAD`/`GET`/`PUT /containers/{id}/archive?path=PATH` (see
//! [`crate::runtime::archive`]). The path's description travels in the
//! `X-Docker-Container-Path-Stat` header, base64 of JSON, as clients expect.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::io::{Read, Write};
use std::sync::Arc;

use super::body::{error, stream, ApiBody};
use super::Target;
use crate::runtime::archive::PathStat;
use crate::runtime::{Runtime, RuntimeError};

/// Largest archive `PUT` accepts.
const MAX_PUT: u64 = 8 << 30;
const STAT_HEADER: &str = "X-Docker-Container-Path-Stat";

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

/// Standard base64 with padding.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn stat_value(s: &PathStat) -> String {
    base64(s.to_json().to_string().as_bytes())
}

fn path_of(t: &Target) -> Result<String, String> {
    t.get("path").map(str::to_string).ok_or_else(|| "give path=PATH (a path in the container)".to_string())
}

/// `HEAD /containers/{id}/archive?path=`.
pub fn head(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let path = match path_of(t) {
        Ok(p) => p,
        Err(m) => return error(400, &m),
    };
    match rt.archive_stat(id, &path) {
        Ok(s) => Response::builder()
            .status(StatusCode::OK)
            .header(STAT_HEADER, stat_value(&s))
            .body(http_body_util::Empty::new().boxed())
            .expect("static response parts"),
        Err(e) => fail(e),
    }
}

/// `GET /containers/{id}/archive?path=`: the tar archive, spooled in the private
/// namespace first (so an error is a status, not a broken stream), then streamed.
pub async fn get(rt: &Arc<Runtime>, id: &str, t: &Target) -> Response<ApiBody> {
    let path = match path_of(t) {
        Ok(p) => p,
        Err(m) => return error(400, &m),
    };
    let (rt2, id2) = (rt.clone(), id.to_string());
    let made = tokio::task::spawn_blocking(move || {
        let (mut f, spool) = spool_file(&rt2).map_err(|e| RuntimeError::Setup(format!("cannot spool the archive: {e}")))?;
        let r = rt2.archive_get(&id2, &path, &mut f);
        if r.is_err() {
            let _ = std::fs::remove_file(&spool);
        }
        r.map(|s| (s, spool))
    })
    .await;
    let (stat, spool) = match made {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return fail(e),
        Err(e) => return error(500, &e.to_string()),
    };
    let mut resp = stream_file(spool);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&stat_value(&stat)) {
        resp.headers_mut().insert(STAT_HEADER, v);
    }
    resp
}

/// `GET /containers/{id}/export`: the container's root file system as a tar archive
/// (its image's layers with its own changes; binds are not part of it).
pub async fn export(rt: &Arc<Runtime>, id: &str) -> Response<ApiBody> {
    let (rt2, id2) = (rt.clone(), id.to_string());
    let made = tokio::task::spawn_blocking(move || {
        let (mut f, spool) = spool_file(&rt2).map_err(|e| RuntimeError::Setup(format!("cannot spool the archive: {e}")))?;
        let r = rt2.export(&id2, &mut f);
        if r.is_err() {
            let _ = std::fs::remove_file(&spool);
        }
        r.map(|_| spool)
    })
    .await;
    match made {
        Ok(Ok(spool)) => stream_file(spool),
        Ok(Err(e)) => fail(e),
        Err(e) => error(500, &e.to_string()),
    }
}

/// Streams a spooled file as the response body, unlinked as soon as it is open.
fn stream_file(spool: std::path::PathBuf) -> Response<ApiBody> {
    let (resp, tx) = stream(StatusCode::OK, "application/x-tar");
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&spool);
        let _ = std::fs::remove_file(&spool);
        let Ok(mut f) = f else { return };
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                        return;
                    }
                }
            }
        }
    });
    resp
}

fn spool_file(rt: &Runtime) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
    let dir = rt.spool_dir();
    std::fs::create_dir_all(&dir)?;
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let path = dir.join(format!("insitu-cp-{}-{n}.tar", std::process::id()));
    Ok((std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path)?, path))
}

/// `PUT /containers/{id}/archive?path=DIR&noOverwriteDirNonDir=1`: the body, a tar
/// archive, is spooled, checked whole, then unpacked into `DIR`.
pub async fn put(rt: &Arc<Runtime>, id: &str, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let path = match path_of(t) {
        Ok(p) => p,
        Err(m) => return error(400, &m),
    };
    if let Err(e) = rt.get(id) {
        return fail(e);
    }
    let (mut file, spool) = match spool_file(rt) {
        Ok(x) => x,
        Err(e) => return error(500, &format!("cannot spool the archive: {e}")),
    };
    let mut body = req.into_body();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            let _ = std::fs::remove_file(&spool);
            return error(400, "the archive upload broke off");
        };
        if let Some(d) = frame.data_ref() {
            total += d.len() as u64;
            if total > MAX_PUT || file.write_all(d).is_err() {
                let _ = std::fs::remove_file(&spool);
                return error(413, &format!("the archive is larger than {MAX_PUT} bytes or the private namespace is full"));
            }
        }
    }
    drop(file);
    let no_overwrite = t.flag("noOverwriteDirNonDir");
    let (rt2, id2) = (rt.clone(), id.to_string());
    let done = tokio::task::spawn_blocking(move || {
        let r = rt2.archive_put(&id2, &path, &spool, no_overwrite);
        let _ = std::fs::remove_file(&spool);
        r
    })
    .await;
    match done {
        Ok(Ok(())) => super::body::empty(StatusCode::OK),
        Ok(Err(e)) => fail(e),
        Err(e) => error(500, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_of_known_strings() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
