// SPDX-License-Identifier: Apache-2.0
//! The transport's configuration: listen address, queue limits, and the modelled host link.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Delays data on the host link as a modelled link would carry it.
///
/// The transport books the bytes when they could start crossing the modelled link, moves
/// them for real, and only then waits for the booking: the real transfer overlaps the
/// modelled one, so the data takes the longer of the two rather than their sum.
pub trait LinkPacer: Send + Sync {
    /// Books `bytes` that may start crossing the link at `from` (or once the link is free,
    /// if later) and returns when the modelled link has delivered them, without waiting.
    fn book(&self, bytes: u64, from: Instant) -> Instant;

    /// Sleeps until `deadline`; returns at once if it has passed.
    fn wait_until(&self, deadline: Instant);

    /// Returns once the link would have carried `bytes` more, booked now.
    fn transfer(&self, bytes: u64) {
        self.wait_until(self.book(bytes, Instant::now()));
    }
}

/// The host link's two directions (links are full duplex), each paced on its own.
#[derive(Clone)]
pub struct HostLinks {
    /// Data the target sends.
    pub to_host: Arc<dyn LinkPacer>,
    /// Data the host sends.
    pub to_target: Arc<dyn LinkPacer>,
}

impl std::fmt::Debug for HostLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostLinks { .. }")
    }
}

/// How the transport serves: where, and with which limits.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Address to listen on. Default `127.0.0.1:4420`: loopback unless told otherwise.
    pub listen: SocketAddr,
    /// Maximum data transfer size as a power of two of 4 KiB pages. Default 8 (1 MiB).
    pub mdts: u8,
    /// In-capsule data accepted per command, bytes. Default 32768: a decode step's
    /// KV_ATTEND for a batch of eight (queries and the new token, about 15 KiB in f16)
    /// travels in its capsule, without the round trip an R2T adds (0.2 ms of a 2.7 ms
    /// exchange on 2 cores). Linux's own target offers 16 KiB.
    pub inline_data: u32,
    /// Entries per queue (MAXCMD, largest SQ size). Default 128.
    pub queue_depth: u16,
    /// Most I/O queues per controller. Default 8.
    pub max_io_queues: u16,
    /// Most worker threads per I/O queue, so commands on one queue run concurrently; a queue
    /// gets no more than it has entries. Default 8: a host streaming at queue depth 32 over
    /// four queues then has every read at the media at once (direct reads of a disk were
    /// 1.06 times as fast as with 4, median of paired runs: `docs/data-path.md`).
    pub workers_per_queue: usize,
    /// A modelled host link. Default none: the wire's own speed.
    pub links: Option<HostLinks>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 4420)),
            mdts: 8,
            inline_data: 32768,
            queue_depth: 128,
            max_io_queues: 8,
            workers_per_queue: 8,
            links: None,
        }
    }
}

impl TransportConfig {
    /// Largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> usize {
        4096usize << self.mdts
    }
}
