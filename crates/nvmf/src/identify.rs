// SPDX-License-Identifier: Apache-2.0
//! The data structures Identify and Get Log Page return, built byte by byte (NVMe base
//! specification, "Identify Controller Data Structure", "Identify Namespace Data
//! Structure", "Discovery Log Page").

use crate::config::DISCOVERY_NQN;

/// Writes a space-padded ASCII string field.
fn ascii(buf: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut buf[at..at + len];
    field.fill(b' ');
    let b = s.as_bytes();
    let n = b.len().min(len);
    field[..n].copy_from_slice(&b[..n]);
}

/// Writes a NUL-padded string field (NQNs, addresses).
fn nul_padded(buf: &mut [u8], at: usize, len: usize, s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(len - 1);
    buf[at..at + n].copy_from_slice(&b[..n]);
}

fn put16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// What Identify Controller reports.
pub(crate) struct ControllerIdentity<'a> {
    pub cntlid: u16,
    pub serial: &'a str,
    pub subnqn: &'a str,
    pub namespaces: u32,
    pub mdts: u8,
    pub max_cmd: u16,
    pub inline_data: u32,
    pub discovery: bool,
}

/// NVMe version 1.4.
pub(crate) const VERSION: u32 = 0x0001_0400;

/// The 4096-byte Identify Controller data structure.
pub(crate) fn controller(c: &ControllerIdentity<'_>) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    ascii(&mut b, 4, 20, c.serial);
    ascii(&mut b, 24, 40, if c.discovery { "insitu discovery controller" } else { "insitu computational storage" });
    ascii(&mut b, 64, 8, env!("CARGO_PKG_VERSION"));
    b[72] = 6; // RAB
    b[76] = 0x02; // CMIC: several controllers may share the subsystem
    b[77] = c.mdts;
    put16(&mut b, 78, c.cntlid);
    put32(&mut b, 80, VERSION);
    b[111] = if c.discovery { 2 } else { 1 }; // CNTRLTYPE
    b[258] = 3; // ACL
    b[259] = 3; // AERL
    b[260] = 0x03; // FRMW: one slot, read-only
    b[261] = 0x04; // LPA: extended data for Get Log Page
    put16(&mut b, 320, 10); // KAS: keep-alive granularity 1 s
    b[512] = 0x66; // SQES
    b[513] = 0x44; // CQES
    put16(&mut b, 514, c.max_cmd);
    put32(&mut b, 516, c.namespaces);
    if !c.discovery {
        put16(&mut b, 520, 0x0C); // ONCS: Dataset Management, Write Zeroes
        b[525] = 0x01; // VWC: a volatile write cache, so hosts send Flush
    }
    // SGLS: SGLs supported; in-capsule data offsets supported.
    put32(&mut b, 536, 1 | (1 << 20));
    nul_padded(&mut b, 768, 256, c.subnqn);
    put32(&mut b, 1792, (64 + c.inline_data) / 16); // IOCCSZ
    put32(&mut b, 1796, 1); // IORCSZ
    b[1803] = 1; // MSDBD
    b
}

/// A stable 16-byte identifier derived from text (namespace GUIDs, UUIDs).
pub(crate) fn guid(seed: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(4).enumerate() {
        let c = crc32c::crc32c_append(i as u32 ^ 0x5bd1_e995, seed.as_bytes());
        chunk.copy_from_slice(&c.to_le_bytes());
    }
    out[6] = (out[6] & 0x0F) | 0x40; // UUID version 4 layout
    out[8] = (out[8] & 0x3F) | 0x80;
    out
}

/// The 4096-byte Identify Namespace data structure; all zeros for an inactive namespace.
pub(crate) fn namespace(blocks: u64, lba_size: u32, nguid: [u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put64(&mut b, 0, blocks); // NSZE
    put64(&mut b, 8, blocks); // NCAP
    put64(&mut b, 16, blocks); // NUSE
    b[30] = 0x01; // NMIC: may be attached to several controllers
    b[33] = 0x01; // DLFEAT: deallocated blocks read as zeros
    b[104..120].copy_from_slice(&nguid);
    b[130] = lba_size.trailing_zeros() as u8; // LBAF0.LBADS
    b
}

/// The Namespace Identification Descriptor list: NGUID, UUID and command set (NVM).
pub(crate) fn namespace_descriptors(nguid: [u8; 16]) -> Vec<u8> {
    namespace_descriptors_csi(nguid, 0)
}

/// The Namespace Identification Descriptor list with command set identifier `csi`.
pub(crate) fn namespace_descriptors_csi(nguid: [u8; 16], csi: u8) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut at = 0;
    for (nidt, id) in [(2u8, &nguid[..]), (3u8, &nguid[..]), (4u8, &[csi][..])] {
        b[at] = nidt;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    }
    b
}

/// The Active Namespace ID list: NSIDs greater than `after`, ascending.
pub(crate) fn active_namespaces(nsids: &[u32], after: u32) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, n) in nsids.iter().filter(|n| **n > after).take(1024).enumerate() {
        put32(&mut b, i * 4, *n);
    }
    b
}

/// One entry of the discovery log.
pub(crate) struct DiscoveryEntry<'a> {
    pub subnqn: &'a str,
    pub traddr: &'a str,
    pub trsvcid: &'a str,
    pub ipv6: bool,
}

/// The discovery log page: a 1024-byte header and 1024 bytes per entry.
pub(crate) fn discovery_log(generation: u64, entries: &[DiscoveryEntry<'_>]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    put64(&mut b, 0, generation);
    put64(&mut b, 8, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        let at = 1024 * (i + 1);
        b[at] = 3; // TRTYPE: TCP
        b[at + 1] = if e.ipv6 { 2 } else { 1 }; // ADRFAM
        b[at + 2] = if e.subnqn == DISCOVERY_NQN { 3 } else { 2 }; // SUBTYPE
        b[at + 3] = 0x02; // TREQ: secure channel not required
        put16(&mut b, at + 4, 1); // PORTID
        put16(&mut b, at + 6, 0xFFFF); // CNTLID: dynamic
        put16(&mut b, at + 8, 32); // ASQSZ
        nul_padded(&mut b, at + 32, 32, e.trsvcid);
        nul_padded(&mut b, at + 256, 256, e.subnqn);
        nul_padded(&mut b, at + 512, 256, e.traddr);
        b[at + 768] = 0; // TSAS.SECTYPE: none
    }
    b
}

/// The 512-byte SMART / Health log: no warnings, a plausible temperature, data units read
/// and written (in thousands of 512-byte units, rounded up, as the specification counts).
pub(crate) fn smart_log(read_bytes: u64, written_bytes: u64, host_reads: u64, host_writes: u64) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    put16(&mut b, 1, 273 + 40); // composite temperature, kelvin
    b[3] = 100; // available spare
    b[4] = 10; // spare threshold
    let units = |bytes: u64| bytes.div_ceil(512 * 1000);
    put64(&mut b, 32, units(read_bytes));
    put64(&mut b, 48, units(written_bytes));
    put64(&mut b, 64, host_reads);
    put64(&mut b, 80, host_writes);
    b
}

/// The 512-byte Firmware Slot Information log: slot 1 active.
pub(crate) fn firmware_log() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1;
    ascii(&mut b, 8, 8, env!("CARGO_PKG_VERSION"));
    b
}
