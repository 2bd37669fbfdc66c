// SPDX-License-Identifier: Apache-2.0
//! What happens to containers, images and volumes, for `docker events`: each event goes
//! to the clients following the stream and into a bounded history that `since` replays.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;
use tokio::sync::broadcast;

/// How many past events are kept for `since`.
const HISTORY: usize = 1024;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `container`, `image` or `volume`.
    pub kind: &'static str,
    /// `create`, `start`, `die`, `destroy`, `pull`, `tag`, ...
    pub action: String,
    /// The object's id (or name, for images and volumes).
    pub id: String,
    /// `name`, `image`, `exitCode`, the labels, ...
    pub attributes: BTreeMap<String, String>,
    /// When it happened.
    pub time: SystemTime,
}

/// The events of a target.
pub struct Events {
    tx: broadcast::Sender<Event>,
    history: Mutex<VecDeque<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        Events { tx: broadcast::channel(HISTORY).0, history: Mutex::new(VecDeque::new()) }
    }
}

impl Events {
    /// Records an event and sends it to every follower.
    pub fn emit(&self, kind: &'static str, action: &str, id: &str, attributes: BTreeMap<String, String>) {
        let e = Event { kind, action: action.to_string(), id: id.to_string(), attributes, time: SystemTime::now() };
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(e.clone());
        // Sent under the lock, so that a follower who takes the history and subscribes
        // at once sees each event exactly once.
        let _ = self.tx.send(e);
    }

    /// The past events and a receiver of those to come.
    pub fn follow(&self) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        (h.iter().cloned().collect(), self.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_bounded_and_followers_see_what_comes() {
        let ev = Events::default();
        for i in 0..HISTORY + 5 {
            ev.emit("container", "create", &i.to_string(), BTreeMap::new());
        }
        let (past, mut rx) = ev.follow();
        assert_eq!(past.len(), HISTORY);
        assert_eq!(past[0].id, "5");
        ev.emit("image", "tag", "x", BTreeMap::new());
        assert_eq!(rx.try_recv().unwrap().action, "tag");
    }
}
