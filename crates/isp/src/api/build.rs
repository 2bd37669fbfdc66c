// SPDX-License-Identifier: Apache-2.0
//! `POST /build` (the classic builder's API, which the stock CLI uses when BuildKit is not
//! there): the build context is the request's tar body, built by [`crate::build`] with
//! buildah; buildah's output as Docker's `{"stream"}` lines, the image's id as
//! `{"aux":{"ID"}}`, a failure as `{"errorDetail", "error"}`.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path};
use std::sync::Arc;

use super::body::{error, stream, ApiBody};
use super::image_io::all_of;
use super::images::{line, spool_request};
use super::Target;
use crate::build::{BuildNetwork, BuildOptions, Builder};
use crate::image::Reference;
use crate::runtime::Runtime;

/// Options of Docker's build API that are refused unless left at their default, and why.
const REFUSED: &[(&str, &str)] = &[
    ("remote", "a build context from a URL (send the context in the request)"),
    ("extrahosts", "extra hosts (build steps have loopback only)"),
    ("squash", "squashing (buildah's squash takes the base image's layers too)"),
    ("outputs", "build outputs (the image goes to the target's store)"),
    ("isolation", "an isolation other than the target's (runc)"),
    ("ulimits", "ulimits of build steps"),
];

/// Resource limits of build steps: the query's name, buildah's option, and whether the
/// value is a list of CPUs rather than a number.
const LIMITS: &[(&str, &str, bool)] = &[
    ("memory", "--memory", false),
    ("memswap", "--memory-swap", false),
    ("cpushares", "--cpu-shares", false),
    ("cpusetcpus", "--cpuset-cpus", true),
    ("cpuperiod", "--cpu-period", false),
    ("cpuquota", "--cpu-quota", false),
    ("shmsize", "--shm-size", false),
];

/// buildah's options for the limits the query sets (0 or empty: none).
fn limits(t: &Target) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (key, flag, cpus) in LIMITS {
        let Some(v) = t.get(key).filter(|v| *v != "0") else { continue };
        let ok =
            if *cpus { v.len() <= 256 && v.bytes().all(|b| b.is_ascii_digit() || b == b',' || b == b'-') } else { v.parse::<i64>().is_ok_and(|n| n >= -1) };
        if !ok {
            return Err(format!("{key}={v}: give {}", if *cpus { "CPUs as 0-3,5" } else { "a whole number" }));
        }
        out.push(format!("{flag}={v}"));
    }
    Ok(out)
}

/// A JSON object of strings from the query (`buildargs`, `labels`); `null` values (a build
/// argument without a value) are left out.
fn string_map(t: &Target, key: &str) -> Result<BTreeMap<String, String>, String> {
    let Some(raw) = t.get(key) else { return Ok(BTreeMap::new()) };
    let v: Value = serde_json::from_str(raw).map_err(|e| format!("{key}: malformed JSON: {e} (give an object of strings)"))?;
    let obj = v.as_object().ok_or_else(|| format!("{key}: give a JSON object of strings"))?;
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        match v {
            Value::String(s) => {
                out.insert(k.clone(), s.clone());
            }
            Value::Null => {}
            other => return Err(format!("{key}: {k} is {other}, not a string")),
        }
    }
    Ok(out)
}

/// The build's options from the query; a 400's message for what is refused or malformed.
pub(crate) fn options(t: &Target, raw_query: Option<&str>) -> Result<BuildOptions, String> {
    for (k, why) in REFUSED {
        let v = t.get(k).unwrap_or("");
        if !(v.is_empty() || v == "0" || v == "false" || v == "False" || v == "[]" || v == "null" || (*k == "isolation" && v == "default")) {
            return Err(format!("{k}={v}: {why} is not offered on this target"));
        }
    }
    if let Some(c) = t.get("cachefrom").filter(|c| !matches!(*c, "[]" | "null")) {
        return Err(format!("cachefrom={c}: build caches from images are not offered on this target (buildah keeps no cache between builds)"));
    }
    match t.get("version") {
        None | Some("1") => {}
        Some(v) => return Err(format!("version={v}: only the classic builder (version=1) is offered; BuildKit is not (DOCKER_BUILDKIT=0)")),
    }
    t.platform()?;
    let dockerfile = t.get("dockerfile").unwrap_or("Dockerfile").to_string();
    let p = Path::new(&dockerfile);
    if p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) || dockerfile.len() > 4096 {
        return Err(format!("dockerfile={dockerfile}: give a path inside the build context"));
    }
    let mut tags = Vec::new();
    for tag in all_of(raw_query, "t") {
        let r = Reference::parse(&tag).map_err(|e| format!("t={tag}: {e}"))?;
        if r.digest.is_some() {
            return Err(format!("t={tag}: a build is tagged, not pinned to a digest"));
        }
        tags.push(r.familiar());
    }
    let network = match t.get("networkmode") {
        None | Some("default") | Some("none") | Some("bridge") => BuildNetwork::None,
        Some("host") => BuildNetwork::Host,
        Some(n) => return Err(format!("networkmode={n}: build steps get none (the default) or host")),
    };
    Ok(BuildOptions {
        dockerfile,
        tags,
        build_args: string_map(t, "buildargs")?,
        labels: string_map(t, "labels")?,
        pull: t.flag("pull"),
        no_cache: t.flag("nocache"),
        rm: t.get("rm").is_none_or(|_| t.flag("rm")),
        force_rm: t.flag("forcerm"),
        target: t.get("target").map(str::to_string),
        network,
        limits: limits(t)?,
    })
}

/// Ends a spooled plain tar archive of `len` bytes as a tar should end: the stock CLI
/// sends a context whose last entry (the `.dockerignore` it writes for `-f -`) has neither
/// its padding nor the end-of-archive blocks, which Go's reader takes as a clean end.
/// Zero blocks after an archive's end change nothing; a gzip stream is left alone.
fn close_tar(file: &mut std::fs::File, path: &Path, len: u64) -> std::io::Result<()> {
    use std::io::Read;
    let mut magic = [0u8; 2];
    let gzip = std::fs::File::open(path)?.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    if gzip || len == 0 {
        return Ok(());
    }
    let pad = (512 - len % 512) % 512;
    file.write_all(&vec![0u8; pad as usize + 1024])
}

/// `POST /build`.
pub async fn build(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let opts = match options(t, req.uri().query()) {
        Ok(o) => o,
        Err(m) => return error(400, &m),
    };
    let quiet = t.flag("q");
    let builder = Arc::new(Builder::new(&rt.spool_dir().with_file_name("build")));
    // The context is spooled and checked whole before anything is built.
    let (mut file, spooled, total) = match spool_request(rt, req, "the build context").await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    if let Err(e) = close_tar(&mut file, &spooled, total) {
        let _ = std::fs::remove_file(&spooled);
        return error(500, &format!("cannot spool the build context: {e}"));
    }
    drop(file);
    // A directory of its own: a build waiting for the builder keeps its context meanwhile.
    let context = builder.scratch_dir().join(spooled.file_name().map_or_else(|| "context".into(), |n| n.to_string_lossy().replace(".tar", "")));
    let unpacked = crate::runtime::archive::unpack_checked(&spooled, &context);
    let _ = std::fs::remove_file(&spooled);
    if let Err(m) = unpacked {
        let _ = std::fs::remove_dir_all(&context);
        return error(400, &format!("build context: {m}"));
    }
    let (resp, tx) = stream(StatusCode::OK, "application/json");
    let rt = rt.clone();
    tokio::task::spawn_blocking(move || {
        let send = |v: Value| {
            let _ = tx.blocking_send(line(v));
        };
        let built = builder.build(rt.images(), &context, &opts, quiet, &mut |s| send(json!({"stream": s})));
        let _ = std::fs::remove_dir_all(&context);
        match built {
            Ok(id) => {
                send(json!({"aux": {"ID": id}}));
                let short: String = id.trim_start_matches("sha256:").chars().take(12).collect();
                if quiet {
                    send(json!({"stream": format!("{id}\n")}));
                } else {
                    send(json!({"stream": format!("Successfully built {short}\n")}));
                    for tag in &opts.tags {
                        send(json!({"stream": format!("Successfully tagged {tag}\n")}));
                    }
                }
                for tag in &opts.tags {
                    rt.events().emit("image", "tag", &id, [("name".to_string(), tag.clone())].into());
                }
            }
            Err(m) => send(json!({"errorDetail": {"message": m}, "error": m})),
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(q: &str) -> Result<BuildOptions, String> {
        let t = Target::from_parts("/build", Some(q));
        options(&t, Some(q))
    }

    #[test]
    fn options_are_honoured_or_refused_by_name() {
        let o = parsed("t=a&t=127.0.0.1:5000%2Fb%3A1&buildargs=%7B%22X%22%3A%221%22%2C%22Y%22%3Anull%7D&labels=%7B%22k%22%3A%22v%22%7D&nocache=1&pull=True&rm=False&version=1").unwrap();
        assert_eq!(o.tags, ["a:latest", "127.0.0.1:5000/b:1"]);
        assert_eq!(o.build_args.into_iter().collect::<Vec<_>>(), [("X".to_string(), "1".to_string())]);
        assert_eq!(o.labels["k"], "v");
        assert!(o.no_cache && o.pull && !o.rm && !o.force_rm);
        assert_eq!((o.dockerfile.as_str(), o.network), ("Dockerfile", BuildNetwork::None));
        assert!(parsed("").unwrap().rm);
        assert_eq!(parsed("memory=67108864&cpusetcpus=0-1&cpushares=0").unwrap().limits, ["--memory=67108864", "--cpuset-cpus=0-1"]);
        for (q, name) in [
            ("remote=http://x", "remote"),
            ("memory=lots", "memory"),
            ("cpusetcpus=a", "cpusetcpus"),
            ("cachefrom=%5B%22x%22%5D", "cachefrom"),
            ("version=2", "version"),
            ("dockerfile=..%2Fx", "dockerfile"),
            ("dockerfile=%2Fetc%2Fx", "dockerfile"),
            ("t=UPPER", "t=UPPER"),
            ("buildargs=nope", "buildargs"),
            ("labels=%7B%22k%22%3A1%7D", "labels"),
            ("networkmode=container%3Ax", "networkmode"),
            ("platform=linux%2Farm64", "platform"),
        ] {
            let e = parsed(q).unwrap_err();
            assert!(e.contains(name), "{q}: {e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_queries_never_panic(q in "[ -~]{0,120}") {
            let _ = parsed(&q);
        }
    }
}
