// SPDX-License-Identifier: Apache-2.0
//! Image references: `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`, normalised as docker does
//! (no registry: Docker Hub; a one-part Hub name: `library/NAME`; no tag: `latest`).

use super::ImageError;

/// A parsed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host[:port], e.g. `127.0.0.1:5000` or `docker.io`.
    pub registry: String,
    /// Repository path, e.g. `library/busybox`.
    pub repository: String,
    /// Tag (`latest` when neither tag nor digest is given).
    pub tag: Option<String>,
    /// `sha256:<hex>` when pinned.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses `s`, with a message naming what is wrong.
    pub fn parse(s: &str) -> Result<Reference, ImageError> {
        let bad = |why: &str| ImageError::InvalidReference(format!("invalid reference format {s:?}: {why}"));
        if s.is_empty() || s.len() > 512 {
            return Err(bad("empty or longer than 512 bytes"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d.strip_prefix("sha256:").ok_or_else(|| bad("the digest must be sha256:<64 hex digits>"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                    return Err(bad("the digest must be sha256:<64 lowercase hex digits>"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(rest[i + 1..].to_string())),
            _ => (rest, None),
        };
        if let Some(t) = &tag {
            if t.is_empty() || t.len() > 128 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
                return Err(bad("a tag is up to 128 of [A-Za-z0-9_.-]"));
            }
        }
        let mut parts: Vec<&str> = name.split('/').collect();
        let registry = if parts.len() > 1 && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost") {
            parts.remove(0).to_string()
        } else {
            "docker.io".to_string()
        };
        if !registry.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)) {
            return Err(bad("a registry is HOST[:PORT]"));
        }
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if parts.iter().any(|p| {
            let b = p.as_bytes();
            b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) || !b.iter().all(|&c| alnum(c) || b"_.-".contains(&c)) || p.contains("..")
        }) {
            return Err(bad("repository names are lowercase [a-z0-9] parts (joined by '.', '_' or '-') separated by '/'"));
        }
        if registry == "docker.io" && parts.len() == 1 {
            parts.insert(0, "library");
        }
        let tag = if tag.is_none() && digest.is_none() { Some("latest".into()) } else { tag };
        Ok(Reference { registry, repository: parts.join("/"), tag, digest })
    }

    /// The repository as docker shows it: `busybox`, `user/x`, `127.0.0.1:5000/x`.
    pub fn familiar_name(&self) -> String {
        if self.registry == "docker.io" {
            self.repository.strip_prefix("library/").unwrap_or(&self.repository).to_string()
        } else {
            format!("{}/{}", self.registry, self.repository)
        }
    }

    /// `NAME:TAG` as docker shows it (the tag, or the digest when pinned).
    pub fn familiar(&self) -> String {
        match (&self.tag, &self.digest) {
            (Some(t), _) => format!("{}:{t}", self.familiar_name()),
            (None, Some(d)) => format!("{}@{d}", self.familiar_name()),
            (None, None) => self.familiar_name(),
        }
    }

    /// The host to talk to for this registry.
    pub fn api_host(&self) -> &str {
        if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_like_docker() {
        let r = Reference::parse("busybox").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()), ("docker.io", "library/busybox", Some("latest")));
        assert_eq!(r.familiar(), "busybox:latest");
        let r = Reference::parse("127.0.0.1:5000/tools/bb:1.0").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()), ("127.0.0.1:5000", "tools/bb", Some("1.0")));
        assert_eq!(r.familiar(), "127.0.0.1:5000/tools/bb:1.0");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("localhost:5000/x@{d}")).unwrap();
        assert_eq!((r.tag, r.digest), (None, Some(d)));
        for bad in ["", "UPPER", "a//b", "x:", "x:t@sha256:zz", "x@md5:00", &"a".repeat(600), "127.0.0.1:5000/../x", "h.io/-x", "a/b.", "ev#il.io/x"] {
            assert!(matches!(Reference::parse(bad), Err(ImageError::InvalidReference(_))), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_references_never_panic(s in ".{0,80}") {
            let _ = Reference::parse(&s);
        }
    }
}
