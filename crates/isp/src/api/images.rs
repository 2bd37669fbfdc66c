// SPDX-License-Identifier: Apache-2.0
//! `/images/...`: pull (with docker's JSON progress), load, list, inspect, remove.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::Arc;

use super::body::{error, json, stream, ApiBody};
use super::Target;
use crate::image::{Image, Progress, Removed};
use crate::runtime::Runtime;

/// Largest image tarball `docker load` accepts.
pub(crate) const MAX_LOAD: u64 = 8 << 30;

fn short(digest: &str) -> String {
    digest.trim_start_matches("sha256:").chars().take(12).collect()
}

pub(crate) fn line(v: Value) -> Bytes {
    let mut s = v.to_string();
    s.push_str("\r\n");
    Bytes::from(s)
}

fn progress_json(p: &Progress) -> Value {
    match p {
        Progress::Resolving { reference } => json!({"status": format!("Pulling from {reference}")}),
        Progress::Downloading { digest, current, total } => json!({
            "status": "Downloading", "id": short(digest), "progressDetail": {"current": current, "total": total},
            "progress": format!("{:>7} / {}", human(*current), human(*total)),
        }),
        Progress::Extracting { digest } => json!({"status": "Extracting", "id": short(digest)}),
        Progress::LayerDone { digest } => json!({"status": "Pull complete", "id": short(digest)}),
        Progress::AlreadyExists { digest } => json!({"status": "Already exists", "id": short(digest)}),
        Progress::Done { id, reference } => json!({"status": format!("Status: Downloaded image {reference} ({})", short(id))}),
    }
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1}MB", b as f64 / 1e6)
    } else {
        format!("{:.1}kB", b as f64 / 1e3)
    }
}

/// `POST /images/create?fromImage=NAME&tag=TAG` (pull) or `?fromSrc=-` (import).
pub async fn create(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    if t.get("fromSrc").is_some() {
        return super::image_io::import(rt, t, req).await;
    }
    pull(rt, t)
}

/// `POST /images/create?fromImage=NAME&tag=TAG`.
pub fn pull(rt: &Arc<Runtime>, t: &Target) -> Response<ApiBody> {
    let Some(from) = t.get("fromImage") else {
        return error(400, "give fromImage=NAME to pull, or fromSrc=- to import an archive");
    };
    if let Err(m) = t.platform() {
        return error(400, &m);
    }
    let reference = pull_reference(from, t.get("tag"));
    let (resp, tx) = stream(StatusCode::OK, "application/json");
    let images = rt.images().clone();
    let rt2 = rt.clone();
    tokio::task::spawn_blocking(move || {
        let events = rt2.events();
        let send = |v: Value| {
            let _ = tx.blocking_send(line(v));
        };
        match images.pull(&reference, &mut |p| send(progress_json(&p))) {
            Ok(img) => {
                events.emit("image", "pull", &reference, [("name".to_string(), reference.clone())].into());
                if let Some(d) = img.repo_digests.first() {
                    send(json!({"status": format!("Digest: {}", d.rsplit('@').next().unwrap_or(d))}));
                }
            }
            Err(e) => {
                let m = e.to_string();
                send(json!({"errorDetail": {"message": m}, "error": m}));
            }
        }
    });
    resp
}

/// The reference a pull names: `fromImage`, with `tag` appended as a tag or a digest
/// unless `fromImage` already pins one (the store parses the result).
pub(crate) fn pull_reference(from: &str, tag: Option<&str>) -> String {
    match tag {
        Some(tag) if tag.starts_with("sha256:") => format!("{from}@{tag}"),
        Some(tag) if !from.contains('@') && !last_has_tag(from) => format!("{from}:{tag}"),
        _ => from.to_string(),
    }
}

fn last_has_tag(name: &str) -> bool {
    name.rsplit('/').next().is_some_and(|last| last.contains(':'))
}

/// `POST /images/load`: the tarball is spooled to the private namespace, then loaded.
pub async fn load(rt: &Arc<Runtime>, req: Request<Incoming>) -> Response<ApiBody> {
    let (file, path, _) = match spool_request(rt, req, "the image").await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    drop(file);
    let images = rt.images().clone();
    let result = tokio::task::spawn_blocking(move || {
        let r = std::fs::File::open(&path).map_err(|e| e.to_string()).and_then(|mut f| images.load(&mut f, &mut |_| {}).map_err(|e| e.to_string()));
        let _ = std::fs::remove_file(&path);
        r
    })
    .await;
    match result {
        Ok(Ok(tags)) => {
            for t in &tags {
                rt.events().emit("image", "load", t, [("name".to_string(), t.clone())].into());
            }
            let (resp, tx) = stream(StatusCode::OK, "application/json");
            tokio::spawn(async move {
                for t in tags {
                    let what = if t.starts_with("sha256:") { "Loaded image ID" } else { "Loaded image" };
                    let _ = tx.send(line(json!({"stream": format!("{what}: {t}\n")}))).await;
                }
            });
            resp
        }
        // The upload was taken: as Docker's, what went wrong with its content is told in
        // the progress stream (clients read the error there), not as a status.
        Ok(Err(m)) => {
            let (resp, tx) = stream(StatusCode::OK, "application/json");
            tokio::spawn(async move {
                let _ = tx.send(line(json!({"errorDetail": {"message": m}, "error": m}))).await;
            });
            resp
        }
        Err(e) => error(500, &e.to_string()),
    }
}

/// Spools a request's body (at most [`MAX_LOAD`] bytes) to a file of the private
/// namespace: the open file, its path and length; a response naming `what` when the upload
/// breaks off or does not fit (nothing is left behind then).
pub(crate) async fn spool_request(rt: &Runtime, req: Request<Incoming>, what: &str) -> Result<(std::fs::File, std::path::PathBuf, u64), Response<ApiBody>> {
    let (mut file, path) = tempfile_in(rt).map_err(|e| error(500, &format!("cannot spool {what}: {e}")))?;
    let mut body = req.into_body();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            let _ = std::fs::remove_file(&path);
            return Err(error(400, &format!("the upload of {what} broke off")));
        };
        if let Some(d) = frame.data_ref() {
            total += d.len() as u64;
            if total > MAX_LOAD || file.write_all(d).is_err() {
                let _ = std::fs::remove_file(&path);
                return Err(error(413, &format!("{what} is larger than {MAX_LOAD} bytes or the private namespace is full")));
            }
        }
    }
    Ok((file, path, total))
}

pub(crate) fn tempfile_in(rt: &Runtime) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
    // In the private namespace: the host never sees an image on its way in.
    let dir = rt.spool_dir();
    std::fs::create_dir_all(&dir)?;
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let path = dir.join(format!("insitu-load-{}-{n}.tar", std::process::id()));
    Ok((std::fs::OpenOptions::new().create_new(true).write(true).open(&path)?, path))
}

fn summary(i: &Image) -> Value {
    json!({
        "Id": i.id, "ParentId": i.parent, "RepoTags": i.repo_tags, "RepoDigests": i.repo_digests, "Created": i.created,
        "Size": i.size, "VirtualSize": i.size, "SharedSize": -1, "Labels": i.config.labels, "Containers": -1,
    })
}

/// `GET /images/json?filters=...`: `reference`, `dangling`, `label`, `before`, `since`
/// (see [`super::filters`]); `all` lists the same (the store keeps no intermediate images).
pub fn list(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match super::filters::Filters::parse(t.get("filters")) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    if let Err(m) = f.only(&["reference", "dangling", "label", "before", "since"]) {
        return error(400, &m);
    }
    let all = match rt.images().list() {
        Ok(l) => l,
        Err(e) => return error(e.http_status(), &e.to_string()),
    };
    // before/since name an image: those created before or after it.
    let mut bounds = Vec::new();
    for (k, newer) in [("before", false), ("since", true)] {
        for name in f.values(k) {
            match rt.images().get(name) {
                Ok(i) => bounds.push((i.created, i.id.clone(), newer)),
                Err(e) => return error(e.http_status(), &e.to_string()),
            }
        }
    }
    let dangling = match f.bool("dangling") {
        Ok(d) => d,
        Err(m) => return error(400, &m),
    };
    let mut out = Vec::new();
    for i in all {
        if dangling.is_some_and(|d| d != i.repo_tags.is_empty()) {
            continue;
        }
        if !f.labels_match("label", &i.config.labels) {
            continue;
        }
        if bounds.iter().any(|(at, id, newer)| *id == i.id || if *newer { i.created <= *at } else { i.created >= *at }) {
            continue;
        }
        let refs = f.values("reference");
        let mut shown = i.clone();
        if !refs.is_empty() {
            // As Docker: an image is listed with the tags that match.
            shown.repo_tags.retain(|tag| refs.iter().any(|r| super::filters::reference_matches(r, tag)));
            if shown.repo_tags.is_empty() {
                continue;
            }
        }
        out.push(summary(&shown));
    }
    json(StatusCode::OK, &Value::Array(out))
}

/// `POST /images/prune?filters=...`: removes images no container uses: those without a
/// tag (`dangling=true`, the default), or every unused one (`dangling=false`); filters
/// `label`, `label!`, `until` narrow it.
pub fn prune(rt: &Runtime, t: &Target) -> Response<ApiBody> {
    let f = match super::filters::Filters::parse(t.get("filters")).and_then(|f| f.only(&["dangling", "label", "label!", "until"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let dangling_only = match f.bool("dangling") {
        Ok(d) => d.unwrap_or(true),
        Err(m) => return error(400, &m),
    };
    let mut until = None;
    for u in f.values("until") {
        match crate::runtime::log::parse_time(u) {
            Ok(t) => until = Some(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)),
            Err(m) => return error(400, &format!("until: {m}")),
        }
    }
    let all = match rt.images().list() {
        Ok(l) => l,
        Err(e) => return error(e.http_status(), &e.to_string()),
    };
    let mut done = Vec::new();
    let mut space = 0u64;
    for i in all {
        if (dangling_only && !i.repo_tags.is_empty())
            || rt.image_in_use(&i.id)
            || !f.labels_match("label", &i.config.labels)
            || until.is_some_and(|u| i.created > u)
        {
            continue;
        }
        if let Ok(removed) = rt.images().remove(&i.id, true, &|id| rt.image_in_use(id)) {
            space += i.size;
            done.extend(removed.iter().map(|r| match r {
                Removed::Untagged(t) => json!({"Untagged": t}),
                Removed::Deleted(d) => json!({"Deleted": d}),
            }));
        }
    }
    json(StatusCode::OK, &json!({"ImagesDeleted": if done.is_empty() { Value::Null } else { Value::Array(done) }, "SpaceReclaimed": space}))
}

/// `POST /images/{name}/tag?repo=REPO&tag=TAG`.
pub fn tag(rt: &Runtime, name: &str, t: &Target) -> Response<ApiBody> {
    let Some(repo) = t.get("repo") else { return error(400, "give repo=NAME (and tag=TAG)") };
    match rt.images().tag(name, repo, t.get("tag")) {
        Ok(full) => {
            let id = rt.images().get(&full).map(|i| i.id).unwrap_or_default();
            rt.events().emit("image", "tag", &id, [("name".to_string(), full)].into());
            super::body::empty(StatusCode::CREATED)
        }
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}

/// `GET /images/{name}/history`: the layers' history from the image's configuration,
/// newest first; the top entry carries the image's id and tags.
pub fn history(rt: &Runtime, name: &str) -> Response<ApiBody> {
    let (img, doc) = match rt.images().get(name).and_then(|i| rt.images().config_document(name).map(|d| (i, d))) {
        Ok(x) => x,
        Err(e) => return error(e.http_status(), &e.to_string()),
    };
    let sizes: Vec<u64> = img.layers.iter().map(|p| crate::image::layer_size(p)).collect();
    let mut layer = 0;
    let mut rows: Vec<Value> = Vec::new();
    let hist = doc.get("history").and_then(Value::as_array).cloned().unwrap_or_default();
    for h in &hist {
        let empty = h.get("empty_layer").and_then(Value::as_bool).unwrap_or(false);
        let size = if empty {
            0
        } else {
            layer += 1;
            sizes.get(layer - 1).copied().unwrap_or(0)
        };
        rows.push(json!({
            "Id": "<missing>", "Created": h.get("created").and_then(Value::as_str).map(crate::image::manifest::parse_time).unwrap_or(0),
            "CreatedBy": h.get("created_by").and_then(Value::as_str).unwrap_or(""), "Tags": null, "Size": size,
            "Comment": h.get("comment").and_then(Value::as_str).unwrap_or(""),
        }));
    }
    if rows.is_empty() {
        // An image without history: one row per layer.
        rows = sizes.iter().map(|s| json!({"Id": "<missing>", "Created": img.created, "CreatedBy": "", "Tags": null, "Size": s, "Comment": ""})).collect();
    }
    rows.reverse();
    if let Some(top) = rows.first_mut() {
        top["Id"] = json!(img.id);
        top["Tags"] = json!(img.repo_tags);
    }
    // As moby walks the parent chain: a committed image's rows below its own top are its
    // parent's, whose top row carries the parent's id and tags (and so on down).
    let mut parent = img.parent.clone();
    let mut seen = vec![img.id.clone()];
    while let Ok(p) = rt.images().get(&parent) {
        if seen.contains(&p.id) {
            break;
        }
        let own = rt.images().config_document(&p.id).ok().and_then(|d| d["history"].as_array().map(Vec::len)).filter(|&n| n > 0).unwrap_or(p.layers.len());
        let Some(row) = rows.len().checked_sub(own).and_then(|i| rows.get_mut(i)) else { break };
        row["Id"] = json!(p.id);
        row["Tags"] = json!(p.repo_tags);
        seen.push(p.id.clone());
        parent = p.parent.clone();
    }
    json(StatusCode::OK, &Value::Array(rows))
}

/// `GET /images/{name}/json`.
pub fn inspect(rt: &Runtime, name: &str) -> Response<ApiBody> {
    match rt.images().get(name) {
        Ok(i) => {
            let doc = rt.images().config_document(&i.id).unwrap_or_default();
            let created = rfc3339(i.created);
            let mut cfg = json!({
                "Env": i.config.env, "Cmd": i.config.cmd, "Entrypoint": i.config.entrypoint, "WorkingDir": i.config.working_dir,
                "User": i.config.user, "Labels": i.config.labels,
            });
            // The rest of the image's configuration (ports, volumes, stop signal) as stored.
            for (k, v) in doc["config"].as_object().into_iter().flatten() {
                if cfg.get(k).is_none() && !v.is_null() {
                    cfg[k] = v.clone();
                }
            }
            json(
                StatusCode::OK,
                &json!({
                    "Id": i.id, "RepoTags": i.repo_tags, "RepoDigests": i.repo_digests, "Parent": i.parent, "Comment": doc["comment"].as_str().unwrap_or(""),
                    "Created": created, "DockerVersion": "", "Author": doc["author"].as_str().unwrap_or(""), "Config": cfg, "Architecture": i.architecture,
                    "Os": i.os, "Size": i.size, "VirtualSize": i.size,
                    "GraphDriver": {"Name": "overlay", "Data": null},
                    "RootFS": {"Type": "layers", "Layers": i.diff_ids}, "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
                }),
            )
        }
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}

/// `DELETE /images/{name}`.
pub fn remove(rt: &Runtime, name: &str, force: bool) -> Response<ApiBody> {
    match rt.images().remove(name, force, &|id| rt.image_in_use(id)) {
        Ok(done) => {
            for r in &done {
                if let Removed::Untagged(t) = r {
                    rt.events().emit("image", "untag", t, [("name".to_string(), t.clone())].into());
                }
            }
            // The first deletion is the image's; those after it are its layers.
            if let Some(Removed::Deleted(d)) = done.iter().find(|r| matches!(r, Removed::Deleted(_))) {
                rt.events().emit("image", "delete", d, [("name".to_string(), d.clone())].into());
            }
            json(
                StatusCode::OK,
                &Value::Array(
                    done.iter()
                        .map(|r| match r {
                            Removed::Untagged(t) => json!({"Untagged": t}),
                            Removed::Deleted(d) => json!({"Deleted": d}),
                        })
                        .collect(),
                ),
            )
        }
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}

/// Seconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
