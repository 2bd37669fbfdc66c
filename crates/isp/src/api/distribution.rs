// SPDX-License-Identifier: Apache-2.0
//! `POST /images/{name}/push` and `GET /images/search`: the image store and the target's
//! registries, with the credentials of `X-Registry-Auth`.

use base64::Engine;
use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;

use super::body::{error, json, stream, ApiBody};
use super::images::line;
use super::Target;
use crate::image::{Credentials, PushProgress};
use crate::runtime::Runtime;

/// Largest `X-Registry-Auth` header read.
const MAX_AUTH: usize = 16 << 10;

/// The credentials of an `X-Registry-Auth` header: base64 (URL-safe or standard, padded
/// or not) of `{"username", "password", ...}`; none for an absent or empty one (`{}`).
pub(crate) fn registry_auth(headers: &HeaderMap) -> Result<Option<Credentials>, String> {
    let Some(raw) = headers.get("X-Registry-Auth") else { return Ok(None) };
    let raw = raw.to_str().map_err(|_| "X-Registry-Auth: not ASCII".to_string())?.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    if raw.len() > MAX_AUTH {
        return Err(format!("X-Registry-Auth: longer than {MAX_AUTH} bytes"));
    }
    let cfg = base64::engine::GeneralPurposeConfig::new().with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent);
    let bytes = [base64::alphabet::URL_SAFE, base64::alphabet::STANDARD]
        .iter()
        .find_map(|a| base64::engine::GeneralPurpose::new(a, cfg).decode(raw).ok())
        .ok_or("X-Registry-Auth: not base64 (give base64 of {\"username\": ..., \"password\": ...})")?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("X-Registry-Auth: malformed JSON: {e}"))?;
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    if !field("identitytoken").is_empty() || !field("registrytoken").is_empty() {
        return Err("X-Registry-Auth: identity and registry tokens are not supported; give username and password".into());
    }
    let (username, password) = (field("username"), field("password"));
    if username.is_empty() && password.is_empty() {
        return Ok(None);
    }
    Ok(Some(Credentials { username, password }))
}

fn push_json(p: &PushProgress) -> Value {
    match p {
        PushProgress::Repository(r) => json!({"status": format!("The push refers to repository [{r}]")}),
        PushProgress::LayerExists(id) => json!({"status": "Layer already exists", "progressDetail": {}, "id": id}),
        PushProgress::Pushing(id) => json!({"status": "Pushing", "progressDetail": {}, "id": id}),
        PushProgress::Pushed(id) => json!({"status": "Pushed", "progressDetail": {}, "id": id}),
        PushProgress::Done { tag, digest, size } => json!({"status": format!("{tag}: digest: {digest} size: {size}")}),
    }
}

/// `POST /images/{name}/push?tag=TAG`: progress in Docker's JSON stream, errors in it.
pub fn push(rt: &Arc<Runtime>, name: &str, t: &Target, headers: &HeaderMap) -> Response<ApiBody> {
    let credentials = match registry_auth(headers) {
        Ok(c) => c,
        Err(m) => return error(400, &m),
    };
    if let Err(m) = t.platform() {
        return error(400, &m);
    }
    let reference = match t.get("tag") {
        Some(tag) => super::images::pull_reference(name, Some(tag)),
        None => name.to_string(),
    };
    let (resp, tx) = stream(StatusCode::OK, "application/json");
    let rt = rt.clone();
    tokio::task::spawn_blocking(move || {
        let send = |v: Value| {
            let _ = tx.blocking_send(line(v));
        };
        let pushed = rt.images().push(&reference, credentials, &mut |p| {
            send(push_json(&p));
            if let PushProgress::Done { tag, digest, size } = &p {
                send(json!({"progressDetail": {}, "aux": {"Tag": tag, "Digest": digest, "Size": size}}));
            }
        });
        match pushed {
            Ok(()) => rt.events().emit("image", "push", &reference, [("name".to_string(), reference.clone())].into()),
            Err(e) => {
                let m = e.to_string();
                send(json!({"errorDetail": {"message": m}, "error": m}));
            }
        }
    });
    resp
}

/// Most results a search gives (Docker's bound).
const MAX_LIMIT: usize = 100;

/// `GET /images/search?term=T&limit=N&filters=...`: filters `is-official`,
/// `is-automated` (true/false) and `stars` (at least N).
pub async fn search(rt: &Arc<Runtime>, t: &Target, headers: &HeaderMap) -> Response<ApiBody> {
    let credentials = match registry_auth(headers) {
        Ok(c) => c,
        Err(m) => return error(400, &m),
    };
    let Some(term) = t.get("term").map(str::to_string) else { return error(400, "give term=WORD (or term=HOST:PORT/WORD) to search for") };
    let limit = match t.get("limit").map(str::parse::<usize>) {
        None => 25,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        _ => return error(400, &format!("limit {:?} is outside the range of [1, {MAX_LIMIT}]", t.get("limit").unwrap_or(""))),
    };
    let f = match super::filters::Filters::parse(t.get("filters")).and_then(|f| f.only(&["is-official", "is-automated", "stars"]).map(|_| f)) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    let (official, automated) = match (f.bool("is-official"), f.bool("is-automated")) {
        (Ok(o), Ok(a)) => (o, a),
        (Err(m), _) | (_, Err(m)) => return error(400, &m),
    };
    let mut min_stars = 0u64;
    for s in f.values("stars") {
        match s.parse::<u64>() {
            Ok(n) => min_stars = min_stars.max(n),
            Err(_) => return error(400, &format!("invalid filter 'stars={s}': give a whole number")),
        }
    }
    let images = rt.images().clone();
    // Filters narrow what the registry lists; the limit applies to what passes them.
    let found = tokio::task::spawn_blocking(move || images.search(&term, usize::MAX, credentials)).await;
    match found {
        Ok(Ok(hits)) => {
            let rows: Vec<Value> = hits
                .iter()
                .filter(|h| official.is_none_or(|o| o == h.official) && automated.is_none_or(|a| a == h.automated) && h.stars >= min_stars)
                .take(limit)
                .map(|h| json!({"name": h.name, "description": h.description, "star_count": h.stars, "is_official": h.official, "is_automated": h.automated}))
                .collect();
            json(StatusCode::OK, &Value::Array(rows))
        }
        Ok(Err(e)) => error(e.http_status(), &e.to_string()),
        Err(e) => error(500, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("X-Registry-Auth", v.parse().unwrap());
        h
    }

    #[test]
    fn registry_auth_reads_both_alphabets_and_refuses_the_rest() {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let c = registry_auth(&headers(&enc(r#"{"username":"u","password":"p?>","serveraddress":"x"}"#))).unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p?>"));
        let std = base64::engine::general_purpose::STANDARD.encode(r#"{"username":"u","password":"p?>"}"#);
        assert!(registry_auth(&headers(&std)).unwrap().is_some());
        assert_eq!(registry_auth(&headers("e30=")).unwrap(), None);
        assert_eq!(registry_auth(&HeaderMap::new()).unwrap(), None);
        for bad in ["!!!", &enc("not json"), &enc(r#"{"identitytoken":"t"}"#)] {
            assert!(registry_auth(&headers(bad)).unwrap_err().starts_with("X-Registry-Auth"), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_auth_headers_never_panic(s in "[ -~]{0,200}") {
            if let Ok(v) = s.parse() {
                let mut h = HeaderMap::new();
                h.insert("X-Registry-Auth", v);
                let _ = registry_auth(&h);
            }
        }
    }
}
