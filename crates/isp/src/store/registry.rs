// SPDX-License-Identifier: Apache-2.0
//! A client of the OCI distribution API (Docker Registry HTTP API v2): manifests and blobs,
//! with anonymous bearer tokens; HTTPS, and plain HTTP only on loopback.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use super::manifest::MAX_JSON;
use super::reference::Reference;
use super::{ImageError, Progress};

/// Media types a manifest request accepts.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// One registry session.
pub struct Registry {
    agent: ureq::Agent,
    base: String,
    repository: String,
    token: Option<String>,
}

fn reg_err(r: &Reference, what: impl std::fmt::Display) -> ImageError {
    ImageError::Registry { registry: r.registry.clone(), message: what.to_string() }
}

impl Registry {
    /// Finds how to reach the registry of `r`.
    pub fn connect(r: &Reference) -> Result<Registry, ImageError> {
        let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(Duration::from_secs(60)).redirects(5).build();
        let schemes: &[&str] = if r.loopback() { &["https", "http"] } else { &["https"] };
        let mut last = String::new();
        for s in schemes {
            let base = format!("{s}://{}", r.api_host());
            // A plain-HTTP server on loopback may never answer a TLS hello: probe briefly.
            let probe = if r.loopback() && *s == "https" { Duration::from_secs(3) } else { Duration::from_secs(30) };
            match agent.get(&format!("{base}/v2/")).timeout(probe).call() {
                Ok(_) | Err(ureq::Error::Status(_, _)) => {
                    return Ok(Registry { agent, base, repository: r.repository.clone(), token: None });
                }
                Err(e) => last = format!("{last}{}{s}: {e}", if last.is_empty() { "" } else { "; " }),
            }
        }
        let hint = if r.loopback() { "" } else { " (only loopback registries may use plain HTTP)" };
        Err(reg_err(r, format!("cannot reach {}: {last}{hint}", r.api_host())))
    }

    fn get(&mut self, r: &Reference, path: &str, accept: Option<&str>) -> Result<ureq::Response, ImageError> {
        for attempt in 0..2 {
            let mut req = self.agent.get(&format!("{}/v2/{}/{path}", self.base, self.repository));
            if let Some(a) = accept {
                req = req.set("Accept", a);
            }
            if let Some(t) = &self.token {
                req = req.set("Authorization", &format!("Bearer {t}"));
            }
            match req.call() {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(401, resp)) if attempt == 0 => {
                    let challenge = resp.header("WWW-Authenticate").unwrap_or("").to_string();
                    self.token = Some(self.fetch_token(r, &challenge)?);
                }
                Err(ureq::Error::Status(401, _)) => return Err(ImageError::Unauthorized(r.familiar_name())),
                Err(ureq::Error::Status(404, _)) if path.starts_with("manifests/") => return Err(ImageError::NotFound(r.familiar())),
                Err(ureq::Error::Status(404, _)) => {
                    return Err(reg_err(r, format!("{}: {path} is not in the registry (a foreign or deleted layer?)", r.familiar_name())));
                }
                Err(ureq::Error::Status(code, resp)) => {
                    let body = resp.into_string().unwrap_or_default();
                    return Err(reg_err(r, format!("{path}: HTTP {code}: {}", body.chars().take(300).collect::<String>())));
                }
                Err(e) => return Err(reg_err(r, e)),
            }
        }
        Err(ImageError::Unauthorized(r.familiar_name()))
    }

    fn fetch_token(&self, r: &Reference, challenge: &str) -> Result<String, ImageError> {
        let Some(params) = challenge.strip_prefix("Bearer ") else {
            return Err(ImageError::Unauthorized(r.familiar_name()));
        };
        let field = |k: &str| {
            params.split(',').find_map(|p| {
                let (a, b) = p.trim().split_once('=')?;
                (a == k).then(|| b.trim_matches('"').to_string())
            })
        };
        let realm = field("realm").ok_or_else(|| ImageError::Unauthorized(r.familiar_name()))?;
        let mut req = self.agent.get(&realm).query("scope", &format!("repository:{}:pull", self.repository));
        if let Some(s) = field("service") {
            req = req.query("service", &s);
        }
        let resp = req.call().map_err(|e| reg_err(r, format!("token from {realm}: {e}")))?;
        let v: serde_json::Value = serde_json::from_reader(resp.into_reader().take(MAX_JSON)).map_err(|e| reg_err(r, format!("token: {e}")))?;
        v.get("token").or_else(|| v.get("access_token")).and_then(|t| t.as_str()).map(str::to_string).ok_or_else(|| ImageError::Unauthorized(r.familiar_name()))
    }

    /// A manifest by tag or digest: (bytes, media type, digest of the bytes).
    pub fn manifest(&mut self, r: &Reference, reference: &str) -> Result<(Vec<u8>, String, String), ImageError> {
        let resp = self.get(r, &format!("manifests/{reference}"), Some(ACCEPT))?;
        let ct = resp.content_type().to_string();
        let mut body = Vec::new();
        resp.into_reader().take(MAX_JSON + 1).read_to_end(&mut body).map_err(|e| reg_err(r, e))?;
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
            let n = reader.read(&mut buf).map_err(|e| reg_err(r, e))?;
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
            return Err(reg_err(r, format!("blob {digest}: {got} bytes arrived, the manifest announced {size}; nothing was stored")));
        }
        let actual = format!("sha256:{}", hex::encode(h.finalize()));
        if actual != digest {
            let _ = std::fs::remove_file(path);
            return Err(ImageError::DigestMismatch { what: format!("blob of {}", r.familiar()), expected: digest.into(), actual });
        }
        Ok(())
    }
}
