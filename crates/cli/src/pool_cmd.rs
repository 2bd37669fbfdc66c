// SPDX-License-Identifier: Apache-2.0
//! `insitu pool up|down|status CONFIG`: attach, detach or inspect several targets at once.
//!
//! The config is JSON: `{"targets": [{"url": "nvme-tcp://HOST:PORT/NQN/NSID", "dir":
//! "/mnt/a"}, ...], "hostnqn": "..."}` (hostnqn optional). Once the pool is up, one `insitu
//! exec` over files under several of the directories sends each file's EXEC to the target
//! holding it, in parallel, and merges the results and stats.

use crate::Failure;
use serde::Deserialize;
use serde_json::json;
use std::path::{Path, PathBuf};

/// A pool config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolConfig {
    targets: Vec<Member>,
    #[serde(default)]
    hostnqn: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Member {
    url: String,
    dir: PathBuf,
}

/// Reads and checks a pool config: valid URLs, distinct directories.
pub(crate) fn load(path: &Path) -> Result<PoolConfig, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

pub(crate) fn parse(text: &str) -> Result<PoolConfig, String> {
    let cfg: PoolConfig =
        serde_json::from_str(text).map_err(|e| format!("not a pool config ({e}); expected {{\"targets\": [{{\"url\": ..., \"dir\": ...}}]}}"))?;
    if cfg.targets.is_empty() {
        return Err("the pool names no targets".into());
    }
    for (i, m) in cfg.targets.iter().enumerate() {
        insitu_attach::TargetUrl::parse(&m.url).map_err(|e| e.to_string())?;
        if cfg.targets[..i].iter().any(|o| o.dir == m.dir) {
            return Err(format!("directory {} is used twice", m.dir.display()));
        }
    }
    Ok(cfg)
}

pub(crate) fn up(cfg: &PoolConfig, json_out: bool) -> Result<i32, Failure> {
    let mut done: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    for m in &cfg.targets {
        match insitu_attach::attach(&m.url, &m.dir, None, cfg.hostnqn.clone()) {
            Ok(a) => {
                done.push(a.dir.clone());
                out.push(json!({"url": a.url, "dir": a.dir, "size": a.size}));
            }
            Err(e) => {
                // All or nothing: undo what this command attached.
                for d in &done {
                    let _ = insitu_attach::detach(d);
                }
                return Err(format!("{}: {e}", m.url).into());
            }
        }
    }
    report(json_out, "attached", &out);
    Ok(0)
}

pub(crate) fn down(cfg: &PoolConfig, json_out: bool) -> Result<i32, Failure> {
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for m in &cfg.targets {
        match insitu_attach::detach(&m.dir) {
            Ok(a) => out.push(json!({"url": a.url, "dir": a.dir})),
            Err(e) => failed.push(format!("{}: {e}", m.dir.display())),
        }
    }
    report(json_out, "detached", &out);
    if failed.is_empty() {
        Ok(0)
    } else {
        Err(failed.join("; ").into())
    }
}

pub(crate) fn status(cfg: &PoolConfig, json_out: bool) -> Result<i32, Failure> {
    let attached = insitu_attach::list();
    let rows: Vec<serde_json::Value> = cfg
        .targets
        .iter()
        .map(|m| {
            let dir = std::fs::canonicalize(&m.dir).unwrap_or_else(|_| m.dir.clone());
            let a = attached.iter().find(|a| a.dir == dir);
            json!({"url": m.url, "dir": m.dir, "attached": a.is_some(), "loop_device": a.map(|a| a.loop_device.clone())})
        })
        .collect();
    let all = rows.iter().all(|r| r["attached"] == json!(true));
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"targets": rows, "all_attached": all})).unwrap_or_default());
    } else {
        for r in &rows {
            println!(
                "{:<10} {} at {}",
                if r["attached"] == json!(true) { "attached" } else { "DETACHED" },
                r["url"].as_str().unwrap_or(""),
                r["dir"].as_str().unwrap_or("")
            );
        }
    }
    Ok(if all { 0 } else { 1 })
}

fn report(json_out: bool, verb: &str, rows: &[serde_json::Value]) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({ verb: rows })).unwrap_or_default());
    } else {
        for r in rows {
            println!("{verb} {} at {}", r["url"].as_str().unwrap_or(""), r["dir"].as_str().unwrap_or(""));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn configs_are_checked() {
        let ok =
            r#"{"targets": [{"url": "nvme-tcp://127.0.0.1:4420/nqn.a:b/1", "dir": "/mnt/a"}, {"url": "nvme-tcp://127.0.0.1:4421/nqn.a:c", "dir": "/mnt/b"}]}"#;
        assert_eq!(parse(ok).unwrap().targets.len(), 2);
        assert!(parse(r#"{"targets": []}"#).unwrap_err().contains("no targets"));
        assert!(parse(r#"{"targets": [{"url": "http://x", "dir": "/a"}]}"#).is_err());
        assert!(parse(r#"{"targets": [{"url": "nvme-tcp://h/nqn.a", "dir": "/a"}, {"url": "nvme-tcp://g/nqn.b", "dir": "/a"}]}"#)
            .unwrap_err()
            .contains("twice"));
        assert!(parse(r#"{"targets": [], "extra": 1}"#).is_err());
        assert!(parse("not json").is_err());
    }
}
