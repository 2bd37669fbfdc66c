// SPDX-License-Identifier: Apache-2.0
//! Submission and completion queue entries (NVMe base specification, figures "Common
//! Command Format" and "Common Completion Queue Entry").

use crate::StatusField;

/// A 64-byte submission queue entry, kept as bytes with typed accessors, so that any field
/// the target does not interpret travels unchanged.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Command(pub [u8; 64]);

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Command {{ opcode: {:#04x}, cid: {}, nsid: {}, cdw10: {:#x} }}", self.opcode(), self.cid(), self.nsid(), self.cdw(10))
    }
}

/// SGL descriptor type byte: Data Block, offset into in-capsule data.
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01;
/// SGL descriptor type byte: Transport SGL Data Block (data moved by H2CData/C2HData).
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

impl Command {
    /// An all-zero entry.
    pub fn zeroed() -> Self {
        Command([0; 64])
    }

    fn u16_at(&self, o: usize) -> u16 {
        u16::from_le_bytes([self.0[o], self.0[o + 1]])
    }

    fn u32_at(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.0[o..o + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, o: usize) -> u64 {
        u64::from_le_bytes(self.0[o..o + 8].try_into().expect("8 bytes"))
    }

    /// Opcode (byte 0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Command identifier (bytes 2-3).
    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }

    /// Namespace identifier (bytes 4-7). For a Fabrics command byte 4 is the type instead.
    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }

    /// Fabrics command type (byte 4 of a command with opcode 0x7F).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Command dword `n` (10..=15 are the command-specific ones).
    pub fn cdw(&self, n: usize) -> u32 {
        self.u32_at(n * 4)
    }

    /// The data pointer as an SGL descriptor: (address, length, type byte).
    pub fn sgl(&self) -> (u64, u32, u8) {
        (self.u64_at(24), self.u32_at(32), self.0[39])
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: u8) -> &mut Self {
        self.0[0] = v;
        self
    }

    /// Sets the command identifier.
    pub fn set_cid(&mut self, v: u16) -> &mut Self {
        self.0[2..4].copy_from_slice(&v.to_le_bytes());
        self
    }

    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, v: u32) -> &mut Self {
        self.0[4..8].copy_from_slice(&v.to_le_bytes());
        self
    }

    /// Sets command dword `n`.
    pub fn set_cdw(&mut self, n: usize, v: u32) -> &mut Self {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
        self
    }

    /// Sets the data pointer to one SGL descriptor, and PSDT to "SGL".
    pub fn set_sgl(&mut self, addr: u64, len: u32, ty: u8) -> &mut Self {
        self.0[1] = (self.0[1] & 0x3F) | 0x40;
        self.0[24..32].copy_from_slice(&addr.to_le_bytes());
        self.0[32..36].copy_from_slice(&len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = ty;
        self
    }
}

/// A 16-byte completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// Command-specific dword 0.
    pub dw0: u32,
    /// Command-specific dword 1.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Identifier of the completed command.
    pub cid: u16,
    /// Status field (bits 15:1 of the last word; DNR, More, SCT, SC), phase excluded.
    pub status: StatusField,
}

impl Completion {
    /// Encodes to 16 bytes (phase tag 0: fabrics do not use it).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&(self.status << 1).to_le_bytes());
        b
    }

    /// Decodes 16 bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        Completion {
            dw0: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            dw1: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            sqhd: u16_at(8),
            sqid: u16_at(10),
            cid: u16_at(12),
            status: u16_at(14) >> 1,
        }
    }
}
