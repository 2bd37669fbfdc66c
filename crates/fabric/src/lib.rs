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

pub use pdu::{
    check_data_digest, data_digest, header_len, pdu_type, write_all_vectored, CommonHeader, Digests, Layout, Pdu, PduError, FLAG_DDGST, FLAG_HDGST,
    FLAG_LAST_PDU, FLAG_SUCCESS,
};
pub use sqe::{Command, Completion, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};

/// The 15-bit NVMe status field of a completion: bit 14 DNR, bit 13 More, bits 10:8 Status
/// Code Type, bits 7:0 Status Code.
pub type StatusField = u16;

/// Command opcodes: defined once, in the protocol crate.
pub use insitu_proto::opcode;

/// Fabrics command types: defined once, in the protocol crate.
pub use insitu_proto::opcode::fabrics;

#[cfg(test)]
mod tests;
