// SPDX-License-Identifier: Apache-2.0
//! Images in and out as archives and from containers: `docker import` (`fromSrc`),
//! `docker save` (`/images/{name}/get`, `/images/get`) and `docker commit`.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use std::sync::Arc;

use super::body::{error, json, stream, ApiBody};
use super::images::{line, tempfile_in};
use super::Target;
use crate::runtime::Runtime;

/// `POST /images/create?fromSrc=-&repo=R&tag=T&changes=...&message=M`: `docker import`, a
/// root file system archive (tar, or gzip-compressed tar) in the body becomes a one-layer
/// image. Importing from a URL is refused: a drive fetches nothing from the internet.
pub(crate) async fn import(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    if t.get("fromSrc") != Some("-") {
        return error(400, "importing from a URL is not supported on this target: send the archive in the request (fromSrc=-)");
    }
    let changes: Vec<String> = all_of(req.uri().query(), "changes").iter().flat_map(|c| c.lines().map(str::to_string).collect::<Vec<_>>()).collect();
    let reference = match (t.get("repo"), t.get("tag")) {
        (Some(r), Some(tag)) => Some(format!("{r}:{tag}")),
        (Some(r), None) => Some(r.to_string()),
        _ => None,
    };
    let (file, path, _) = match super::images::spool_request(rt, req, "the archive").await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    drop(file);
    let mut cfg = json!({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]});
    for line in changes.iter().filter(|l| !l.trim().is_empty()) {
        if let Err(m) = crate::runtime::commit::apply_change(&mut cfg, line) {
            let _ = std::fs::remove_file(&path);
            return error(400, &m);
        }
    }
    let now = crate::runtime::log::timestamp(std::time::SystemTime::now());
    let comment = t.get("message").unwrap_or("").to_string();
    let doc = json!({"architecture": std::env::consts::ARCH.replace("x86_64", "amd64"), "os": "linux", "created": now, "config": cfg,
                     "comment": comment, "history": [{"created": now, "created_by": "import", "comment": comment}]});
    let (rt2, events) = (rt.clone(), rt.clone());
    let made = tokio::task::spawn_blocking(move || {
        let r = plain_tar(&path).and_then(|plain| {
            let r = rt2.images().derive(None, &plain, doc, reference.as_deref()).map_err(|e| (e.http_status(), e.to_string()));
            if plain != path {
                let _ = std::fs::remove_file(&plain);
            }
            r
        });
        let _ = std::fs::remove_file(&path);
        r
    })
    .await;
    match made {
        Ok(Ok(id)) => {
            events.events().emit("image", "import", &id, [("name".to_string(), id.clone())].into());
            let (resp, tx) = stream(StatusCode::OK, "application/json");
            tokio::spawn(async move {
                let _ = tx.send(line(json!({"status": id}))).await;
            });
            resp
        }
        // As load: the upload was taken; what was wrong with it is told in the stream.
        Ok(Err((_, m))) => {
            let (resp, tx) = stream(StatusCode::OK, "application/json");
            tokio::spawn(async move {
                let _ = tx.send(line(json!({"errorDetail": {"message": m}, "error": m}))).await;
            });
            resp
        }
        Err(e) => error(500, &e.to_string()),
    }
}

/// The archive at `path` uncompressed (itself when it is a plain tar): a layer's diff id
/// is the digest of the uncompressed archive.
fn plain_tar(path: &std::path::Path) -> Result<std::path::PathBuf, (u16, String)> {
    let mut f = std::fs::File::open(path).map_err(|e| (500, e.to_string()))?;
    let mut magic = [0u8; 2];
    let n = std::io::Read::read(&mut f, &mut magic).map_err(|e| (500, e.to_string()))?;
    if n < 2 || magic != [0x1f, 0x8b] {
        return Ok(path.to_path_buf());
    }
    let out = path.with_extension("plain.tar");
    let mut dec = flate2::read::GzDecoder::new(std::fs::File::open(path).map_err(|e| (500, e.to_string()))?);
    let mut w = std::fs::File::create(&out).map_err(|e| (500, e.to_string()))?;
    if let Err(e) = std::io::copy(&mut dec, &mut w) {
        let _ = std::fs::remove_file(&out);
        return Err((400, format!("the archive is not a valid gzip stream: {e}")));
    }
    Ok(out)
}

/// `GET /images/{name}/get` and `GET /images/get?names=A&names=B`: a `docker save`
/// archive (see [`crate::image::ImageStore::save`]), spooled in the private namespace
/// first so that an error is a status, then streamed.
pub async fn save(rt: &Arc<Runtime>, names: Vec<String>) -> Response<ApiBody> {
    if names.is_empty() {
        return error(400, "give the images to save: names=NAME (repeatable)");
    }
    let rt2 = rt.clone();
    let made = tokio::task::spawn_blocking(move || {
        let (f, path) = tempfile_in(&rt2).map_err(|e| (500, format!("cannot spool the archive: {e}")))?;
        match rt2.images().save(&names, std::io::BufWriter::new(f)) {
            Ok(()) => Ok(path),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err((e.http_status(), e.to_string()))
            }
        }
    })
    .await;
    let path = match made {
        Ok(Ok(p)) => p,
        Ok(Err((status, m))) => return error(status, &m),
        Err(e) => return error(500, &e.to_string()),
    };
    let (resp, tx) = stream(StatusCode::OK, "application/x-tar");
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&path);
        // Unlinked at once: the open file is read to its end, nothing is left behind.
        let _ = std::fs::remove_file(&path);
        let Ok(mut f) = f else { return };
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match std::io::Read::read(&mut f, &mut buf) {
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

/// The `names` of `GET /images/get`, each of them (the parameter repeats).
pub(crate) fn names_of(raw_query: Option<&str>) -> Vec<String> {
    all_of(raw_query, "names")
}

/// Every value of the query parameter `key` (which may repeat).
pub(crate) fn all_of(raw_query: Option<&str>, key: &str) -> Vec<String> {
    raw_query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, v)| urlencoding::decode(&v.replace('+', " ")).ok().map(|s| s.into_owned()))
        .filter(|s| !s.is_empty())
        .collect()
}

/// `POST /commit?container=ID&repo=R&tag=T&comment=C&author=A&pause=1&changes=...`, the
/// body a container configuration to set: a new image of the container's changes.
pub async fn commit(rt: &Runtime, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let changes: Vec<String> = all_of(req.uri().query(), "changes").iter().flat_map(|c| c.lines().map(str::to_string).collect::<Vec<_>>()).collect();
    let body = match super::read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(container) = t.get("container") else { return error(400, "give container=ID (the container to commit)") };
    let reference = match (t.get("repo"), t.get("tag")) {
        (Some(r), Some(tag)) => Some(format!("{r}:{tag}")),
        (Some(r), None) => Some(r.to_string()),
        (None, Some(_)) => return error(400, "a tag needs a repo: give repo=NAME"),
        (None, None) => None,
    };
    let spec = crate::runtime::commit::CommitSpec {
        reference,
        comment: t.get("comment").unwrap_or("").to_string(),
        author: t.get("author").unwrap_or("").to_string(),
        changes,
        config: body,
        pause: t.get("pause").is_none_or(|p| matches!(p, "1" | "true" | "True")),
    };
    match rt.commit(container, spec).await {
        Ok(id) => json(StatusCode::CREATED, &json!({"Id": id})),
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}
