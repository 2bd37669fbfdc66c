// SPDX-License-Identifier: Apache-2.0
//! `docker commit`: a new image of the container's image and its changes (the overlay's
//! upper directory as a layer, whiteouts turned back into `.wh.` entries), configured as
//! the container runs, with the request's overrides and Dockerfile-style `changes`.

use serde_json::{json, Value};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::SystemTime;

use super::{Runtime, RuntimeError};

/// What `commit` is asked for besides the container.
#[derive(Debug, Clone, Default)]
pub struct CommitSpec {
    /// `repo[:tag]` to tag the image with.
    pub reference: Option<String>,
    /// The image's comment.
    pub comment: String,
    /// The image's author.
    pub author: String,
    /// Dockerfile instructions to apply (`CMD`, `ENTRYPOINT`, `ENV`, `LABEL`, `WORKDIR`,
    /// `USER`, `EXPOSE`, `VOLUME`, `STOPSIGNAL`).
    pub changes: Vec<String>,
    /// Container configuration fields to set (`Cmd`, `Env`, ...), as the request's body.
    pub config: Value,
    /// Whether a running container is frozen while its changes are read.
    pub pause: bool,
}

/// Writes the layer of `upper` (an overlay upper directory) as a tar archive.
pub fn layer_tar(upper: &Path, out: impl std::io::Write) -> std::io::Result<()> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    // A container that never ran has changed nothing: an empty layer.
    if !upper.exists() {
        return b.finish();
    }
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        // An opaque directory hides what the layers below have in it.
        if !rel.as_os_str().is_empty() && xattr_is(&dir, "trusted.overlay.opaque", b"y") {
            whiteout(&mut b, &rel.join(".wh..wh..opq"))?;
        }
        for e in entries {
            let r = rel.join(e.file_name());
            let m = e.path().symlink_metadata()?;
            if m.file_type().is_char_device() && m.rdev() == 0 {
                let name = format!(".wh.{}", e.file_name().to_string_lossy());
                whiteout(&mut b, &rel.join(name))?;
                continue;
            }
            b.append_path_with_name(e.path(), &r)?;
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    b.finish()
}

fn whiteout<W: std::io::Write>(b: &mut tar::Builder<W>, name: &Path) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append_data(&mut h, name, std::io::empty())
}

fn xattr_is(p: &Path, name: &str, want: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(path), Ok(name)) = (std::ffi::CString::new(p.as_os_str().as_bytes()), std::ffi::CString::new(name)) else { return false };
    let mut buf = [0u8; 8];
    // SAFETY: lgetxattr(2) writes at most buf.len() bytes into buf; both strings are NUL-terminated.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    n >= 0 && &buf[..n as usize] == want
}

/// A JSON list (`["a", "b"]`) or the shell form (`a b` → `/bin/sh -c "a b"`).
fn command(arg: &str) -> Value {
    match serde_json::from_str::<Vec<String>>(arg) {
        Ok(v) => json!(v),
        Err(_) => json!(["/bin/sh", "-c", arg]),
    }
}

/// Applies one Dockerfile-style instruction to an image's `config`.
pub fn apply_change(cfg: &mut Value, line: &str) -> Result<(), String> {
    let line = line.trim();
    let (instr, arg) = line.split_once(char::is_whitespace).map(|(a, b)| (a.to_ascii_uppercase(), b.trim())).unwrap_or((line.to_ascii_uppercase(), ""));
    let kv = |arg: &str| -> Vec<(String, String)> {
        if arg.contains('=') {
            arg.split_whitespace().filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string())).collect()
        } else {
            arg.split_once(char::is_whitespace).map(|(k, v)| vec![(k.to_string(), v.trim().to_string())]).unwrap_or_default()
        }
    };
    match instr.as_str() {
        "CMD" => cfg["Cmd"] = command(arg),
        "ENTRYPOINT" => cfg["Entrypoint"] = command(arg),
        "WORKDIR" => cfg["WorkingDir"] = json!(arg),
        "USER" => cfg["User"] = json!(arg),
        "STOPSIGNAL" => cfg["StopSignal"] = json!(arg),
        "ENV" => {
            let mut env: Vec<String> = cfg["Env"].as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default();
            for (k, v) in kv(arg) {
                env.retain(|e| e.split('=').next() != Some(k.as_str()));
                env.push(format!("{k}={v}"));
            }
            cfg["Env"] = json!(env);
        }
        "LABEL" => {
            if !cfg["Labels"].is_object() {
                cfg["Labels"] = json!({});
            }
            for (k, v) in kv(arg) {
                cfg["Labels"][k] = json!(v);
            }
        }
        "EXPOSE" | "VOLUME" => {
            let field = if instr == "EXPOSE" { "ExposedPorts" } else { "Volumes" };
            if !cfg[field].is_object() {
                cfg[field] = json!({});
            }
            let items: Vec<String> = serde_json::from_str(arg).unwrap_or_else(|_| arg.split_whitespace().map(str::to_string).collect());
            for p in items {
                let key = if instr == "EXPOSE" && !p.contains('/') { format!("{p}/tcp") } else { p };
                cfg[field][key] = json!({});
            }
        }
        other => return Err(format!("{other} is not a valid change command (CMD, ENTRYPOINT, ENV, EXPOSE, LABEL, STOPSIGNAL, USER, VOLUME, WORKDIR)")),
    }
    Ok(())
}

impl Runtime {
    /// `docker commit`: returns the new image's id.
    pub async fn commit(&self, key: &str, spec: CommitSpec) -> Result<String, RuntimeError> {
        let c = self.get(key)?;
        let mut doc = self.images.config_document(&c.image_id).map_err(|e| RuntimeError::Conflict(format!("the image of container {}: {e}", c.name())))?;
        // The container's configuration as it runs, then the request's.
        let mut cfg = doc["config"].clone();
        if !cfg.is_object() {
            cfg = json!({});
        }
        cfg["Cmd"] = json!(c.cmd);
        cfg["Entrypoint"] = json!(c.entrypoint);
        cfg["Env"] = json!(c.env);
        cfg["WorkingDir"] = json!(c.cwd);
        cfg["User"] = json!(c.spec.options.user.clone().unwrap_or_default());
        let mut labels = cfg["Labels"].as_object().cloned().unwrap_or_default();
        labels.extend(c.spec.labels.iter().map(|(k, v)| (k.clone(), json!(v))));
        cfg["Labels"] = Value::Object(labels);
        if let Some(o) = spec.config.as_object() {
            for (k, v) in o.iter().filter(|(_, v)| !v.is_null()) {
                cfg[k] = v.clone();
            }
        }
        for line in spec.changes.iter().filter(|l| !l.trim().is_empty()) {
            apply_change(&mut cfg, line).map_err(RuntimeError::BadRequest)?;
        }
        let now = super::log::timestamp(SystemTime::now());
        doc["config"] = cfg;
        doc["created"] = json!(now);
        doc["container"] = json!(c.id);
        doc["author"] = json!(spec.author);
        doc["comment"] = json!(spec.comment);
        let mut history = doc["history"].as_array().cloned().unwrap_or_default();
        history.push(json!({"created": now, "created_by": format!("commit of container {}", c.name()), "author": spec.author, "comment": spec.comment}));
        doc["history"] = json!(history);
        let mut paused_here = spec.pause && matches!(c.state(), super::RunState::Running { .. }) && !c.paused();
        if paused_here {
            if let Err(e) = self.set_paused(&c, true).await {
                // A process that has just ended is gone from runc a moment before its exit
                // is recorded here: then there is nothing to pause.
                let mut exits = c.exits();
                let running = || matches!(c.state(), super::RunState::Running { .. });
                if tokio::time::timeout(std::time::Duration::from_secs(2), exits.wait_for(|_| !running())).await.is_err() {
                    return Err(e);
                }
                paused_here = false;
            }
        }
        let spool = self.spool_dir();
        let made = (|| {
            std::fs::create_dir_all(&spool).map_err(|e| RuntimeError::io(&spool, e))?;
            let n = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
            let tar = spool.join(format!("insitu-commit-{}-{n}.tar", std::process::id()));
            let f = std::fs::File::create(&tar).map_err(|e| RuntimeError::io(&tar, e))?;
            let written = layer_tar(&c.upper_dir(), std::io::BufWriter::new(f))
                .map_err(|e| RuntimeError::Setup(format!("reading the changes of container {}: {e}", c.name())));
            Ok::<_, RuntimeError>((tar, written))
        })();
        if paused_here {
            let _ = self.set_paused(&c, false).await;
        }
        let (tar, written) = made?;
        let id = written
            .and_then(|_| self.images.derive(Some(&c.image_id), &tar, doc, spec.reference.as_deref()).map_err(|e| RuntimeError::BadRequest(e.to_string())));
        let _ = std::fs::remove_file(&tar);
        let id = id?;
        self.container_event(&c, "commit", &[("imageID", id.clone())]);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_apply_as_dockerfile_instructions() {
        let mut cfg = json!({"Env": ["A=1"]});
        for l in ["CMD [\"sh\", \"-c\", \"x\"]", "ENTRYPOINT run me", "ENV A=2 B=3", "LABEL k=v", "EXPOSE 80", "WORKDIR /w", "USER nobody"] {
            apply_change(&mut cfg, l).unwrap();
        }
        assert_eq!(cfg["Cmd"], json!(["sh", "-c", "x"]));
        assert_eq!(cfg["Entrypoint"], json!(["/bin/sh", "-c", "run me"]));
        assert_eq!(cfg["Env"], json!(["A=2", "B=3"]));
        assert_eq!((cfg["Labels"]["k"].as_str(), cfg["WorkingDir"].as_str(), cfg["User"].as_str()), (Some("v"), Some("/w"), Some("nobody")));
        assert!(cfg["ExposedPorts"].get("80/tcp").is_some());
        assert!(apply_change(&mut cfg, "RUN rm -rf /").unwrap_err().contains("RUN"));
    }

    #[test]
    fn a_layer_holds_the_upper_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/new"), "n").unwrap();
        let mut out = Vec::new();
        layer_tar(d.path(), &mut out).unwrap();
        let mut ar = tar::Archive::new(&out[..]);
        let names: Vec<String> = ar.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert_eq!(names, ["etc", "etc/new"]);
    }

    proptest::proptest! {
        #[test]
        fn random_changes_never_panic(s in ".{0,60}") {
            let mut cfg = json!({});
            let _ = apply_change(&mut cfg, &s);
        }
    }
}
