// SPDX-License-Identifier: Apache-2.0
//! The host's side of the bridge: frames the kernel sends out of the host's TAP device go to
//! the target as TRANSMIT_FRAME commands; frames the target completes RECEIVE_FRAME
//! commands with go into the TAP device.

use crate::{check_frame, EtherError, Tap, HOST_RECEIVES, RECEIVE_BUFFER};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A frame a RECEIVE_FRAME brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The frame; empty when the target had nothing for the host in time (post again).
    pub frame: Vec<u8>,
    /// Its sequence number (completion dword 1): the target's order of frames.
    pub seq: u32,
}

/// The NVMe side of a host bridge: an initiator session, or a fake in tests. Shared by the
/// transmit loop and every receive thread at once.
pub trait HostLink: Send + Sync {
    /// Sends `frames` as TRANSMIT_FRAME commands, in this order (they may be in flight
    /// together); returns when all have completed. An error loses the frames, as a
    /// failed link does.
    fn transmit(&self, frames: &[&[u8]]) -> Result<(), EtherError>;

    /// Posts one RECEIVE_FRAME (a buffer of [`RECEIVE_BUFFER`] bytes) and waits for its
    /// completion.
    fn receive(&self) -> Result<Received, EtherError>;
}

/// Puts received frames into the TAP device in the target's order: receives complete in
/// order on the target, but the threads waiting for them may wake in any order.
struct Reorder {
    next: Option<u32>,
    pending: Vec<Received>,
    /// Frames waiting for a missing one at most; then the missing one is given up.
    window: usize,
}

/// How far behind the expected sequence number a frame counts as late (written at once)
/// rather than the start of a new sequence (a new association).
const LATE: u32 = 1024;

impl Reorder {
    fn new(window: usize) -> Self {
        Reorder { next: None, pending: Vec::new(), window: window.max(1) }
    }

    /// Takes a received frame; returns the frames to write now, in order.
    fn push(&mut self, r: Received) -> Vec<Vec<u8>> {
        let next = *self.next.get_or_insert(r.seq);
        let ahead = r.seq.wrapping_sub(next);
        let mut out = Vec::new();
        if ahead == 0 {
            out.push(r.frame);
            self.next = Some(next.wrapping_add(1));
        } else if ahead < u32::MAX / 2 {
            self.pending.push(r);
            if self.pending.len() < self.window {
                return out;
            }
            // The missing frame is not coming: go on from the oldest one waiting.
            let oldest = self.pending.iter().map(|p| p.seq.wrapping_sub(next)).min().expect("not empty");
            self.next = Some(next.wrapping_add(oldest));
        } else if next.wrapping_sub(r.seq) <= LATE {
            out.push(r.frame); // late (it was given up on): deliver it anyway
            return out;
        } else {
            // A new sequence (the target's bridge has a new owner): flush the old one.
            self.pending.sort_by_key(|p| p.seq.wrapping_sub(next));
            out.extend(self.pending.drain(..).map(|p| p.frame));
            out.push(r.frame);
            self.next = Some(r.seq.wrapping_add(1));
            return out;
        }
        // Whatever is now consecutive goes out.
        while let Some(i) = self.pending.iter().position(|p| Some(p.seq) == self.next) {
            out.push(self.pending.swap_remove(i).frame);
            self.next = self.next.map(|n| n.wrapping_add(1));
        }
        out
    }
}

/// The host's end of an Ether-oN bridge. [`HostBridge::run`] keeps `receives`
/// RECEIVE_FRAME commands posted (each posted again as it completes, from its own thread)
/// and sends the TAP device's frames as TRANSMIT_FRAME commands from one thread, in order,
/// batching the frames that are waiting (up to `batch` in flight).
pub struct HostBridge {
    tap: Arc<Tap>,
    link: Arc<dyn HostLink>,
    stop: Arc<AtomicBool>,
    receives: usize,
    batch: usize,
}

impl HostBridge {
    /// A bridge between `tap` and `link`, with [`HOST_RECEIVES`] receives and batches of
    /// at most 32 frames.
    pub fn new(tap: Tap, link: Arc<dyn HostLink>) -> Self {
        HostBridge { tap: Arc::new(tap), link, stop: Arc::new(AtomicBool::new(false)), receives: HOST_RECEIVES, batch: 32 }
    }

    /// Sets the receives kept posted (default [`HOST_RECEIVES`], at least 1).
    pub fn receives(mut self, n: usize) -> Self {
        self.receives = n.max(1);
        self
    }

    /// Sets the most frames sent in one batch (default 32, at least 1).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// A flag that ends [`HostBridge::run`] when set.
    pub fn stopper(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The TAP device.
    pub fn tap(&self) -> &Tap {
        &self.tap
    }

    /// Runs the bridge until the stop flag is set. Link errors are reported on stderr
    /// and retried (the link reconnects itself); an error of the TAP device ends it. The
    /// receive threads are left to finish their last receive on their own.
    pub fn run(self) -> Result<(), EtherError> {
        let reorder = Arc::new(Mutex::new(Reorder::new(self.receives * 2)));
        for i in 0..self.receives {
            let (tap, link, stop, reorder) = (self.tap.clone(), self.link.clone(), self.stop.clone(), reorder.clone());
            std::thread::Builder::new()
                .name(format!("etheron-rx{i}"))
                .spawn(move || receive_loop(&tap, &*link, &stop, &reorder))
                .map_err(|e| EtherError::Io { name: self.tap.name().to_string(), source: e })?;
        }
        self.transmit_loop()
    }

    fn transmit_loop(&self) -> Result<(), EtherError> {
        let mut bufs = vec![vec![0u8; RECEIVE_BUFFER]; self.batch];
        let mut lens = vec![0usize; self.batch];
        let mut failing = false;
        while !self.stop.load(Ordering::Relaxed) {
            if !self.tap.wait_readable(Duration::from_millis(200))? {
                continue;
            }
            let mut n = 0;
            loop {
                let len = self.tap.read_frame(&mut bufs[n])?;
                if check_frame(&bufs[n][..len]).is_ok() {
                    lens[n] = len;
                    n += 1;
                }
                if n == self.batch || !self.tap.wait_readable(Duration::ZERO)? {
                    break;
                }
            }
            let frames: Vec<&[u8]> = bufs.iter().zip(&lens).take(n).map(|(b, l)| &b[..*l]).collect();
            match self.link.transmit(&frames) {
                Ok(()) if failing => {
                    eprintln!("insitu-ethernet: transmitting again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) => {
                    if !failing {
                        eprintln!("insitu-ethernet: {e}; frames are dropped until the link is back");
                    }
                    failing = true;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        Ok(())
    }
}

fn receive_loop(tap: &Tap, link: &dyn HostLink, stop: &AtomicBool, reorder: &Mutex<Reorder>) {
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        match link.receive() {
            Ok(r) => {
                if failing {
                    eprintln!("insitu-ethernet: receiving again");
                    failing = false;
                }
                if r.frame.is_empty() {
                    continue; // nothing came in time: post again
                }
                let mut ro = reorder.lock().unwrap_or_else(PoisonError::into_inner);
                for f in ro.push(r) {
                    if let Err(e) = tap.write_frame(&f) {
                        eprintln!("insitu-ethernet: dropping a received frame: {e}");
                    }
                }
            }
            Err(e) => {
                if !failing {
                    eprintln!("insitu-ethernet: {e}; retrying");
                }
                failing = true;
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(seq: u32) -> Received {
        Received { frame: vec![seq as u8], seq }
    }

    fn firsts(v: Vec<Vec<u8>>) -> Vec<u8> {
        v.into_iter().map(|f| f[0]).collect()
    }

    #[test]
    fn reorder_puts_frames_back_in_sequence() {
        let mut ro = Reorder::new(4);
        assert_eq!(firsts(ro.push(r(0))), vec![0]);
        assert_eq!(firsts(ro.push(r(2))), Vec::<u8>::new());
        assert_eq!(firsts(ro.push(r(3))), Vec::<u8>::new());
        assert_eq!(firsts(ro.push(r(1))), vec![1, 2, 3]);
        assert_eq!(firsts(ro.push(r(4))), vec![4]);
    }

    #[test]
    fn reorder_gives_up_on_a_missing_frame_and_takes_it_late() {
        let mut ro = Reorder::new(2);
        ro.push(r(10));
        assert!(ro.push(r(12)).is_empty());
        assert_eq!(firsts(ro.push(r(13))), vec![12, 13], "11 given up after a window of 2");
        assert_eq!(firsts(ro.push(r(11))), vec![11], "late, written anyway");
        assert_eq!(firsts(ro.push(r(14))), vec![14]);
    }

    #[test]
    fn reorder_follows_a_new_sequence() {
        let mut ro = Reorder::new(4);
        ro.push(r(5000));
        assert_eq!(firsts(ro.push(r(0))), vec![0]);
        assert_eq!(firsts(ro.push(r(1))), vec![1]);
    }

    proptest::proptest! {
        /// Frames that come back shuffled within groups of the posted receives go out in
        /// sequence order, none lost or repeated, from any starting number.
        #[test]
        fn reorder_restores_any_shuffle_within_the_window(start in proptest::prelude::any::<u32>(), n in 1usize..200, seed in proptest::prelude::any::<u64>()) {
            let mut seqs: Vec<u32> = (0..n as u32).map(|i| start.wrapping_add(i)).collect();
            let mut x = seed | 1;
            for chunk in seqs[1..].chunks_mut(4) {
                for i in (1..chunk.len()).rev() {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    chunk.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
            let mut ro = Reorder::new(8);
            let mut out = Vec::new();
            for s in seqs {
                out.extend(ro.push(Received { frame: s.to_le_bytes().to_vec(), seq: s }));
            }
            let got: Vec<u32> = out.iter().map(|f| u32::from_le_bytes(f[..4].try_into().unwrap())).collect();
            let want: Vec<u32> = (0..n as u32).map(|i| start.wrapping_add(i)).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn reorder_across_the_wrap() {
        let mut ro = Reorder::new(4);
        let big = |s: u32| Received { frame: vec![(s & 0xFF) as u8], seq: s };
        ro.push(big(u32::MAX - 1));
        assert!(ro.push(big(0)).is_empty());
        assert_eq!(firsts(ro.push(big(u32::MAX))), vec![0xFF, 0]);
    }
}
