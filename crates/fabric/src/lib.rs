// SPDX-License-Identifier: Apache-2.0
//! NVMe/TCP wire formats for insitu targets and initiators.
//!
//! * [`Pdu`], [`CommonHeader`]: the PDUs of the NVMe/TCP transport binding (ICReq/ICResp,
//!   CapsuleCmd/CapsuleResp, H2CData/C2HData, R2T, terminate requests) with optional
//!   CRC32C header and data digests. Decoding validates every length and offset against
//!   the PDU and the negotiated digests and never panics on hostile input.
//! * [`Command`], [`Completion`]: 64-byte submission and 16-byte completion queue entries.
//! * [`opcode`], [`fabrics`]: the command sets insitu speaks, including its vendor EXEC
//!   opcode (`docs/nvme-vendor-commands.md`).
//!
//! ```
//! use insitu_fabric::{CommonHeader, Command, Digests, Pdu, opcode};
//! let mut sqe = Command::zeroed();
//! sqe.set_opcode(opcode::READ).set_cid(7).set_nsid(1);
//! let pdu = Pdu::CapsuleCmd { sqe, data: vec![] };
//! let d = Digests { header: true, data: true };
//! let mut bytes = Vec::new();
//! pdu.encode(d, 0, &mut bytes);
//! let ch = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 20).unwrap();
//! assert_eq!(Pdu::decode(&ch, &bytes[8..], d).unwrap(), pdu);
//! ```
#![deny(missing_docs)]

mod pdu;
mod sqe;

pub use pdu::{check_data_digest, data_digest, write_all_vectored, header_len, pdu_type, CommonHeader, Digests, Layout, Pdu, PduError, FLAG_DDGST, FLAG_HDGST, FLAG_LAST_PDU, FLAG_SUCCESS};
pub use sqe::{Command, Completion, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};

/// The 15-bit NVMe status field of a completion: bit 14 DNR, bit 13 More, bits 10:8 Status
/// Code Type, bits 7:0 Status Code.
pub type StatusField = u16;

/// Command opcodes.
pub mod opcode {
    /// Fabrics command (admin or I/O queue); the type is in byte 4.
    pub const FABRICS: u8 = 0x7F;
    /// Admin: Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Admin: Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Admin: Abort.
    pub const ABORT: u8 = 0x08;
    /// Admin: Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Admin: Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Admin: Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0C;
    /// Admin: Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// NVM: Flush.
    pub const FLUSH: u8 = 0x00;
    /// NVM: Write.
    pub const WRITE: u8 = 0x01;
    /// NVM: Read.
    pub const READ: u8 = 0x02;
    /// NVM: Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// NVM: Dataset Management.
    pub const DSM: u8 = 0x09;
    /// Vendor (I/O): EXEC. Data direction host→controller (low bits 01): the compute
    /// descriptor travels as the command's data; the result is read with [`EXEC_RESULT`].
    pub const EXEC: u8 = 0x99;
    /// Vendor (I/O): read the result of the EXEC with the same CID tag, controller→host
    /// (low bits 10).
    pub const EXEC_RESULT: u8 = 0x9A;
    /// Vendor (I/O): append keys and values to a sequence of the target's KV cache,
    /// host→controller (`docs/kv-commands.md`).
    pub const KV_APPEND: u8 = 0x9D;
    /// Vendor (I/O): create, fork, free a KV-cache sequence, or ask for its info,
    /// host→controller.
    pub const KV_ADMIN: u8 = 0xA1;
    /// Vendor (I/O): attention over the KV cache for a batch of sequences, host→controller;
    /// the outputs are held under the tag in CDW10 and read with [`KV_RESULT`].
    pub const KV_ATTEND: u8 = 0xA5;
    /// Vendor (I/O): read (and release) the result held under the tag in CDW10,
    /// controller→host.
    pub const KV_RESULT: u8 = 0xA6;
    /// Vendor (I/O): lock a path of a sharable namespace for a container, host→controller:
    /// the data lists its path and extents (`docs/lock-commands.md`); the lock id comes
    /// back in completion DW0/DW1.
    pub const LOCK: u8 = 0xB1;
    /// Vendor (I/O): release the lock whose id is in CDW10/CDW11 (no data).
    pub const UNLOCK: u8 = 0xB5;
}

/// Fabrics command types (byte 4 of an opcode 0x7F command).
pub mod fabrics {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
}

#[cfg(test)]
mod tests;
