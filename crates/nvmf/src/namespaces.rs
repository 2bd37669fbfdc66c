// SPDX-License-Identifier: Apache-2.0
//! What the transport needs of the storage behind an NVM subsystem: block namespaces it
//! reads and writes with the NVM command set, and namespaces of other I/O command sets
//! (such as Key Value, CSI 01h) that take every command addressed to them.
//!
//! The transport knows no engine: whoever assembles a target implements these traits over
//! its storage and hands them to [`NvmSubsystem`](crate::NvmSubsystem).

use insitu_fabric::Command;
use insitu_media::{Backing, BlockRead, BufferPool};
use insitu_proto::CommandError;

use crate::Outcome;

/// One block namespace as the transport sees it.
#[derive(Clone, Copy)]
pub struct BlockNamespace<'a> {
    /// Logical block size, bytes.
    pub lba_size: u32,
    /// Size, bytes.
    pub size: u64,
    /// Whether hosts may address it (a private namespace is for code on the target).
    pub sharable: bool,
    /// The media it lives on: the read path asks whether it is in memory, paced, or can
    /// send from the page cache.
    pub media: &'a Backing,
    /// Buffers that data arriving for it is received into, so the media writes them
    /// without another copy.
    pub buffers: &'a BufferPool,
}

/// The block namespaces of an NVM subsystem, numbered `1..=count()`.
///
/// Every method checks what a host may do: a private namespace, an LBA range beyond the
/// namespace or a fenced block fails with the [`CommandError`] that goes back to the host.
pub trait BlockNamespaces: Send + Sync {
    /// How many there are, private ones included.
    fn count(&self) -> usize;

    /// Namespace `nsid`, whatever its visibility.
    fn namespace(&self, nsid: u32) -> Option<BlockNamespace<'_>>;

    /// Reads `bytes` (whole blocks) from `slba` into a pooled buffer.
    fn read_blocks(&self, nsid: u32, slba: u64, bytes: usize) -> Result<BlockRead, CommandError>;

    /// The media and byte offset that `bytes` at `slba` are read from, after the checks of
    /// [`BlockNamespaces::read_blocks`]: the transport sends them straight from there.
    fn read_source(&self, nsid: u32, slba: u64, bytes: usize) -> Result<(&Backing, u64), CommandError>;

    /// Writes whole blocks from `slba`.
    fn write(&self, nsid: u32, slba: u64, data: &[u8]) -> Result<(), CommandError>;

    /// Makes `nlb` blocks from `slba` read as zeros (Write Zeroes, Dataset Management).
    fn write_zeroes(&self, nsid: u32, slba: u64, nlb: u64) -> Result<(), CommandError>;

    /// Makes what was written to `nsid` durable.
    fn flush(&self, nsid: u32) -> Result<(), CommandError>;

    /// Bytes read from and written to the media of every namespace, for the SMART log.
    fn media_totals(&self) -> (u64, u64);
}

/// A namespace of an I/O command set other than NVM: every command addressed to its NSID
/// goes to [`CommandSetNamespace::execute`], whatever the opcode (command sets reuse NVM
/// opcodes). The transport moves data by the opcode's direction bits as for any command.
pub trait CommandSetNamespace: Send + Sync {
    /// Its Command Set Identifier (Identify's namespace descriptor, NIDT 04h).
    fn csi(&self) -> u8;

    /// Its command-set-specific Identify Namespace structure (CNS 05h with its CSI), 4096
    /// bytes; `nguid` is the namespace's globally unique identifier.
    fn identify(&self, nguid: [u8; 16]) -> Vec<u8>;

    /// Runs `cmd` with the data the host sent; `max_transfer` bounds what one command may
    /// return.
    fn execute(&self, cmd: &Command, data: &[u8], max_transfer: usize) -> Outcome;
}
