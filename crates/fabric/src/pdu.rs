// SPDX-License-Identifier: Apache-2.0
//! NVMe/TCP PDUs (NVMe over Fabrics TCP transport binding, section 3.6): the 8-byte common
//! header, each PDU type's specific header, optional header/data digests (CRC32C), and the
//! data that follows at the data offset (PDO).
//!
//! Decoding happens in two steps so a connection never buffers more than one PDU:
//! [`CommonHeader::parse`] validates the first 8 bytes (type, lengths within limits), then
//! [`Pdu::decode`] checks the rest of the `plen` bytes.

use crate::sqe::{Command, Completion};
use insitu_proto::le::{u16_at, u32_at};

/// PDU type codes.
pub mod pdu_type {
    /// Initialize Connection Request.
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response.
    pub const IC_RESP: u8 = 0x01;
    /// Host-to-controller terminate request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller-to-host terminate request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command capsule.
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response capsule.
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host-to-controller data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller-to-host data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to transfer.
    pub const R2T: u8 = 0x09;
}

/// Common-header flag: a header digest follows the header.
pub const FLAG_HDGST: u8 = 0x01;
/// Common-header flag: a data digest follows the data.
pub const FLAG_DDGST: u8 = 0x02;
/// H2CData/C2HData flag: last PDU of the transfer.
pub const FLAG_LAST_PDU: u8 = 0x04;
/// C2HData flag: the command completed successfully; no response capsule follows.
pub const FLAG_SUCCESS: u8 = 0x08;

/// Which digests a connection negotiated in ICReq/ICResp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// Header digest enabled.
    pub header: bool,
    /// Data digest enabled.
    pub data: bool,
}

/// Why bytes from the network are not a valid PDU. Every variant is fatal to the connection
/// (the transport answers with a terminate request carrying [`PduError::fes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PduError {
    /// Unknown PDU type.
    #[error("unknown PDU type {0:#04x}")]
    UnknownType(u8),
    /// The header length is not the one the type defines.
    #[error("PDU type {ty:#04x}: header length {hlen}, expected {expected}")]
    BadHeaderLength {
        /// PDU type.
        ty: u8,
        /// Header length found.
        hlen: u8,
        /// The type's header length.
        expected: u8,
    },
    /// `plen` is smaller than the header or larger than the limit.
    #[error("PDU length {plen} is outside {min}..={max}")]
    BadLength {
        /// PDU length found.
        plen: u32,
        /// Smallest valid.
        min: u32,
        /// Largest accepted.
        max: u32,
    },
    /// The data offset is inconsistent with the header, digest and length.
    #[error("PDU data offset {pdo} is invalid for header length {hlen} and PDU length {plen}")]
    BadDataOffset {
        /// PDO found.
        pdo: u8,
        /// Header length.
        hlen: u8,
        /// PDU length.
        plen: u32,
    },
    /// A digest flag disagrees with what was negotiated.
    #[error("digest flags {flags:#04x} disagree with the negotiated digests {negotiated:?}")]
    DigestFlags {
        /// Flags found.
        flags: u8,
        /// Negotiated.
        negotiated: Digests,
    },
    /// A header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// A data digest does not match.
    #[error("data digest mismatch")]
    DataDigest,
    /// A field has a value the specification forbids.
    #[error("invalid {field}: {detail}")]
    BadField {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl PduError {
    /// Fatal Error Status for a terminate request: 0x01 invalid header field, 0x02 PDU
    /// sequence error, 0x03 header digest error, 0x04 data transfer out of range,
    /// 0x05 data transfer limit exceeded, 0x06 unsupported parameter.
    pub fn fes(&self) -> u16 {
        match self {
            PduError::HeaderDigest => 0x03,
            PduError::DataDigest => 0x03, // No distinct code; a digest error either way.
            PduError::BadLength { .. } => 0x05,
            _ => 0x01,
        }
    }
}

/// The first 8 bytes of every PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU type.
    pub ty: u8,
    /// Flags.
    pub flags: u8,
    /// Header length (common + specific header, digest excluded).
    pub hlen: u8,
    /// Data offset from the start of the PDU, 0 when there is no data.
    pub pdo: u8,
    /// Total PDU length.
    pub plen: u32,
}

/// Header length of each PDU type.
pub fn header_len(ty: u8) -> Option<u8> {
    use pdu_type::*;
    Some(match ty {
        IC_REQ | IC_RESP => 128,
        H2C_TERM_REQ | C2H_TERM_REQ => 24,
        CAPSULE_CMD => 72,
        CAPSULE_RESP => 24,
        H2C_DATA | C2H_DATA | R2T => 24,
        _ => return None,
    })
}

impl CommonHeader {
    /// Parses and checks the common header: known type, its header length, and
    /// `hlen <= plen <= max_plen`.
    pub fn parse(b: &[u8; 8], max_plen: u32) -> Result<CommonHeader, PduError> {
        let ch = CommonHeader { ty: b[0], flags: b[1], hlen: b[2], pdo: b[3], plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]) };
        let expected = header_len(ch.ty).ok_or(PduError::UnknownType(ch.ty))?;
        if ch.hlen != expected {
            return Err(PduError::BadHeaderLength { ty: ch.ty, hlen: ch.hlen, expected });
        }
        if ch.plen < u32::from(ch.hlen) || ch.plen > max_plen {
            return Err(PduError::BadLength { plen: ch.plen, min: u32::from(ch.hlen), max: max_plen });
        }
        Ok(ch)
    }

    fn to_bytes(self) -> [u8; 8] {
        let p = self.plen.to_le_bytes();
        [self.ty, self.flags, self.hlen, self.pdo, p[0], p[1], p[2], p[3]]
    }
}

/// A decoded PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pdu {
    /// Initialize Connection Request.
    IcReq {
        /// PDU format version (0).
        pfv: u16,
        /// Host PDU data alignment, in dwords minus one.
        hpda: u8,
        /// Requested digests.
        digests: Digests,
        /// Most outstanding R2Ts per command, minus one.
        maxr2t: u32,
    },
    /// Initialize Connection Response.
    IcResp {
        /// PDU format version (0).
        pfv: u16,
        /// Controller PDU data alignment.
        cpda: u8,
        /// Granted digests.
        digests: Digests,
        /// Largest H2CData payload the controller accepts.
        maxh2cdata: u32,
    },
    /// Terminate request (either direction).
    TermReq {
        /// True for H2CTermReq.
        from_host: bool,
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
        /// The offending PDU header (may be empty).
        data: Vec<u8>,
    },
    /// Command capsule with optional in-capsule data.
    CapsuleCmd {
        /// The submission queue entry.
        sqe: Command,
        /// In-capsule data.
        data: Vec<u8>,
    },
    /// Response capsule.
    CapsuleResp {
        /// The completion queue entry.
        cqe: Completion,
    },
    /// Host-to-controller data.
    H2CData {
        /// Command capsule CID.
        cccid: u16,
        /// Transfer tag from the R2T.
        ttag: u16,
        /// Offset of this data in the command's buffer.
        datao: u32,
        /// Last PDU of the R2T's transfer.
        last: bool,
        /// The data.
        data: Vec<u8>,
    },
    /// Controller-to-host data.
    C2HData {
        /// Command capsule CID.
        cccid: u16,
        /// Offset of this data in the command's buffer.
        datao: u32,
        /// Last PDU of the transfer.
        last: bool,
        /// Command succeeded; no response capsule follows.
        success: bool,
        /// The data.
        data: Vec<u8>,
    },
    /// Ready to transfer.
    R2T {
        /// Command capsule CID.
        cccid: u16,
        /// Transfer tag.
        ttag: u16,
        /// Offset requested.
        r2to: u32,
        /// Length requested.
        r2tl: u32,
    },
}

fn crc(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

/// Whether a PDU type carries digests (ICReq, ICResp and terminate requests never do).
fn digestible(ty: u8) -> bool {
    !matches!(ty, pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ)
}

fn has_data(ty: u8) -> bool {
    matches!(ty, pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA)
}

/// Where the parts of a PDU lie after its 8-byte common header, in the order a receiver
/// reads them: `head` bytes (specific header, header digest, padding up to the data offset),
/// then `data` bytes, then `digest` bytes (4 with a data digest, else 0). A receiver that
/// places data itself (straight into the destination buffer) reads the head, decodes it with
/// [`Pdu::decode_head`], reads the data where it belongs and checks it with
/// [`check_data_digest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes from the end of the common header to the data (or to the end of the PDU).
    pub head: usize,
    /// Data bytes.
    pub data: usize,
    /// Data digest bytes after the data: 0 or 4.
    pub digest: usize,
    /// A header digest ends the head's specific header.
    pub header_digest: bool,
}

impl CommonHeader {
    /// Splits the PDU into head, data and digest, checking the digest flags against what
    /// was negotiated and the data offset against the lengths.
    pub fn layout(&self, digests: Digests) -> Result<Layout, PduError> {
        let (plen, hlen) = (self.plen as usize, usize::from(self.hlen));
        let digestible = digestible(self.ty);
        let hdgst = digestible && self.flags & FLAG_HDGST != 0;
        let ddgst = digestible && self.flags & FLAG_DDGST != 0;
        if digestible && (hdgst != digests.header || (ddgst && !digests.data)) {
            return Err(PduError::DigestFlags { flags: self.flags, negotiated: digests });
        }
        let after_header = hlen + if hdgst { 4 } else { 0 };
        if after_header > plen {
            return Err(PduError::BadLength { plen: self.plen, min: after_header as u32, max: after_header as u32 });
        }
        let bad_offset = || PduError::BadDataOffset { pdo: self.pdo, hlen: self.hlen, plen: self.plen };
        let is_term = matches!(self.ty, pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ);
        // Data: from PDO to the end, less the data digest.
        let data_end = plen - if ddgst { 4 } else { 0 };
        if has_data(self.ty) && plen > after_header {
            let pdo = usize::from(self.pdo);
            if pdo < after_header || pdo > data_end || (ddgst && pdo == data_end) {
                return Err(bad_offset());
            }
            return Ok(Layout { head: pdo - 8, data: data_end - pdo, digest: plen - data_end, header_digest: hdgst });
        }
        if ddgst || (plen > after_header && !is_term) {
            return Err(bad_offset());
        }
        // A terminate request's data (the offending header) follows its header directly.
        Ok(Layout { head: after_header - 8, data: plen - after_header, digest: 0, header_digest: hdgst })
    }
}

/// Checks `data` against the data digest that followed it.
pub fn check_data_digest(data: &[u8], digest: &[u8]) -> Result<(), PduError> {
    if crc(data) == digest {
        Ok(())
    } else {
        Err(PduError::DataDigest)
    }
}

impl Pdu {
    /// Decodes a PDU from its common header and the `plen - 8` bytes after it, checking
    /// digests against what was negotiated.
    pub fn decode(ch: &CommonHeader, rest: &[u8], digests: Digests) -> Result<Pdu, PduError> {
        if rest.len() + 8 != ch.plen as usize {
            return Err(PduError::BadLength { plen: ch.plen, min: (rest.len() + 8) as u32, max: (rest.len() + 8) as u32 });
        }
        let layout = ch.layout(digests)?;
        let mut pdu = Pdu::decode_head(ch, &rest[..layout.head], &layout)?;
        let data = &rest[layout.head..layout.head + layout.data];
        if layout.digest > 0 {
            check_data_digest(data, &rest[layout.head + layout.data..])?;
        }
        if let Some(d) = pdu.data_mut() {
            d.extend_from_slice(data);
        }
        Ok(pdu)
    }

    /// Decodes a PDU from its head (the `layout.head` bytes after the common header); its
    /// data, if any, is left empty for the caller to read where it belongs. Checks the header
    /// digest and, for H2CData and C2HData, that DATAL equals `layout.data`.
    pub fn decode_head(ch: &CommonHeader, head: &[u8], layout: &Layout) -> Result<Pdu, PduError> {
        let hlen = usize::from(ch.hlen);
        if head.len() != layout.head || head.len() + 8 < hlen {
            return Err(PduError::BadLength { plen: ch.plen, min: hlen as u32, max: hlen as u32 });
        }
        if layout.header_digest {
            let mut h = ch.to_bytes().to_vec();
            h.extend_from_slice(&head[..hlen - 8]);
            if crc(&h) != head[hlen - 8..hlen - 4] {
                return Err(PduError::HeaderDigest);
            }
        }
        let h = &head[..hlen - 8]; // specific header, offsets below are from byte 8
        use pdu_type::*;
        Ok(match ch.ty {
            IC_REQ | IC_RESP => {
                let pfv = u16_at(h, 0);
                if pfv != 0 {
                    return Err(PduError::BadField { field: "PFV", detail: format!("version {pfv} is not supported (0 is)") });
                }
                let dgst = h[3];
                let digests = Digests { header: dgst & 1 != 0, data: dgst & 2 != 0 };
                if ch.ty == IC_REQ {
                    let hpda = h[2];
                    if hpda > 31 {
                        return Err(PduError::BadField { field: "HPDA", detail: format!("{hpda} exceeds 31") });
                    }
                    Pdu::IcReq { pfv, hpda, digests, maxr2t: u32_at(h, 4) }
                } else {
                    Pdu::IcResp { pfv, cpda: h[2], digests, maxh2cdata: u32_at(h, 4) }
                }
            }
            H2C_TERM_REQ | C2H_TERM_REQ => Pdu::TermReq { from_host: ch.ty == H2C_TERM_REQ, fes: u16_at(h, 0), fei: u32_at(h, 2), data: Vec::new() },
            CAPSULE_CMD => {
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&h[..64]);
                Pdu::CapsuleCmd { sqe: Command(sqe), data: Vec::new() }
            }
            CAPSULE_RESP => {
                let mut cqe = [0u8; 16];
                cqe.copy_from_slice(&h[..16]);
                Pdu::CapsuleResp { cqe: Completion::from_bytes(&cqe) }
            }
            H2C_DATA | C2H_DATA => {
                let datal = u32_at(h, 8) as usize;
                if datal != layout.data {
                    return Err(PduError::BadField { field: "DATAL", detail: format!("says {datal} bytes, the PDU carries {}", layout.data) });
                }
                if ch.ty == H2C_DATA {
                    Pdu::H2CData { cccid: u16_at(h, 0), ttag: u16_at(h, 2), datao: u32_at(h, 4), last: ch.flags & FLAG_LAST_PDU != 0, data: Vec::new() }
                } else {
                    Pdu::C2HData {
                        cccid: u16_at(h, 0),
                        datao: u32_at(h, 4),
                        last: ch.flags & FLAG_LAST_PDU != 0,
                        success: ch.flags & FLAG_SUCCESS != 0,
                        data: Vec::new(),
                    }
                }
            }
            R2T => Pdu::R2T { cccid: u16_at(h, 0), ttag: u16_at(h, 2), r2to: u32_at(h, 4), r2tl: u32_at(h, 8) },
            other => return Err(PduError::UnknownType(other)),
        })
    }

    /// The data a PDU carries (empty for those that carry none).
    pub fn data(&self) -> &[u8] {
        match self {
            Pdu::TermReq { data, .. } | Pdu::CapsuleCmd { data, .. } | Pdu::H2CData { data, .. } | Pdu::C2HData { data, .. } => data,
            _ => &[],
        }
    }

    /// The data of a PDU that carries data (for a receiver that reads it separately, after
    /// [`Pdu::decode_head`]); `None` for the others.
    pub fn data_mut(&mut self) -> Option<&mut Vec<u8>> {
        match self {
            Pdu::TermReq { data, .. } | Pdu::CapsuleCmd { data, .. } | Pdu::H2CData { data, .. } | Pdu::C2HData { data, .. } => Some(data),
            _ => None,
        }
    }

    /// Appends the encoded PDU to `out`, with the negotiated digests and data aligned to
    /// `pda` (the peer's PDU data alignment: 0 means none, n means (n+1) dwords).
    pub fn encode(&self, digests: Digests, pda: u8, out: &mut Vec<u8>) {
        let data = self.data();
        if self.encode_head(data.len(), digests, pda, out) {
            out.extend_from_slice(data);
            out.extend_from_slice(&crc(data));
        } else {
            out.extend_from_slice(data);
        }
    }

    /// Appends everything of the encoded PDU that precedes its data, for a PDU that will
    /// carry `data_len` bytes of data sent separately (a vectored write from where the data
    /// lies); the PDU's own `data` field is ignored. Returns whether a data digest
    /// ([`data_digest`] of the data) must follow the data.
    pub fn encode_head(&self, data_len: usize, digests: Digests, pda: u8, out: &mut Vec<u8>) -> bool {
        use pdu_type::*;
        let (ty, mut flags): (u8, u8) = match self {
            Pdu::IcReq { .. } => (IC_REQ, 0),
            Pdu::IcResp { .. } => (IC_RESP, 0),
            Pdu::TermReq { from_host, .. } => (if *from_host { H2C_TERM_REQ } else { C2H_TERM_REQ }, 0),
            Pdu::CapsuleCmd { .. } => (CAPSULE_CMD, 0),
            Pdu::CapsuleResp { .. } => (CAPSULE_RESP, 0),
            Pdu::H2CData { last, .. } => (H2C_DATA, if *last { FLAG_LAST_PDU } else { 0 }),
            Pdu::C2HData { last, success, .. } => (C2H_DATA, if *last { FLAG_LAST_PDU } else { 0 } | if *success { FLAG_SUCCESS } else { 0 }),
            Pdu::R2T { .. } => (R2T, 0),
        };
        let data_len = if has_data(ty) || matches!(ty, H2C_TERM_REQ | C2H_TERM_REQ) { data_len } else { 0 };
        let hlen = header_len(ty).expect("known type");
        let hdgst = digests.header && digestible(ty);
        let ddgst = digests.data && digestible(ty) && has_data(ty) && data_len > 0;
        if hdgst {
            flags |= FLAG_HDGST;
        }
        if ddgst {
            flags |= FLAG_DDGST;
        }
        let after_header = usize::from(hlen) + if hdgst { 4 } else { 0 };
        let is_term = matches!(ty, H2C_TERM_REQ | C2H_TERM_REQ);
        let pdo = if data_len == 0 || is_term {
            0
        } else {
            let align = if pda == 0 { 1 } else { (usize::from(pda) + 1) * 4 };
            after_header.next_multiple_of(align)
        };
        let plen = if data_len == 0 {
            after_header
        } else if is_term {
            after_header + data_len
        } else {
            pdo + data_len + if ddgst { 4 } else { 0 }
        };
        let start = out.len();
        out.extend_from_slice(&CommonHeader { ty, flags, hlen, pdo: pdo as u8, plen: plen as u32 }.to_bytes());
        let mut h = [0u8; 120];
        let h = &mut h[..usize::from(hlen) - 8];
        match self {
            Pdu::IcReq { pfv, hpda, digests, maxr2t } => {
                h[0..2].copy_from_slice(&pfv.to_le_bytes());
                h[2] = *hpda;
                h[3] = u8::from(digests.header) | (u8::from(digests.data) << 1);
                h[4..8].copy_from_slice(&maxr2t.to_le_bytes());
            }
            Pdu::IcResp { pfv, cpda, digests, maxh2cdata } => {
                h[0..2].copy_from_slice(&pfv.to_le_bytes());
                h[2] = *cpda;
                h[3] = u8::from(digests.header) | (u8::from(digests.data) << 1);
                h[4..8].copy_from_slice(&maxh2cdata.to_le_bytes());
            }
            Pdu::TermReq { fes, fei, .. } => {
                h[0..2].copy_from_slice(&fes.to_le_bytes());
                h[2..6].copy_from_slice(&fei.to_le_bytes());
            }
            Pdu::CapsuleCmd { sqe, .. } => h[..64].copy_from_slice(&sqe.0),
            Pdu::CapsuleResp { cqe } => h[..16].copy_from_slice(&cqe.to_bytes()),
            Pdu::H2CData { cccid, ttag, datao, .. } => {
                h[0..2].copy_from_slice(&cccid.to_le_bytes());
                h[2..4].copy_from_slice(&ttag.to_le_bytes());
                h[4..8].copy_from_slice(&datao.to_le_bytes());
                h[8..12].copy_from_slice(&(data_len as u32).to_le_bytes());
            }
            Pdu::C2HData { cccid, datao, .. } => {
                h[0..2].copy_from_slice(&cccid.to_le_bytes());
                h[4..8].copy_from_slice(&datao.to_le_bytes());
                h[8..12].copy_from_slice(&(data_len as u32).to_le_bytes());
            }
            Pdu::R2T { cccid, ttag, r2to, r2tl } => {
                h[0..2].copy_from_slice(&cccid.to_le_bytes());
                h[2..4].copy_from_slice(&ttag.to_le_bytes());
                h[4..8].copy_from_slice(&r2to.to_le_bytes());
                h[8..12].copy_from_slice(&r2tl.to_le_bytes());
            }
        }
        out.extend_from_slice(h);
        if hdgst {
            let d = crc(&out[start..start + usize::from(hlen)]);
            out.extend_from_slice(&d);
        }
        if data_len > 0 {
            out.resize(start + if is_term { after_header } else { pdo }, 0);
        }
        debug_assert_eq!(out.len() - start + data_len + if ddgst { 4 } else { 0 }, plen);
        ddgst
    }
}

/// The data digest (CRC32C, little-endian) that follows `data` in a PDU.
pub fn data_digest(data: &[u8]) -> [u8; 4] {
    crc(data)
}

/// `write_all` for a list of slices: one `writev` per attempt, resumed where it stopped.
pub fn write_all_vectored(w: &mut dyn std::io::Write, mut slices: &mut [std::io::IoSlice<'_>]) -> std::io::Result<()> {
    std::io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Pdu {
    /// Writes the PDU carrying `data` (its own `data` field ignored) with one vectored
    /// write: header, then `data` from where it lies, then its digest. Returns the bytes
    /// written.
    pub fn write_with_data(&self, data: &[u8], digests: Digests, pda: u8, w: &mut dyn std::io::Write) -> std::io::Result<usize> {
        let mut head = Vec::with_capacity(128);
        let digest = self.encode_head(data.len(), digests, pda, &mut head).then(|| crc(data));
        let mut slices = [std::io::IoSlice::new(&head), std::io::IoSlice::new(data), std::io::IoSlice::new(digest.as_ref().map_or(&[][..], |d| &d[..]))];
        write_all_vectored(w, &mut slices)?;
        Ok(head.len() + data.len() + if digest.is_some() { 4 } else { 0 })
    }
}
