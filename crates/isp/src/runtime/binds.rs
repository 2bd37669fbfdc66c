// SPDX-License-Identifier: Apache-2.0
//! What a container binds: `/data`, `/kv`, volumes of the private namespace, and the
//! pre-allocated files of the sharable namespace it writes in place (checked with FIEMAP,
//! served by [`WritableFiles`], fenced against the host's writes).

use super::*;

impl Runtime {
    /// The bind mounts of a container: `/data` (the sharable namespace, read-only), `/kv`
    /// (the KV store, read-write) and each `-v`: an absolute source is a path of the
    /// sharable namespace (read-only, or a pre-allocated file written in place with
    /// `:rw`), a bare name a volume in the private namespace (writable).
    pub(super) fn binds(&self, spec: &CreateSpec) -> Result<Vec<Bind>, RuntimeError> {
        let mut out = Vec::new();
        if let Some(v) = &self.view {
            out.push(Bind::Path { src: v.path().to_string_lossy().into_owned(), dst: "/data".to_string(), ro: true });
        }
        if let Some(kv) = &self.kv_dir {
            out.push(Bind::Path { src: kv.to_string_lossy().into_owned(), dst: KV_MOUNT.to_string(), ro: false });
        }
        for b in &spec.binds {
            let (source, dst, access) = parse_bind(b).map_err(RuntimeError::BadRequest)?;
            match source {
                BindSource::Sharable(rel) => {
                    let src = format!("/{rel}");
                    let Some(v) = &self.view else {
                        return Err(RuntimeError::BadRequest(format!("{src}: this target has no sharable namespace to bind from")));
                    };
                    if access == Some(true) {
                        out.push(Bind::File { rel, src, dst });
                        continue;
                    }
                    let joined = v.path().join(&rel);
                    // A symbolic link of the host's file system must not lead the bind to
                    // the target's own files.
                    let path = match std::fs::canonicalize(&joined) {
                        Ok(p) => inside_view(v, &p, &src)?,
                        Err(_) => joined,
                    };
                    out.push(Bind::Path { src: path.to_string_lossy().into_owned(), dst, ro: true });
                }
                BindSource::Volume(name) => {
                    let path = self.root.parent().unwrap_or(&self.root).join("volumes").join(name);
                    std::fs::create_dir_all(&path).map_err(|e| RuntimeError::io(&path, e))?;
                    out.push(Bind::Path { src: path.to_string_lossy().into_owned(), dst, ro: access == Some(false) });
                }
            }
        }
        Ok(out)
    }

    /// The file `src` (`rel` below the view's root) as a container may write it: a
    /// regular file of the sharable namespace whose every byte lives in a written extent
    /// of its own. Looked up on the view as it is now (refresh it first).
    pub(super) fn probe(&self, rel: &str, src: &str, dst: &str) -> Result<(ExtentMap, std::fs::Metadata), RuntimeError> {
        let bad = |why: String| RuntimeError::BadRequest(format!("{src}: {why}"));
        let Some(v) = &self.view else { return Err(bad("this target has no sharable namespace to bind from".into())) };
        let Some(image) = v.image() else { return Err(bad("this target has no sharable namespace to bind from".into())) };
        let canonical = std::fs::canonicalize(v.path().join(rel))
            .map_err(|e| bad(format!("{e} in the sharable namespace (create and pre-allocate it on the host, then `sync`)")))?;
        let path = inside_view(v, &canonical, src)?;
        let meta = std::fs::metadata(&path).map_err(|e| bad(e.to_string()))?;
        if meta.is_dir() {
            return Err(bad(format!(
                "a directory, and directories of the sharable namespace are read-only to containers (the host owns its file system): \
                 bind a file the host pre-allocated instead (e.g. -v {}/out.bin:{dst}:rw), or write to a volume of the target's \
                 private space (-v results:{dst})",
                src.trim_end_matches('/')
            )));
        }
        if !meta.is_file() {
            return Err(bad("not a regular file; containers write only regular files the host pre-allocated".into()));
        }
        let file = std::fs::File::open(&path).map_err(|e| bad(e.to_string()))?;
        let raw = extents::fiemap(&file)
            .map_err(|e| bad(format!("its extents cannot be read (FIEMAP: {e}); the sharable namespace's file system must report them (ext4, xfs)")))?;
        let device = media_len(image).map_err(|e| RuntimeError::io(image, e))?;
        let map = ExtentMap::new(meta.len(), &raw, device).map_err(|u| bad(format!("cannot be written by a container: {u}")))?;
        Ok((map, meta))
    }

    /// Resolves a container's bindings for a run: each writable file gets its entry in the
    /// FUSE mount and a fence on its blocks, recorded in the container so that the run's
    /// end releases them. On error nothing stays held.
    pub(crate) fn mounts(&self, c: &Container) -> Result<Vec<(String, String, bool)>, RuntimeError> {
        let binds = self.binds(&c.spec)?;
        let mut out = Vec::with_capacity(binds.len());
        for b in binds {
            match b {
                Bind::Path { src, dst, ro } => out.push((src, dst, ro)),
                Bind::File { rel, src, dst } => match self.hold_file(c, &rel, &src, &dst) {
                    Ok(path) => out.push((path.to_string_lossy().into_owned(), dst, false)),
                    Err(e) => {
                        self.release_files(c);
                        return Err(e);
                    }
                },
            }
        }
        Ok(out)
    }

    pub(super) fn hold_file(&self, c: &Container, rel: &str, src: &str, dst: &str) -> Result<PathBuf, RuntimeError> {
        let (map, meta) = self.probe(rel, src, dst)?;
        let files = self.writable_files()?;
        let extents = map.fence();
        let (ino, path) = files.add(map, &meta, src)?;
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let id = match fence.map(|f| f.hold(rel, &extents)).transpose() {
            Ok(id) => id,
            Err(e) => {
                files.remove(ino);
                return Err(RuntimeError::Setup(format!("{src}: cannot fence its blocks against host writes: {e}")));
            }
        };
        c.lock().held.push(HeldFile { ino, fence: id });
        Ok(path)
    }

    /// Releases the writable files of a container's run: their entries go (the data is
    /// on the media already) and so do their fences, which refreshes the view.
    pub(crate) fn release_files(&self, c: &Container) {
        let held = std::mem::take(&mut c.lock().held);
        if held.is_empty() {
            return;
        }
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for h in held {
            if let Some(f) = &files {
                f.remove(h.ino);
            }
            if let (Some(f), Some(id)) = (&fence, h.fence) {
                f.release(id);
            }
        }
    }

    pub(super) fn writable_files(&self) -> Result<Arc<WritableFiles>, RuntimeError> {
        let mut g = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &*g {
            return Ok(f.clone());
        }
        let image = self.view.as_ref().and_then(|v| v.image()).ok_or_else(|| RuntimeError::BadRequest("this target has no sharable namespace".into()))?;
        let dir = self.runc_root.parent().unwrap_or(&self.runc_root).join("files");
        let f = Arc::new(WritableFiles::mount(&dir, image)?);
        *g = Some(f.clone());
        Ok(f)
    }
}

/// `path` (canonical) if it lies in the view of the sharable namespace, on its file system.
fn inside_view(v: &SharableView, path: &Path, src: &str) -> Result<PathBuf, RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    let root = v.path();
    let same_fs = || Some(std::fs::metadata(&root).ok()?.dev() == std::fs::metadata(path).ok()?.dev());
    if !path.starts_with(&root) || same_fs() == Some(false) {
        return Err(RuntimeError::BadRequest(format!("{src}: leads outside the sharable namespace (a symbolic link?); bind the path it points to")));
    }
    Ok(path.to_path_buf())
}

/// Bytes of a file or block device.
fn media_len(p: &Path) -> std::io::Result<u64> {
    use std::io::Seek;
    std::fs::File::open(p)?.seek(std::io::SeekFrom::End(0))
}
