// SPDX-License-Identifier: Apache-2.0
//! A target's configuration: listen address, subsystems, their namespaces and admitted
//! hosts, the device model and the services in the private namespace.

use insitu_engine::Visibility;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One namespace: a file or block device.
#[derive(Debug, Clone)]
pub struct NamespaceSpec {
    /// Backing file or block device.
    pub path: PathBuf,
    /// Sharable (visible to hosts) or private (target-only).
    pub visibility: Visibility,
    /// Logical block size: 512 or 4096. Default 512.
    pub lba_size: u32,
}

impl NamespaceSpec {
    /// A sharable namespace with 512-byte blocks.
    pub fn sharable(path: impl Into<PathBuf>) -> Self {
        NamespaceSpec { path: path.into(), visibility: Visibility::Sharable, lba_size: 512 }
    }

    /// A private namespace with 512-byte blocks.
    pub fn private(path: impl Into<PathBuf>) -> Self {
        NamespaceSpec { path: path.into(), visibility: Visibility::Private, lba_size: 512 }
    }
}

/// An NVM subsystem.
#[derive(Debug, Clone)]
pub struct SubsystemConfig {
    /// Its NQN, e.g. `nqn.2024-01.io.insitu:data`.
    pub nqn: String,
    /// Namespaces, numbered 1.. in this order.
    pub namespaces: Vec<NamespaceSpec>,
    /// Host NQNs admitted; empty admits any host.
    pub allow_hosts: Vec<String>,
}

/// The whole target.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Address to listen on. Default `127.0.0.1:4420`: loopback unless told otherwise.
    pub listen: SocketAddr,
    /// NVM subsystems (a discovery subsystem is always added).
    pub subsystems: Vec<SubsystemConfig>,
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
    /// A device to emulate: each namespace's media is paced by its flash model, EXEC by its
    /// compute budget, and data on the wire by its host link (each direction). Default none:
    /// this machine's real speed.
    pub model: Option<insitu_model::DeviceModel>,
    /// Bytes at the end of each subsystem's first private namespace to keep a key-value
    /// store in, served to hosts as an extra namespace of the Key Value command set (its
    /// NSID follows the block namespaces; see `docs/kv-store.md`). The KV cache keeps the
    /// rest of that namespace. Give the same size on every start over the same image.
    /// Default none: no key-value namespace.
    pub kv_store: Option<u64>,
    /// Read host data from disks with direct I/O rather than through the page cache (see
    /// `insitu_engine::NamespaceConfig::cached_reads`). Default `false`.
    pub direct_reads: bool,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 4420)),
            subsystems: Vec::new(),
            mdts: 8,
            inline_data: 32768,
            queue_depth: 128,
            max_io_queues: 8,
            workers_per_queue: 8,
            model: None,
            kv_store: None,
            direct_reads: false,
        }
    }
}

impl TargetConfig {
    /// Largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> usize {
        4096usize << self.mdts
    }

    /// The transport's part, with `links` for the modelled host link.
    pub(crate) fn transport(&self, links: Option<insitu_nvmf::HostLinks>) -> insitu_nvmf::TransportConfig {
        insitu_nvmf::TransportConfig {
            listen: self.listen,
            mdts: self.mdts,
            inline_data: self.inline_data,
            queue_depth: self.queue_depth,
            max_io_queues: self.max_io_queues,
            workers_per_queue: self.workers_per_queue,
            links,
        }
    }
}
