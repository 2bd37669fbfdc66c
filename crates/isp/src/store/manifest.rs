// SPDX-License-Identifier: Apache-2.0
//! Parsers of the JSON documents an image is made of: registry manifests (Docker v2
//! schema 2, OCI), manifest lists and OCI indexes, image configs, and the `manifest.json`
//! of a `docker save` archive.
//!
//! All of it is hostile input: every parser takes bytes, refuses anything over
//! [`MAX_JSON`], checks each digest is `sha256:<64 lowercase hex>` (digests become file
//! names in the store) and answers a message naming the document and what is wrong.

use serde_json::Value;
use std::collections::BTreeMap;

use super::{ImageConfig, ImageError};

/// Largest manifest, index or config accepted (Docker's own limit is 4 MiB too).
pub const MAX_JSON: u64 = 4 << 20;

/// A content descriptor: what a manifest or index points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Media type ("" when absent).
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// `os/architecture[/variant]` of an index entry, when given.
    pub platform: Option<String>,
}

/// A parsed registry manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// A manifest list or OCI index: one manifest per platform.
    Index(Vec<Descriptor>),
    /// An image manifest: its config and layers, lowest first.
    Image {
        /// The config blob.
        config: Descriptor,
        /// The layer blobs.
        layers: Vec<Descriptor>,
    },
}

/// A parsed image config (the parts the store keeps).
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `rootfs.diff_ids`, lowest first.
    pub diff_ids: Vec<String>,
    /// Seconds since the epoch (0 when absent or unreadable).
    pub created: i64,
    /// CPU architecture.
    pub architecture: String,
    /// Operating system.
    pub os: String,
    /// Runtime configuration.
    pub config: ImageConfig,
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveEntry {
    /// Path of the config in the archive.
    pub config: String,
    /// Tags, as written (`docker.io/library/busybox:latest` or `busybox:latest`).
    pub repo_tags: Vec<String>,
    /// Paths of the layer tars in the archive, lowest first.
    pub layers: Vec<String>,
}

/// Whether `d` is `sha256:` and 64 lowercase hex digits.
pub fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn parse_json(bytes: &[u8], what: &str) -> Result<Value, ImageError> {
    if bytes.len() as u64 > MAX_JSON {
        return Err(ImageError::Malformed(format!("{what} is {} bytes, more than the {MAX_JSON} accepted; refused", bytes.len())));
    }
    serde_json::from_slice(bytes).map_err(|e| ImageError::Malformed(format!("{what} is not valid JSON: {e}")))
}

fn descriptor(v: &Value, what: &str) -> Result<Descriptor, ImageError> {
    let digest = v["digest"].as_str().unwrap_or("");
    if !is_sha256(digest) {
        return Err(ImageError::Malformed(format!("{what}: a descriptor's digest {digest:?} is not sha256:<64 lowercase hex digits>")));
    }
    let size = match &v["size"] {
        Value::Null => 0,
        s => s.as_u64().ok_or_else(|| ImageError::Malformed(format!("{what}: the size of {digest} is not a non-negative integer")))?,
    };
    let p = &v["platform"];
    let platform = p.is_object().then(|| {
        let mut s = format!("{}/{}", p["os"].as_str().unwrap_or(""), p["architecture"].as_str().unwrap_or(""));
        if let Some(var) = p["variant"].as_str() {
            s = format!("{s}/{var}");
        }
        s
    });
    Ok(Descriptor { media_type: v["mediaType"].as_str().unwrap_or("").to_string(), digest: digest.to_string(), size, platform })
}

/// Parses a manifest or index; `content_type` is the registry's (may be empty).
pub fn parse_manifest(bytes: &[u8], content_type: &str, what: &str) -> Result<Manifest, ImageError> {
    let v = parse_json(bytes, what)?;
    if !v.is_object() {
        return Err(ImageError::Malformed(format!("{what} is not a JSON object")));
    }
    let media = v["mediaType"].as_str().unwrap_or(content_type);
    if v["schemaVersion"].as_i64() == Some(1) || media.starts_with("application/vnd.docker.distribution.manifest.v1") {
        return Err(ImageError::Malformed(format!(
            "{what} is a Docker schema 1 manifest, which is not supported: push the image again with a current client (schema 2 or OCI)"
        )));
    }
    if let Some(list) = v.get("manifests") {
        let list = list.as_array().ok_or_else(|| ImageError::Malformed(format!("{what}: \"manifests\" is not a list")))?;
        return Ok(Manifest::Index(list.iter().map(|d| descriptor(d, what)).collect::<Result<_, _>>()?));
    }
    let config = descriptor(&v["config"], &format!("{what} (config)"))?;
    if config.size > MAX_JSON {
        return Err(ImageError::Malformed(format!("{what}: the config is {} bytes, more than the {MAX_JSON} accepted; refused", config.size)));
    }
    let layers = v["layers"].as_array().ok_or_else(|| ImageError::Malformed(format!("{what} has no \"layers\" list")))?;
    let layers: Vec<Descriptor> = layers.iter().map(|d| descriptor(d, what)).collect::<Result<_, _>>()?;
    for l in &layers {
        if l.media_type.contains("zstd") {
            return Err(ImageError::Malformed(format!(
                "{what}: layer {} is zstd-compressed ({}); only gzip and plain tar layers are supported",
                l.digest, l.media_type
            )));
        }
    }
    Ok(Manifest::Image { config, layers })
}

/// The entry of an index for linux/amd64 (an entry without a platform as a fallback).
pub fn pick_platform(list: &[Descriptor]) -> Option<&Descriptor> {
    list.iter()
        .find(|d| d.platform.as_deref() == Some("linux/amd64"))
        .or_else(|| list.iter().find(|d| d.platform.as_deref().is_some_and(|p| p.starts_with("linux/amd64/"))))
        .or_else(|| list.iter().find(|d| d.platform.is_none()))
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

/// Parses an image config.
pub fn parse_config(bytes: &[u8], what: &str) -> Result<Config, ImageError> {
    let v = parse_json(bytes, what)?;
    if !v.is_object() {
        return Err(ImageError::Malformed(format!("{what} is not a JSON object")));
    }
    let diff_ids = match &v["rootfs"]["diff_ids"] {
        Value::Null => Vec::new(),
        d => d.as_array().map(|a| a.iter().map(|x| x.as_str().unwrap_or("").to_string()).collect::<Vec<_>>()).unwrap_or_default(),
    };
    if let Some(bad) = diff_ids.iter().find(|d| !is_sha256(d)) {
        return Err(ImageError::Malformed(format!("{what}: diff id {bad:?} is not sha256:<64 lowercase hex digits>")));
    }
    let c = &v["config"];
    let labels: BTreeMap<String, String> =
        c["Labels"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect()).unwrap_or_default();
    Ok(Config {
        diff_ids,
        created: v["created"].as_str().map_or(0, parse_time),
        architecture: v["architecture"].as_str().unwrap_or("").to_string(),
        os: v["os"].as_str().unwrap_or("").to_string(),
        config: ImageConfig {
            env: strings(&c["Env"]).unwrap_or_default(),
            cmd: strings(&c["Cmd"]),
            entrypoint: strings(&c["Entrypoint"]),
            working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
            user: c["User"].as_str().unwrap_or("").to_string(),
            labels,
            exposed_ports: keys(&c["ExposedPorts"]),
            volumes: keys(&c["Volumes"]),
        },
    })
}

/// Parses the `manifest.json` of a `docker save` archive.
pub fn parse_save_manifest(bytes: &[u8]) -> Result<Vec<SaveEntry>, ImageError> {
    let v = parse_json(bytes, "manifest.json of the archive")?;
    let list = v.as_array().ok_or_else(|| ImageError::Malformed("manifest.json of the archive is not a list of images".into()))?;
    list.iter()
        .map(|e| {
            let config = e["Config"].as_str().ok_or_else(|| ImageError::Malformed("an image in manifest.json of the archive has no \"Config\"".into()))?;
            let layers =
                strings(&e["Layers"]).ok_or_else(|| ImageError::Malformed(format!("image {config} in manifest.json of the archive has no \"Layers\" list")))?;
            Ok(SaveEntry { config: config.to_string(), repo_tags: strings(&e["RepoTags"]).unwrap_or_default(), layers })
        })
        .collect()
}

/// Seconds since the epoch of an RFC 3339 time ("2024-05-01T12:34:56.789Z", offsets
/// honoured); 0 when it cannot be read.
pub fn parse_time(s: &str) -> i64 {
    let p = |a: usize, b: usize| s.get(a..b).filter(|x| x.bytes().all(|c| c.is_ascii_digit())).and_then(|x| x.parse::<i64>().ok());
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(se)) = (p(0, 4), p(5, 7), p(8, 10), p(11, 13), p(14, 16), p(17, 19)) else { return 0 };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return 0;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m) = if mo <= 2 { (y - 1, mo + 9) } else { (y, mo - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let mut t = (era * 146_097 + doe - 719_468) * 86_400 + h * 3600 + mi * 60 + se;
    // A numeric offset after the seconds (and their fraction): "+02:00" / "-05:30".
    let tail = s.get(19..).unwrap_or("").trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    if let (Some(sign), Some(oh), Some(om)) =
        (tail.chars().next(), tail.get(1..3).and_then(|x| x.parse::<i64>().ok()), tail.get(4..6).and_then(|x| x.parse::<i64>().ok()))
    {
        let off = oh * 3600 + om * 60;
        match sign {
            '+' => t -= off,
            '-' => t += off,
            _ => {}
        }
    }
    t
}
