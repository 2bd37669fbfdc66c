// SPDX-License-Identifier: Apache-2.0
//! A client of the OCI distribution API (Docker Registry HTTP API v2): manifests and blobs
//! both ways, and the catalog; anonymous or with credentials (basic, or a bearer token
//! fetched with them); HTTPS, and plain HTTP only for the target's insecure registries.

use base64::Engine;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use super::manifest::MAX_JSON;
use super::reference::Reference;
use super::registries::{RegistryConfig, DOCKER_HUB};
use super::{ImageError, Progress};

/// Media types a manifest request accepts.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// Most repositories a catalog listing reads.
const MAX_CATALOG: usize = 10_000;

/// A manifest as a registry sent it: its bytes, media type and digest.
pub type FetchedManifest = (Vec<u8>, String, String);

/// A user name and password for a registry (`X-Registry-Auth`, `docker login`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub username: String,
    /// The password or token.
    pub password: String,
}

/// What a request carries.
enum Payload<'a> {
    Empty,
    Bytes(&'a [u8], &'a str),
    File(&'a Path, u64),
}

/// One registry session.
pub struct Registry {
    agent: ureq::Agent,
    base: String,
    registry: String,
    repository: String,
    /// The token scope asked for on a bearer challenge.
    scope: String,
    token: Option<String>,
    credentials: Option<Credentials>,
    /// The registry asked for basic authentication.
    basic: bool,
}

fn reg_err(registry: &str, what: impl std::fmt::Display) -> ImageError {
    ImageError::Registry { registry: registry.to_string(), message: what.to_string() }
}

impl Registry {
    /// Where `r` may be fetched from, each a list of base URLs tried in order (HTTPS, then
    /// plain HTTP for an insecure registry): Docker Hub's mirrors first when `mirrors`
    /// and `r` is Docker Hub's, then its own registry.
    pub fn sources(r: &Reference, cfg: &RegistryConfig, mirrors: bool) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let hub = r.registry == DOCKER_HUB;
        if hub && mirrors {
            for m in cfg.mirrors() {
                let m = m.trim_end_matches('/');
                let host = m.split_once("://").map_or(m, |(_, h)| h);
                let mut group = vec![m.to_string()];
                if m.starts_with("https://") && cfg.insecure(host) {
                    group.push(format!("http://{host}"));
                }
                out.push(group);
            }
        }
        let host = r.api_host();
        let mut group = vec![format!("https://{host}")];
        if !hub && cfg.insecure(&r.registry) {
            group.push(format!("http://{host}"));
        }
        out.push(group);
        out
    }

    /// Opens a session with the first of `bases` that answers `/v2/`, for `scope`
    /// (`repository:NAME:pull`, `registry:catalog:*`).
    pub fn connect(r: &Reference, bases: &[String], credentials: Option<Credentials>, scope: String) -> Result<Registry, ImageError> {
        let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(Duration::from_secs(60)).redirects(5).build();
        let mut last = String::new();
        for (i, base) in bases.iter().enumerate() {
            // A plain-HTTP server may never answer a TLS hello: probe briefly when there is
            // another scheme to try.
            let probe = if i + 1 < bases.len() { Duration::from_secs(3) } else { Duration::from_secs(30) };
            match agent.get(&format!("{base}/v2/")).timeout(probe).call() {
                Ok(_) | Err(ureq::Error::Status(_, _)) => {
                    return Ok(Registry {
                        agent,
                        base: base.clone(),
                        registry: r.registry.clone(),
                        repository: r.repository.clone(),
                        scope,
                        token: None,
                        credentials,
                        basic: false,
                    });
                }
                Err(e) => last = format!("{last}{}{base}: {e}", if last.is_empty() { "" } else { "; " }),
            }
        }
        let hint = if bases.iter().any(|b| b.starts_with("http://")) { "" } else { " (plain HTTP is used only for insecure registries: --insecure-registry)" };
        Err(reg_err(&r.registry, format!("cannot reach {last}{hint}")))
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    /// Sends a request, answering one authentication challenge (a bearer token, or basic
    /// credentials); returns the response whatever its status, but a second 401.
    fn call(&mut self, method: &str, url: &str, accept: Option<&str>, payload: &Payload) -> Result<ureq::Response, ImageError> {
        for attempt in 0..2 {
            let mut req = self.agent.request(method, url);
            if let Some(a) = accept {
                req = req.set("Accept", a);
            }
            if let Some(t) = &self.token {
                req = req.set("Authorization", &format!("Bearer {t}"));
            } else if let (true, Some(c)) = (self.basic, &self.credentials) {
                req = req.set("Authorization", &basic_header(c));
            }
            let sent = match payload {
                Payload::Empty => req.call(),
                Payload::Bytes(b, ct) => req.set("Content-Type", ct).send_bytes(b),
                Payload::File(p, len) => {
                    let f = std::fs::File::open(p).map_err(super::io_err(p))?;
                    req.set("Content-Type", "application/octet-stream").set("Content-Length", &len.to_string()).send(f)
                }
            };
            match sent {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(401, resp)) if attempt == 0 => {
                    let challenge = resp.header("WWW-Authenticate").unwrap_or("").to_string();
                    self.authenticate(&challenge)?;
                }
                Err(ureq::Error::Status(401, _)) => break,
                Err(ureq::Error::Status(_, resp)) => return Ok(resp),
                Err(e) => return Err(reg_err(&self.registry, e)),
            }
        }
        Err(ImageError::Unauthorized(self.shown()))
    }

    fn shown(&self) -> String {
        Reference { registry: self.registry.clone(), repository: self.repository.clone(), tag: None, digest: None }.familiar_name()
    }

    fn authenticate(&mut self, challenge: &str) -> Result<(), ImageError> {
        if challenge.get(..6).is_some_and(|s| s.eq_ignore_ascii_case("basic ")) && self.credentials.is_some() {
            self.basic = true;
            return Ok(());
        }
        let Some(params) = challenge.strip_prefix("Bearer ") else {
            return Err(ImageError::Unauthorized(self.shown()));
        };
        let field = |k: &str| {
            params.split(',').find_map(|p| {
                let (a, b) = p.trim().split_once('=')?;
                (a == k).then(|| b.trim_matches('"').to_string())
            })
        };
        let realm = field("realm").ok_or_else(|| ImageError::Unauthorized(self.shown()))?;
        let mut req = self.agent.get(&realm).query("scope", &self.scope);
        if let Some(s) = field("service") {
            req = req.query("service", &s);
        }
        if let Some(c) = &self.credentials {
            req = req.set("Authorization", &basic_header(c));
        }
        let resp = req.call().map_err(|e| reg_err(&self.registry, format!("token from {realm}: {e}")))?;
        let v: serde_json::Value = serde_json::from_reader(resp.into_reader().take(MAX_JSON)).map_err(|e| reg_err(&self.registry, format!("token: {e}")))?;
        let token = v.get("token").or_else(|| v.get("access_token")).and_then(|t| t.as_str()).ok_or_else(|| ImageError::Unauthorized(self.shown()))?;
        self.token = Some(token.to_string());
        Ok(())
    }

    /// A response's status as an error, with the start of its body.
    fn refused(&self, what: &str, resp: ureq::Response) -> ImageError {
        let code = resp.status();
        let body = resp.into_string().unwrap_or_default();
        reg_err(&self.registry, format!("{what}: HTTP {code}: {}", body.chars().take(300).collect::<String>()))
    }

    fn get(&mut self, r: &Reference, path: &str, accept: Option<&str>) -> Result<ureq::Response, ImageError> {
        let resp = self.call("GET", &self.url(path), accept, &Payload::Empty)?;
        match resp.status() {
            200..=299 => Ok(resp),
            404 if path.starts_with("manifests/") => Err(ImageError::NotFound(r.familiar())),
            404 => Err(reg_err(&r.registry, format!("{}: {path} is not in the registry (a foreign or deleted layer?)", r.familiar_name()))),
            _ => Err(self.refused(path, resp)),
        }
    }

    /// A manifest by tag or digest: (bytes, media type, digest of the bytes).
    pub fn manifest(&mut self, r: &Reference, reference: &str) -> Result<FetchedManifest, ImageError> {
        let resp = self.get(r, &format!("manifests/{reference}"), Some(ACCEPT))?;
        let ct = resp.content_type().to_string();
        let mut body = Vec::new();
        resp.into_reader().take(MAX_JSON + 1).read_to_end(&mut body).map_err(|e| reg_err(&r.registry, e))?;
        if body.len() as u64 > MAX_JSON {
            return Err(ImageError::Malformed(format!("the manifest of {} is larger than the {MAX_JSON} bytes accepted; refused", r.familiar())));
        }
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if reference.starts_with("sha256:") && reference != digest {
            return Err(ImageError::DigestMismatch { what: format!("manifest of {}", r.familiar()), expected: reference.into(), actual: digest });
        }
        Ok((body, ct, digest))
    }

    /// Downloads a blob into `path`, checking its digest.
    pub fn blob(&mut self, r: &Reference, digest: &str, size: u64, path: &Path, progress: &mut dyn FnMut(Progress)) -> Result<(), ImageError> {
        let resp = self.get(r, &format!("blobs/{digest}"), None)?;
        // One byte more than announced is enough to tell a lying registry.
        let mut reader = resp.into_reader().take(if size > 0 { size + 1 } else { u64::MAX });
        let ioe = |e: std::io::Error| ImageError::Io { path: path.to_path_buf(), source: e };
        let mut out = std::fs::File::create(path).map_err(ioe)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        let mut last = 0u64;
        loop {
            let n = reader.read(&mut buf).map_err(|e| reg_err(&r.registry, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(ioe)?;
            got += n as u64;
            if got - last >= 1 << 20 || got == size {
                last = got;
                progress(Progress::Downloading { digest: digest.into(), current: got, total: size });
            }
        }
        out.sync_all().map_err(ioe)?;
        if size > 0 && got != size {
            let _ = std::fs::remove_file(path);
            return Err(reg_err(&r.registry, format!("blob {digest}: {got} bytes arrived, the manifest announced {size}; nothing was stored")));
        }
        let actual = format!("sha256:{}", hex::encode(h.finalize()));
        if actual != digest {
            let _ = std::fs::remove_file(path);
            return Err(ImageError::DigestMismatch { what: format!("blob of {}", r.familiar()), expected: digest.into(), actual });
        }
        Ok(())
    }

    /// Whether the repository holds the blob `digest` already.
    pub fn has_blob(&mut self, digest: &str) -> Result<bool, ImageError> {
        let resp = self.call("HEAD", &self.url(&format!("blobs/{digest}")), None, &Payload::Empty)?;
        match resp.status() {
            200..=299 => Ok(true),
            404 => Ok(false),
            _ => Err(self.refused(&format!("blob {digest}"), resp)),
        }
    }

    /// Uploads the blob `digest` from the file `path` (one monolithic upload).
    pub fn upload_blob(&mut self, digest: &str, path: &Path) -> Result<(), ImageError> {
        let len = std::fs::metadata(path).map_err(super::io_err(path))?.len();
        let resp = self.call("POST", &self.url("blobs/uploads/"), None, &Payload::Empty)?;
        if resp.status() != 202 {
            return Err(self.refused(&format!("starting the upload of {digest}"), resp));
        }
        let location = resp.header("Location").unwrap_or("").to_string();
        let mut url = if location.starts_with("http://") || location.starts_with("https://") { location } else { format!("{}{location}", self.base) };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={}", urlencoding::encode(digest)));
        let resp = self.call("PUT", &url, None, &Payload::File(path, len))?;
        if resp.status() != 201 {
            return Err(self.refused(&format!("uploading {digest}"), resp));
        }
        Ok(())
    }

    /// Puts a manifest under `tag`; returns the digest the registry gives it.
    pub fn put_manifest(&mut self, tag: &str, body: &[u8], media_type: &str) -> Result<String, ImageError> {
        let resp = self.call("PUT", &self.url(&format!("manifests/{tag}")), None, &Payload::Bytes(body, media_type))?;
        if !(200..=299).contains(&resp.status()) {
            return Err(self.refused(&format!("manifest {tag}"), resp));
        }
        Ok(resp.header("Docker-Content-Digest").map(str::to_string).unwrap_or_else(|| format!("sha256:{}", hex::encode(Sha256::digest(body)))))
    }

    /// The repositories the registry lists (`/v2/_catalog`, page after page).
    pub fn catalog(&mut self) -> Result<Vec<String>, ImageError> {
        let mut names = Vec::new();
        let mut url = format!("{}/v2/_catalog?n=1000", self.base);
        loop {
            let resp = self.call("GET", &url, None, &Payload::Empty)?;
            if resp.status() != 200 {
                return Err(self.refused("listing the catalog", resp));
            }
            let next = resp.header("Link").and_then(next_link);
            let v: serde_json::Value =
                serde_json::from_reader(resp.into_reader().take(MAX_JSON)).map_err(|e| reg_err(&self.registry, format!("the catalog is not JSON: {e}")))?;
            let page = v["repositories"].as_array().ok_or_else(|| reg_err(&self.registry, "the catalog has no repositories list"))?;
            names.extend(page.iter().filter_map(|n| n.as_str().map(str::to_string)));
            match next {
                Some(n) if names.len() < MAX_CATALOG && !page.is_empty() => url = format!("{}{n}", self.base),
                _ => return Ok(names),
            }
        }
    }
}

/// `Authorization: Basic ...` of `c`.
fn basic_header(c: &Credentials) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password)))
}

/// The path of a `Link: </v2/_catalog?last=x&n=1000>; rel="next"` header.
fn next_link(link: &str) -> Option<String> {
    let (target, rel) = link.split_once(';')?;
    let path = target.trim().strip_prefix('<')?.strip_suffix('>')?;
    (rel.contains("next") && path.starts_with("/v2/")).then(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_come_first_for_docker_hub_only() {
        let cfg = RegistryConfig::new(&["http://127.0.0.1:5001".into()], &[]).unwrap();
        let hub = Reference::parse("busybox").unwrap();
        assert_eq!(Registry::sources(&hub, &cfg, true), vec![vec!["http://127.0.0.1:5001".to_string()], vec!["https://registry-1.docker.io".to_string()]]);
        assert_eq!(Registry::sources(&hub, &cfg, false).len(), 1);
        let local = Reference::parse("127.0.0.1:5000/x").unwrap();
        assert_eq!(Registry::sources(&local, &cfg, true), vec![vec!["https://127.0.0.1:5000".to_string(), "http://127.0.0.1:5000".to_string()]]);
        let remote = Reference::parse("10.9.9.9:5000/x").unwrap();
        assert_eq!(Registry::sources(&remote, &cfg, true), vec![vec!["https://10.9.9.9:5000".to_string()]]);
    }

    #[test]
    fn catalog_links_are_followed_on_the_registry_only() {
        assert_eq!(next_link(r#"</v2/_catalog?last=b&n=2>; rel="next""#).as_deref(), Some("/v2/_catalog?last=b&n=2"));
        assert_eq!(next_link(r#"<http://evil/v2/_catalog>; rel="next""#), None);
        assert_eq!(next_link("garbage"), None);
    }
}
