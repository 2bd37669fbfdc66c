// SPDX-License-Identifier: Apache-2.0
//! The target's side of the bridge: which host owns it, the receives it posted (held until a
//! frame comes), frames waiting for a receive, and counters.

use crate::{MAX_HELD_RECEIVES, MAX_QUEUED_FRAMES, STATUS_BRIDGE_BUSY, STATUS_TOO_MANY_RECEIVES};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A RECEIVE_FRAME the host posted, as the transport holds it: it can be completed once,
/// with a frame, or refused.
pub trait Upcall: Send {
    /// Who posted it: the host's association (controller). Compared with `==`.
    type Owner: PartialEq + Send;

    /// The association that posted this receive.
    fn owner(&self) -> Self::Owner;

    /// Whether `owner`'s association still exists; when it does not, the next host to
    /// post a receive takes the bridge over.
    fn owner_alive(owner: &Self::Owner) -> bool;

    /// Completes the receive successfully with `frame` as its data (empty: nothing came
    /// in time, post again) and `seq`, the frame's sequence number, in dword 1. Returns
    /// false when the host can no longer be reached (the frame went nowhere).
    fn deliver(self, frame: &[u8], seq: u32) -> bool;

    /// Completes the receive with an error status field.
    fn refuse(self, status: u16);
}

/// What [`Switch::post`] did with a receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// Held until a frame arrives.
    Held,
    /// Completed at once with a frame that was waiting.
    Delivered,
    /// Refused with this status field (another host owns the bridge, or too many held).
    Refused(u16),
}

/// Frames and bytes each way, and what was dropped or refused.
#[derive(Debug, Default)]
pub struct Counters {
    frames_to_host: AtomicU64,
    bytes_to_host: AtomicU64,
    frames_from_host: AtomicU64,
    bytes_from_host: AtomicU64,
    dropped: AtomicU64,
    refused: AtomicU64,
    idle: AtomicU64,
}

/// The counters at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// Frames delivered to the host in RECEIVE_FRAME completions.
    pub frames_to_host: u64,
    /// Their bytes.
    pub bytes_to_host: u64,
    /// Frames the host sent in TRANSMIT_FRAME commands that reached the interface.
    pub frames_from_host: u64,
    /// Their bytes.
    pub bytes_from_host: u64,
    /// Frames for the host dropped: the queue was full, or no host had posted a receive.
    pub dropped: u64,
    /// Frame commands refused (bad length, busy bridge, too many receives).
    pub refused: u64,
    /// Receives completed empty because nothing came in time.
    pub idle: u64,
}

impl Counters {
    /// Counts a frame that went from the host into the interface.
    pub fn from_host(&self, bytes: usize) {
        self.frames_from_host.fetch_add(1, Ordering::Relaxed);
        self.bytes_from_host.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a refused frame command.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    fn to_host(&self, bytes: usize) {
        self.frames_to_host.fetch_add(1, Ordering::Relaxed);
        self.bytes_to_host.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> CountersSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CountersSnapshot {
            frames_to_host: l(&self.frames_to_host),
            bytes_to_host: l(&self.bytes_to_host),
            frames_from_host: l(&self.frames_from_host),
            bytes_from_host: l(&self.bytes_from_host),
            dropped: l(&self.dropped),
            refused: l(&self.refused),
            idle: l(&self.idle),
        }
    }
}

struct State<U: Upcall> {
    /// The association whose receives the bridge completes.
    owner: Option<U::Owner>,
    /// Its receives, oldest first, with when each was posted.
    held: VecDeque<(U, Instant)>,
    /// Frames for it while no receive is held, oldest first.
    queued: VecDeque<Vec<u8>>,
    /// The next frame's sequence number (restarts at 0 for a new owner).
    seq: u32,
}

/// The target's end of an Ether-oN bridge. One host association owns it at a time: the
/// first to post a receive; another may take over once that one is gone. Frames from the
/// interface complete the owner's held receives in the order they were posted, or wait in
/// a bounded queue; beyond it they are dropped, as Ethernet may drop.
pub struct Switch<U: Upcall> {
    state: Mutex<State<U>>,
    counters: Arc<Counters>,
    max_held: usize,
    max_queued: usize,
}

/// What to complete after the lock is released.
enum After<U> {
    Nothing,
    Deliver(U, Vec<u8>, u32),
    Refuse(U, u16),
}

impl<U: Upcall> Switch<U> {
    /// A switch holding at most [`MAX_HELD_RECEIVES`] receives and queueing at most
    /// [`MAX_QUEUED_FRAMES`] frames.
    pub fn new(counters: Arc<Counters>) -> Self {
        Switch::with_limits(MAX_HELD_RECEIVES, MAX_QUEUED_FRAMES, counters)
    }

    /// A switch with other limits (tests).
    pub fn with_limits(max_held: usize, max_queued: usize, counters: Arc<Counters>) -> Self {
        let state = State { owner: None, held: VecDeque::new(), queued: VecDeque::new(), seq: 0 };
        Switch { state: Mutex::new(state), counters, max_held, max_queued }
    }

    /// The counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<U>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Receives held now.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// Frames waiting for a receive now.
    pub fn queued(&self) -> usize {
        self.lock().queued.len()
    }

    /// Takes a receive the host posted: completes it at once with a waiting frame, holds
    /// it, or refuses it (the bridge belongs to another live association, or the limit
    /// of held receives is reached).
    pub fn post(&self, u: U) -> Posted {
        let owner = u.owner();
        let after = {
            let mut s = self.lock();
            match &s.owner {
                Some(o) if *o == owner => {}
                Some(o) if U::owner_alive(o) => {
                    drop(s);
                    self.counters.refused();
                    u.refuse(STATUS_BRIDGE_BUSY);
                    return Posted::Refused(STATUS_BRIDGE_BUSY);
                }
                // No owner, or the old one is gone: this association takes the bridge over.
                // The old one's receives and frames are dropped with it.
                _ => {
                    s.held.clear();
                    s.queued.clear();
                    s.seq = 0;
                    s.owner = Some(owner);
                }
            }
            if let Some(frame) = s.queued.pop_front() {
                let seq = s.seq;
                s.seq = s.seq.wrapping_add(1);
                After::Deliver(u, frame, seq)
            } else if s.held.len() >= self.max_held {
                After::Refuse(u, STATUS_TOO_MANY_RECEIVES)
            } else {
                s.held.push_back((u, Instant::now()));
                After::Nothing
            }
        };
        match after {
            After::Nothing => Posted::Held,
            After::Deliver(u, frame, seq) => {
                if u.deliver(&frame, seq) {
                    self.counters.to_host(frame.len());
                }
                Posted::Delivered
            }
            After::Refuse(u, status) => {
                self.counters.refused();
                u.refuse(status);
                Posted::Refused(status)
            }
        }
    }

    /// Takes a frame from the interface for the host: completes the oldest held receive
    /// with it, or queues it, or drops it when the queue is full or no host owns the
    /// bridge. Returns true when it was delivered or queued.
    pub fn frame(&self, frame: &[u8]) -> bool {
        loop {
            let (u, seq) = {
                let mut s = self.lock();
                if s.owner.is_none() {
                    drop(s);
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                match s.held.pop_front() {
                    Some((u, _)) => {
                        let seq = s.seq;
                        s.seq = s.seq.wrapping_add(1);
                        (u, seq)
                    }
                    None if s.queued.len() < self.max_queued => {
                        s.queued.push_back(frame.to_vec());
                        return true;
                    }
                    None => {
                        drop(s);
                        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                }
            };
            if u.deliver(frame, seq) {
                self.counters.to_host(frame.len());
                return true;
            }
            // That host is gone: its sequence number is free again, try the next receive.
            let mut s = self.lock();
            if s.seq == seq.wrapping_add(1) {
                s.seq = seq;
            }
        }
    }

    /// Completes, empty, every receive held longer than `max_age` (the host posts them
    /// again). Returns how many.
    pub fn expire(&self, max_age: Duration) -> usize {
        let now = Instant::now();
        let old: Vec<U> = {
            let mut s = self.lock();
            let mut old = Vec::new();
            while s.held.front().is_some_and(|(_, at)| now.duration_since(*at) >= max_age) {
                old.push(s.held.pop_front().expect("checked").0);
            }
            old
        };
        let n = old.len();
        for u in old {
            u.deliver(&[], 0);
        }
        self.counters.idle.fetch_add(n as u64, Ordering::Relaxed);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A receive that records what it was completed with.
    struct Fake {
        owner: u32,
        log: Log,
        reachable: bool,
    }

    static DEAD_OWNER_9: AtomicBool = AtomicBool::new(false);

    impl Upcall for Fake {
        type Owner = u32;
        fn owner(&self) -> u32 {
            self.owner
        }
        fn owner_alive(o: &u32) -> bool {
            !(*o == 9 && DEAD_OWNER_9.load(Ordering::SeqCst))
        }
        fn deliver(self, frame: &[u8], seq: u32) -> bool {
            if self.reachable {
                self.log.lock().unwrap().push((self.owner, Ok((frame.to_vec(), seq))));
            }
            self.reachable
        }
        fn refuse(self, status: u16) {
            self.log.lock().unwrap().push((self.owner, Err(status)));
        }
    }

    type Log = Arc<Mutex<Vec<(u32, Result<(Vec<u8>, u32), u16>)>>>;

    fn fake(owner: u32, log: &Log) -> Fake {
        Fake { owner, log: log.clone(), reachable: true }
    }

    #[test]
    fn frames_complete_held_receives_in_order_with_sequence_numbers() {
        let log = Log::default();
        let sw = Switch::new(Arc::new(Counters::default()));
        assert!(!sw.frame(&[1; 20]), "no owner yet: dropped");
        assert_eq!(sw.post(fake(1, &log)), Posted::Held);
        assert_eq!(sw.post(fake(1, &log)), Posted::Held);
        assert!(sw.frame(&[2; 20]));
        assert!(sw.frame(&[3; 20]));
        assert!(sw.frame(&[4; 20]), "queued");
        assert_eq!(sw.queued(), 1);
        assert_eq!(sw.post(fake(1, &log)), Posted::Delivered);
        let got: Vec<(u8, u32)> = log.lock().unwrap().iter().map(|(_, r)| r.clone().map(|(f, s)| (f[0], s)).unwrap()).collect();
        assert_eq!(got, vec![(2, 0), (3, 1), (4, 2)]);
        let c = sw.counters().snapshot();
        assert_eq!((c.frames_to_host, c.bytes_to_host, c.dropped), (3, 60, 1));
    }

    #[test]
    fn too_many_receives_are_refused() {
        let log = Log::default();
        let sw = Switch::with_limits(2, 4, Arc::new(Counters::default()));
        assert_eq!(sw.post(fake(1, &log)), Posted::Held);
        assert_eq!(sw.post(fake(1, &log)), Posted::Held);
        assert_eq!(sw.post(fake(1, &log)), Posted::Refused(STATUS_TOO_MANY_RECEIVES));
        assert_eq!(log.lock().unwrap().last().unwrap().1, Err(STATUS_TOO_MANY_RECEIVES));
        assert_eq!(sw.held(), 2);
    }

    #[test]
    fn one_host_at_a_time_until_it_goes_away() {
        let log = Log::default();
        let sw = Switch::new(Arc::new(Counters::default()));
        assert_eq!(sw.post(fake(9, &log)), Posted::Held);
        assert_eq!(sw.post(fake(2, &log)), Posted::Refused(STATUS_BRIDGE_BUSY));
        DEAD_OWNER_9.store(true, Ordering::SeqCst);
        assert_eq!(sw.post(fake(2, &log)), Posted::Held);
        assert_eq!(sw.held(), 1, "the old owner's receive went with it");
        assert!(sw.frame(&[7; 14]));
        assert_eq!(log.lock().unwrap().last().unwrap(), &(2, Ok((vec![7; 14], 0))));
    }

    #[test]
    fn the_queue_is_bounded_and_unreachable_receives_are_skipped() {
        let log = Log::default();
        let sw = Switch::with_limits(8, 2, Arc::new(Counters::default()));
        sw.post(Fake { owner: 1, log: log.clone(), reachable: false });
        sw.post(fake(1, &log));
        assert!(sw.frame(&[5; 14]));
        assert_eq!(log.lock().unwrap().as_slice(), &[(1, Ok((vec![5; 14], 0)))], "delivered to the reachable one, as seq 0");
        assert!(sw.frame(&[6; 14]));
        assert!(sw.frame(&[6; 14]));
        assert!(!sw.frame(&[6; 14]), "queue of 2 full");
        assert_eq!(sw.counters().snapshot().dropped, 1);
    }

    #[test]
    fn idle_receives_complete_empty() {
        let log = Log::default();
        let sw = Switch::new(Arc::new(Counters::default()));
        sw.post(fake(1, &log));
        assert_eq!(sw.expire(Duration::from_secs(3600)), 0);
        assert_eq!(sw.expire(Duration::ZERO), 1);
        assert_eq!(log.lock().unwrap().as_slice(), &[(1, Ok((vec![], 0)))]);
        assert_eq!(sw.counters().snapshot().idle, 1);
    }
}
