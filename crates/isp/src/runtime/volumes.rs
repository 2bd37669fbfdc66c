// SPDX-License-Identifier: Apache-2.0
//! Named volumes: directories of the private namespace (`volumes/NAME`) that containers
//! bind with `-v NAME:/DST`, made on first use or by `docker volume create`, with their
//! labels and creation time kept beside them (`volumes.meta/NAME.json`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use super::{parse_bind, BindSource, Runtime, RuntimeError};

/// The label of a volume made without a name (moby's), which `volume prune` takes
/// without `all=true`.
pub const ANONYMOUS_LABEL: &str = "com.docker.volume.anonymous";

/// A named volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Its name.
    pub name: String,
    /// Where it is on the target.
    pub mountpoint: PathBuf,
    /// Labels given at create.
    pub labels: BTreeMap<String, String>,
    /// When it was made, seconds since the epoch.
    pub created: u64,
}

#[derive(Serialize, Deserialize, Default)]
struct VolumeMeta {
    labels: BTreeMap<String, String>,
    created: u64,
}

/// Whether `n` may name a volume.
fn valid(n: &str) -> bool {
    !n.is_empty() && n.len() <= 128 && n.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) && n.starts_with(|c: char| c.is_ascii_alphanumeric())
}

impl Runtime {
    fn volumes_dir(&self) -> PathBuf {
        self.root.parent().unwrap_or(&self.root).join("volumes")
    }

    fn volume_meta(&self, name: &str) -> PathBuf {
        self.root.parent().unwrap_or(&self.root).join("volumes.meta").join(format!("{name}.json"))
    }

    fn volume(&self, name: &str) -> Option<Volume> {
        let mountpoint = self.volumes_dir().join(name);
        let m = std::fs::metadata(&mountpoint).ok().filter(|m| m.is_dir())?;
        let meta: VolumeMeta = std::fs::read(self.volume_meta(name)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_else(|| VolumeMeta {
            labels: BTreeMap::new(),
            created: m.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs()),
        });
        Some(Volume { name: name.to_string(), mountpoint, labels: meta.labels, created: meta.created })
    }

    /// `docker volume create`: makes the volume (a name taken already is that volume,
    /// as with Docker); `None` names it at random and labels it [`ANONYMOUS_LABEL`], as
    /// moby does, so that `volume prune` takes it.
    pub fn volume_create(&self, name: Option<&str>, mut labels: BTreeMap<String, String>) -> Result<Volume, RuntimeError> {
        if name.is_none_or(str::is_empty) {
            labels.insert(ANONYMOUS_LABEL.into(), String::new());
        }
        let name = match name.filter(|n| !n.is_empty()) {
            Some(n) if valid(n) => n.to_string(),
            Some(n) => {
                return Err(RuntimeError::BadRequest(format!(
                    "create {n}: \"{n}\" includes invalid characters for a local volume name, only \"[a-zA-Z0-9][a-zA-Z0-9_.-]\" are allowed"
                )))
            }
            None => super::random_id(),
        };
        if let Some(v) = self.volume(&name) {
            return Ok(v);
        }
        let dir = self.volumes_dir().join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::io(&dir, e))?;
        let meta = VolumeMeta { labels, created: SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()) };
        let p = self.volume_meta(&name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RuntimeError::io(parent, e))?;
        }
        std::fs::write(&p, serde_json::to_vec(&meta).unwrap_or_default()).map_err(|e| RuntimeError::io(&p, e))?;
        self.events.emit("volume", "create", &name, [("driver".to_string(), "local".to_string())].into());
        self.volume(&name).ok_or_else(|| RuntimeError::Setup(format!("volume {name} vanished as it was made")))
    }

    /// Makes the anonymous volume `name` of a container's `Config.Volumes` (labelled as
    /// an API volume made without a name) unless it is there.
    pub(super) fn anonymous_volume(&self, name: &str) -> Result<(), RuntimeError> {
        if std::fs::metadata(self.volume_meta(name)).is_err() {
            // Its directory may be there already (binds are checked before); the record
            // makes it a volume.
            let _ = std::fs::remove_dir(self.volumes_dir().join(name));
            self.volume_create(Some(name), [(ANONYMOUS_LABEL.to_string(), String::new())].into())?;
        }
        Ok(())
    }

    /// Every volume, by name.
    pub fn volume_list(&self) -> Vec<Volume> {
        let mut names: Vec<String> =
            std::fs::read_dir(self.volumes_dir()).map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
        names.sort();
        names.iter().filter_map(|n| self.volume(n)).collect()
    }

    /// A volume by name.
    pub fn volume_get(&self, name: &str) -> Result<Volume, RuntimeError> {
        if !valid(name) {
            return Err(RuntimeError::NotFound(format!("volume {name}")));
        }
        self.volume(name).ok_or_else(|| RuntimeError::NotFound(format!("volume {name}")))
    }

    /// The containers that bind volume `name`.
    pub fn volume_users(&self, name: &str) -> Vec<String> {
        self.list()
            .into_iter()
            .filter(|c| c.spec.binds.iter().any(|b| matches!(parse_bind(b), Ok((BindSource::Volume(v), _, _)) if v == name)))
            .map(|c| c.id.clone())
            .collect()
    }

    /// Removes the anonymous volumes of removed container `c` (`rm -v`, `--rm`); one
    /// another container binds too is kept.
    pub fn remove_anonymous_volumes(&self, c: &super::Container) {
        for v in &c.spec.anonymous_volumes {
            if self.volume_users(v).is_empty() {
                let _ = self.volume_remove(v, false);
            }
        }
    }

    /// `docker volume rm`: refused while a container binds it (unless `force` and none
    /// runs); returns the bytes it held.
    pub fn volume_remove(&self, name: &str, force: bool) -> Result<u64, RuntimeError> {
        let v = self.volume_get(name)?;
        let users = self.volume_users(name);
        let running = users.iter().filter_map(|id| self.get(id).ok()).any(|c| matches!(c.state(), super::RunState::Running { .. }));
        if !users.is_empty() && (!force || running) {
            let ids: Vec<&str> = users.iter().map(|u| &u[..12]).collect();
            return Err(RuntimeError::Conflict(format!("remove {name}: volume is in use - [{}]", ids.join(", "))));
        }
        let size = crate::image::layer_size(&v.mountpoint);
        std::fs::remove_dir_all(&v.mountpoint).map_err(|e| RuntimeError::io(&v.mountpoint, e))?;
        let _ = std::fs::remove_file(self.volume_meta(name));
        self.events.emit("volume", "destroy", name, [("driver".to_string(), "local".to_string())].into());
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn volume_names_are_checked() {
        assert!(super::valid("data-1.v_2"));
        for bad in ["", "-x", "a/b", "..", "a b"] {
            assert!(!super::valid(bad), "{bad}");
        }
    }
}
