// SPDX-License-Identifier: Apache-2.0
//! Container operations besides the life cycle proper: `rename`, `prune`, `pause` and
//! `unpause`, and the container events they and the life cycle record.

use std::collections::BTreeMap;

use super::{valid_name, Container, RunState, Runtime, RuntimeError};

impl Runtime {
    /// Records an event of container `c` (its name, image and labels as attributes, as
    /// Docker gives them), with `extra` attributes.
    pub(crate) fn container_event(&self, c: &Container, action: &str, extra: &[(&str, String)]) {
        let mut a: BTreeMap<String, String> = c.spec.labels.clone();
        a.insert("name".into(), c.name());
        a.insert("image".into(), c.spec.image.clone());
        for (k, v) in extra {
            a.insert((*k).to_string(), v.clone());
        }
        self.events.emit("container", action, &c.id, a);
    }

    /// `docker rename`: a new name, free among the target's containers.
    pub fn rename(&self, key: &str, new: &str) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        let new = new.trim_start_matches('/');
        if new.is_empty() {
            return Err(RuntimeError::BadRequest("Neither old nor new names may be empty".into()));
        }
        let new = valid_name(new)?;
        // Under the containers' lock, so two renames cannot take one name.
        let all = self.all();
        if c.name() == new {
            return Err(RuntimeError::Conflict(format!("Renaming a container with the same name as its current name ({new})")));
        }
        if all.values().any(|x| x.name() == new) {
            return Err(RuntimeError::Conflict(format!(
                "Conflict. The container name \"/{new}\" is already in use. Remove that container or choose another name."
            )));
        }
        let old = c.name();
        c.set_name(&new)?;
        self.container_event(&c, "rename", &[("oldName", format!("/{old}"))]);
        Ok(())
    }

    /// `docker container prune`: removes those of the containers `ids` that are not
    /// running; returns their ids.
    pub async fn prune(&self, ids: Vec<String>) -> Vec<String> {
        let stopped: Vec<_> = ids.iter().filter_map(|id| self.get(id).ok()).filter(|c| !matches!(c.state(), RunState::Running { .. })).collect();
        let mut gone = Vec::new();
        for c in stopped {
            if self.remove(&c.id, false).await.is_ok() {
                gone.push(c.id.clone());
            }
        }
        gone
    }

    /// `docker pause` / `docker unpause`: freezes or thaws every process of a running
    /// container (the cgroup freezer, through runc).
    pub async fn pause(&self, key: &str, pause: bool) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        if !matches!(c.state(), RunState::Running { .. }) {
            return Err(RuntimeError::Conflict(format!("Container {} is not running", &c.id[..12])));
        }
        if c.paused() == pause {
            let m = if pause { "is already paused" } else { "is not paused" };
            return Err(RuntimeError::Conflict(format!("Container {} {m}", &c.id[..12])));
        }
        self.set_paused(&c, pause).await?;
        self.container_event(&c, if pause { "pause" } else { "unpause" }, &[]);
        Ok(())
    }

    /// Freezes or thaws a running container's processes; nothing when already so.
    pub(super) async fn set_paused(&self, c: &Container, pause: bool) -> Result<(), RuntimeError> {
        if c.paused() == pause {
            return Ok(());
        }
        let verb = if pause { "pause" } else { "resume" };
        let out = tokio::process::Command::new("runc")
            .arg("--root")
            .arg(&self.runc_root)
            .args([verb, &c.id])
            .output()
            .await
            .map_err(|e| RuntimeError::Setup(format!("runc {verb}: {e}")))?;
        if !out.status.success() {
            return Err(RuntimeError::Setup(format!("runc {verb} {}: {}", &c.id[..12], String::from_utf8_lossy(&out.stderr).trim())));
        }
        c.lock().paused = pause;
        Ok(())
    }
}
