// SPDX-License-Identifier: Apache-2.0
//! `docker search`: the repositories of a registry whose names hold a term, from the
//! registry's catalog (`/v2/_catalog`), as a Docker-compatible server without Docker Hub
//! answers it.
//!
//! `TERM` searches Docker Hub's mirrors (Docker Hub's own index is asked only when the
//! target has none); `HOST[:PORT]/TERM` searches that registry.

use serde_json::Value;
use std::io::Read;
use std::time::Duration;

use super::manifest::MAX_JSON;
use super::registries::DOCKER_HUB;
use super::registry::{Credentials, Registry};
use super::{ImageError, ImageStore, Reference};

/// One repository found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    /// The name to pull it by.
    pub name: String,
    /// Its description ("" from a catalog).
    pub description: String,
    /// Stars (0 from a catalog).
    pub stars: u64,
    /// One of Docker Hub's official images (`library/...`).
    pub official: bool,
    /// An automated build (always false: a deprecated notion).
    pub automated: bool,
}

/// Splits a search term into the registry to ask and what to look for in its names.
fn split_term(term: &str) -> (String, String) {
    match term.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first.to_string(), rest.to_string()),
        _ => (DOCKER_HUB.to_string(), term.to_string()),
    }
}

impl ImageStore {
    /// The repositories whose names contain `term` (see the module), at most `limit`.
    pub fn search(&self, term: &str, limit: usize, credentials: Option<Credentials>) -> Result<Vec<SearchHit>, ImageError> {
        let (registry, needle) = split_term(term);
        if needle.is_empty() || term.len() > 256 || !needle.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ImageError::InvalidReference(format!("search term {term:?}: give part of a repository's name, optionally after HOST[:PORT]/")));
        }
        let needle = needle.to_ascii_lowercase();
        let base_ref = Reference { registry: registry.clone(), repository: String::new(), tag: None, digest: None };
        let mut sources = if registry == DOCKER_HUB {
            if self.registries.mirrors().is_empty() {
                return hub_search(&needle, limit);
            }
            Registry::sources(&Reference::parse("library/x")?, &self.registries, true)
        } else {
            Registry::sources(&base_ref, &self.registries, false)
        };
        if registry == DOCKER_HUB {
            sources.pop(); // Docker Hub itself has no catalog
        }
        let mut hits: Vec<SearchHit> = Vec::new();
        let mut errors = Vec::new();
        for bases in sources {
            let listed = Registry::connect(&base_ref, &bases, credentials.clone(), "registry:catalog:*".into()).and_then(|mut reg| reg.catalog());
            let names = match listed {
                Ok(n) => n,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for repo in names.into_iter().filter(|n| n.to_ascii_lowercase().contains(&needle)) {
                let (name, official) = match repo.strip_prefix("library/") {
                    Some(short) if registry == DOCKER_HUB => (short.to_string(), true),
                    _ if registry == DOCKER_HUB => (repo, false),
                    _ => (format!("{registry}/{repo}"), false),
                };
                if !hits.iter().any(|h| h.name == name) {
                    hits.push(SearchHit { name, description: String::new(), stars: 0, official, automated: false });
                }
            }
        }
        // Only when no source answered: one mirror down while another lists is a result.
        if hits.is_empty() {
            if let Some(e) = errors.pop() {
                return Err(e);
            }
        }
        hits.truncate(limit);
        Ok(hits)
    }
}

/// Docker Hub's own search (its v1 index), for a target without mirrors.
fn hub_search(term: &str, limit: usize) -> Result<Vec<SearchHit>, ImageError> {
    let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(Duration::from_secs(30)).build();
    let resp = agent.get("https://index.docker.io/v1/search").query("q", term).query("n", &limit.to_string()).call().map_err(|e| ImageError::Registry {
        registry: DOCKER_HUB.into(),
        message: format!("cannot search Docker Hub: {e} (give the target a --registry-mirror, or search HOST:PORT/TERM)"),
    })?;
    let v: Value = serde_json::from_reader(resp.into_reader().take(MAX_JSON))
        .map_err(|e| ImageError::Registry { registry: DOCKER_HUB.into(), message: format!("search results are not JSON: {e}") })?;
    Ok(v["results"]
        .as_array()
        .into_iter()
        .flatten()
        .take(limit)
        .map(|r| SearchHit {
            name: r["name"].as_str().unwrap_or("").to_string(),
            description: r["description"].as_str().unwrap_or("").to_string(),
            stars: r["star_count"].as_u64().unwrap_or(0),
            official: r["is_official"].as_bool().unwrap_or(false),
            automated: r["is_automated"].as_bool().unwrap_or(false),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::split_term;

    #[test]
    fn terms_name_their_registry_as_docker_does() {
        assert_eq!(split_term("busy"), ("docker.io".into(), "busy".into()));
        assert_eq!(split_term("user/busy"), ("docker.io".into(), "user/busy".into()));
        assert_eq!(split_term("127.0.0.1:5000/busy"), ("127.0.0.1:5000".into(), "busy".into()));
        assert_eq!(split_term("localhost/a/b"), ("localhost".into(), "a/b".into()));
    }
}
