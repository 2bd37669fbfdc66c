// SPDX-License-Identifier: Apache-2.0
//! Detach keys: leaving a TTY container running while its attached client goes away.
//!
//! As with Docker, an attach with standard input to a TTY container watches what the
//! client types for the detach sequence (`ctrl-p,ctrl-q` unless the attach's `detachKeys`
//! names another). On the whole sequence the server swallows it, stops forwarding and
//! closes the attach stream; the container keeps running. Bytes that start the sequence
//! are held until the next byte shows whether the sequence goes on, and are delivered
//! unchanged when it does not, so a lone ctrl-p still reaches the program.
//!
//! Docker does this only with a terminal: without one the input is passed through as is
//! (Moby's `copyEscapable` runs for TTY attaches only), and so it is here. The docker CLI
//! also watches for the sequence on its side and, on it, simply hangs up: the server then
//! sees the end of the client's input, never the sequence.
//!
//! A container's standard input is one channel, handed to one attach at a time
//! ([`crate::runtime::Container::take_stdin`]). After a TTY attach ends (detached or
//! hung up; a terminal has no end of input to pass on) the channel is kept here,
//! [`ParkedStdins`], for the next `docker attach`, until the run it feeds ends.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

use crate::runtime::ExitEvent;

/// Docker's default detach sequence: ctrl-p, ctrl-q.
pub(crate) const DEFAULT_KEYS: [u8; 2] = [0x10, 0x11];

/// The control keys a spec may name, in code order (`ctrl-@` is 0, `ctrl-_` is 31).
const CTRL_KEYS: &[u8; 32] = b"@abcdefghijklmnopqrstuvwxyz[\\]^_";

/// Parses a detach-keys spec as Docker does: comma-separated keys, each `ctrl-X` with X
/// one of `a`-`z @ [ \ ] ^ _` (lower case), `DEL`, or a single character.
pub(crate) fn parse_keys(spec: &str) -> Result<Vec<u8>, String> {
    let bad = |key: &str, why: &str| {
        format!(
            "invalid detach keys {spec:?}: {why} {key:?}; give comma-separated keys, each ctrl-X (X one of a-z, @, [, \\, ], ^, _), DEL, or one character, e.g. ctrl-p,ctrl-q"
        )
    };
    spec.split(',')
        .map(|key| match key.as_bytes() {
            [b] if b.is_ascii() => Ok(*b),
            [b'c', b't', b'r', b'l', b'-', x] => CTRL_KEYS.iter().position(|c| c == x).map(|code| code as u8).ok_or_else(|| bad(key, "no such control key")),
            b"DEL" => Ok(0x7f),
            [] => Err(bad(key, "empty key")),
            _ => Err(bad(key, "unknown key")),
        })
        .collect()
}

/// The detach sequence an attach asked for: its `detachKeys`, or the default when absent.
pub(crate) fn keys_of(spec: Option<&str>) -> Result<Vec<u8>, String> {
    spec.map_or_else(|| Ok(DEFAULT_KEYS.to_vec()), parse_keys)
}

/// Finds the detach sequence in a stream of input, read by read.
///
/// Bytes that may begin the sequence are held back; the rest pass through in order. The
/// sequence is found wherever it ends, also after a false start that overlaps it
/// (`ctrl-p ctrl-p ctrl-q` detaches), by the usual prefix-function automaton.
pub(crate) struct EscapeMatcher {
    keys: Vec<u8>,
    /// `fallback[i]`: the length of the longest proper prefix of `keys[..=i]` that is
    /// also its suffix, where a match that breaks after `i + 1` keys resumes.
    fallback: Vec<usize>,
    /// How many keys of the sequence the input's last bytes match (`keys[..held]` is held).
    held: usize,
}

/// What one read of input comes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Forward these bytes (possibly none: all held).
    Forward(Vec<u8>),
    /// The sequence is complete: forward these bytes, which came before it, then detach.
    /// Whatever followed the sequence in the read is dropped.
    Detach(Vec<u8>),
}

impl EscapeMatcher {
    /// A matcher for `keys` (not empty: [`parse_keys`] never returns an empty sequence).
    pub(crate) fn new(keys: Vec<u8>) -> EscapeMatcher {
        let mut fallback = vec![0; keys.len()];
        let mut k = 0;
        for i in 1..keys.len() {
            while k > 0 && keys[i] != keys[k] {
                k = fallback[k - 1];
            }
            if keys[i] == keys[k] {
                k += 1;
            }
            fallback[i] = k;
        }
        EscapeMatcher { keys, fallback, held: 0 }
    }

    /// Scans one read of input.
    pub(crate) fn scan(&mut self, input: &[u8]) -> Scan {
        let mut out = Vec::with_capacity(input.len() + self.held);
        for &b in input {
            let before = self.held;
            let mut q = before;
            while q > 0 && self.keys[q] != b {
                q = self.fallback[q - 1];
            }
            if self.keys.get(q) == Some(&b) {
                q += 1;
            }
            // The window was keys[..before] + b; what no longer fits the match leaves it,
            // oldest first.
            let leaving = before + 1 - q;
            if leaving > before {
                out.extend_from_slice(&self.keys[..before]);
                out.push(b);
            } else {
                out.extend_from_slice(&self.keys[..leaving]);
            }
            self.held = q;
            if q == self.keys.len() {
                self.held = 0;
                return Scan::Detach(out);
            }
        }
        Scan::Forward(out)
    }

    /// At the end of input: the bytes still held (a sequence begun but not finished),
    /// which were the client's input after all.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let held = self.keys[..self.held].to_vec();
        self.held = 0;
        held
    }
}

/// The standard inputs of TTY containers whose attach ended while they run, for the next
/// attach to take up.
#[derive(Default)]
pub(crate) struct ParkedStdins {
    slots: Mutex<HashMap<String, (u64, mpsc::UnboundedSender<Bytes>)>>,
    tickets: AtomicU64,
    parked: Notify,
}

impl ParkedStdins {
    /// Keeps `tx`, the input of container `id`'s run that had ended `exits_before` runs
    /// when it was taken, until the next [`ParkedStdins::take`] or until that run ends
    /// (then it is dropped, so that nothing holds the ended run's terminal open).
    pub(crate) fn park(self: &Arc<Self>, id: &str, tx: mpsc::UnboundedSender<Bytes>, mut exits: watch::Receiver<ExitEvent>, exits_before: u64) {
        // A run that already ended (or a process that no longer reads) needs no input.
        let ended = move |e: &ExitEvent| e.exits > exits_before || e.removed;
        if tx.is_closed() || ended(&exits.borrow()) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id.to_string(), (ticket, tx));
        self.parked.notify_waiters();
        let (me, id) = (self.clone(), id.to_string());
        handle.spawn(async move {
            // An error is the container dropped: its run is over too.
            let _ = exits.wait_for(ended).await;
            let mut slots = me.lock();
            if slots.get(&id).is_some_and(|(t, _)| *t == ticket) {
                slots.remove(&id);
            }
        });
    }

    /// The parked input of container `id`, if its run still reads it.
    pub(crate) fn take(&self, id: &str) -> Option<mpsc::UnboundedSender<Bytes>> {
        self.lock().remove(id).map(|(_, tx)| tx).filter(|tx| !tx.is_closed())
    }

    /// The parked input of container `id`, waiting up to `patience` for it to be parked.
    ///
    /// A client that detaches hangs up, and the server sees that end of input a moment
    /// later; a `docker attach` made right after can arrive first, while the ended
    /// attach still holds the input. Without the wait its typing would go nowhere.
    pub(crate) async fn take_within(&self, id: &str, patience: Duration) -> Option<mpsc::UnboundedSender<Bytes>> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let parked = self.parked.notified();
            tokio::pin!(parked);
            parked.as_mut().enable();
            if let Some(tx) = self.take(id) {
                return Some(tx);
            }
            if tokio::time::timeout_at(deadline, parked).await.is_err() {
                return None;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, mpsc::UnboundedSender<Bytes>)>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn specs_parse_as_docker_reads_them() {
        assert_eq!(parse_keys("ctrl-p,ctrl-q").unwrap(), DEFAULT_KEYS);
        assert_eq!(parse_keys("ctrl-a,a").unwrap(), [1, b'a']);
        assert_eq!(parse_keys("ctrl-@,ctrl-[,ctrl-\\,ctrl-],ctrl-^,ctrl-_,ctrl-z").unwrap(), [0, 27, 28, 29, 30, 31, 26]);
        assert!(parse_keys("DEL,,,x").unwrap_err().contains("empty key"));
        assert_eq!(parse_keys("DEL").unwrap(), [0x7f]);
        assert!(parse_keys(",").unwrap_err().contains("empty key"));
        for bad in ["", "ctrl-P", "ctrl-1", "ctrl-", "ctrl-pp", "Ctrl-p", "ab", "é", "ctrl-p,", "del"] {
            let e = parse_keys(bad).unwrap_err();
            assert!(e.contains("invalid detach keys") && e.contains("ctrl-p,ctrl-q"), "{bad:?}: {e}");
        }
        assert_eq!(keys_of(None).unwrap(), DEFAULT_KEYS);
        assert_eq!(keys_of(Some("x")).unwrap(), b"x");
    }

    fn scan_all(keys: &[u8], reads: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut m = EscapeMatcher::new(keys.to_vec());
        let mut out = Vec::new();
        for r in reads {
            match m.scan(r) {
                Scan::Forward(b) => out.extend(b),
                Scan::Detach(b) => {
                    out.extend(b);
                    return (out, true);
                }
            }
        }
        out.extend(m.finish());
        (out, false)
    }

    #[test]
    fn the_whole_sequence_detaches_and_is_swallowed() {
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"ls\n\x10\x11after"]), (b"ls\n".to_vec(), true));
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"\x10\x11"]), (vec![], true));
        assert_eq!(scan_all(b"\x01a", &[b"x\x01a"]), (b"x".to_vec(), true));
    }

    #[test]
    fn a_partial_match_then_other_bytes_passes_everything_in_order() {
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"a\x10b\x11"]), (b"a\x10b\x11".to_vec(), false));
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"\x10", b"x"]), (b"\x10x".to_vec(), false));
        // A lone ctrl-p at the end of input still reaches the program.
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"\x10"]), (b"\x10".to_vec(), false));
        // A false start that overlaps the sequence: the first ctrl-p passes, the rest detaches.
        assert_eq!(scan_all(&DEFAULT_KEYS, &[b"\x10\x10\x11"]), (b"\x10".to_vec(), true));
        assert_eq!(scan_all(b"aab", &[b"aaab"]), (b"a".to_vec(), true));
        assert_eq!(scan_all(b"abac", &[b"ababac"]), (b"ab".to_vec(), true));
        assert_eq!(scan_all(b"abac", &[b"abab", b"x"]), (b"ababx".to_vec(), false));
    }

    #[test]
    fn the_sequence_split_across_reads_detaches() {
        let mut m = EscapeMatcher::new(DEFAULT_KEYS.to_vec());
        assert_eq!(m.scan(b"hi\x10"), Scan::Forward(b"hi".to_vec()));
        assert_eq!(m.scan(b""), Scan::Forward(vec![]));
        assert_eq!(m.scan(b"\x11rest"), Scan::Detach(vec![]));
        assert_eq!(scan_all(b"ctrl", &[b"c", b"t", b"r", b"l"]), (vec![], true));
    }

    /// The matcher against the plain definition: the output is the input up to the first
    /// occurrence of the sequence (whole input if none), and it detaches iff there is one.
    fn model(keys: &[u8], input: &[u8]) -> (Vec<u8>, bool) {
        match input.windows(keys.len()).position(|w| w == keys) {
            Some(at) => (input[..at].to_vec(), true),
            None => (input.to_vec(), false),
        }
    }

    proptest! {
        #[test]
        fn random_specs_are_refused_or_give_a_sequence(spec in ".{0,40}") {
            if let Ok(keys) = parse_keys(&spec) {
                prop_assert!(!keys.is_empty());
                prop_assert_eq!(keys.len(), spec.split(',').count());
            }
        }

        #[test]
        fn well_formed_specs_read_back(keys in proptest::collection::vec(prop_oneof![Just("ctrl-".to_string()), Just(String::new())].prop_flat_map(|p| {
            let set = if p.is_empty() { "[a-zA-Z0-9 !-+.-~]" } else { "[a-z@\\[\\\\\\]^_]" };
            proptest::string::string_regex(set).unwrap().prop_map(move |c| format!("{p}{c}"))
        }), 1..6)) {
            let spec = keys.join(",");
            let parsed = parse_keys(&spec).unwrap();
            prop_assert_eq!(parsed.len(), keys.len());
            for (k, b) in keys.iter().zip(parsed) {
                match k.strip_prefix("ctrl-") {
                    Some(x) => prop_assert_eq!(b, x.as_bytes()[0] & 0x1f),
                    None => prop_assert_eq!(b, k.as_bytes()[0]),
                }
            }
        }

        #[test]
        fn the_matcher_agrees_with_the_definition(
            keys in proptest::collection::vec(0u8..3, 1..5),
            input in proptest::collection::vec(0u8..3, 0..40),
            cuts in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
            cuts.sort_unstable();
            let mut reads = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([input.len()]) {
                reads.push(&input[from..c]);
                from = c;
            }
            prop_assert_eq!(scan_all(&keys, &reads), model(&keys, &input));
        }
    }

    /// The race a `docker attach` right after a detach runs: the new attach asks for the
    /// input before the ended one has parked it. It must wait for it, not go without.
    #[tokio::test]
    async fn an_input_parked_a_moment_after_the_ask_is_taken() {
        let parked = Arc::new(ParkedStdins::default());
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        let (_exits_tx, exits) = watch::channel(ExitEvent::default());
        let later = parked.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            later.park("c1", tx, exits, 0);
        });
        assert!(parked.take("c1").is_none(), "nothing is parked yet");
        let got = parked.take_within("c1", Duration::from_secs(5)).await.expect("the input, once parked");
        got.send(Bytes::from_static(b"x")).unwrap();
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"x"));
        // Nobody parks for another container: the wait ends empty at its limit.
        assert!(parked.take_within("c2", Duration::from_millis(20)).await.is_none());
    }
}
