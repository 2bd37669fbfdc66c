// SPDX-License-Identifier: Apache-2.0
//! Building submission queue entries and Connect data, and splitting transfers at the
//! controller's limits. Pure functions: nothing here touches the network.

use insitu_fabric::{fabrics, opcode, Command};

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Controller property offsets (NVMe base specification, "Controller Registers").
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1C;
}

/// CC.EN with IOSQES = 6 (64-byte SQEs) and IOCQES = 4 (16-byte CQEs), NVM command set,
/// 4 KiB memory pages, round-robin arbitration.
pub const CC_ENABLE: u32 = 1 | (6 << 16) | (4 << 20);
/// CC.SHN = 01b: normal shutdown notification.
pub const CC_SHN_NORMAL: u32 = 1 << 14;

/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// The 1024-byte Connect data: host identifier @0, controller ID @16, subsystem NQN @256,
/// host NQN @512 (NUL-padded, at most 255 bytes each).
pub fn connect_data(hostid: &[u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    let mut d = vec![0u8; CONNECT_DATA_LEN];
    d[0..16].copy_from_slice(hostid);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    let put = |d: &mut [u8], at: usize, s: &str| {
        let b = &s.as_bytes()[..s.len().min(255)];
        d[at..at + b.len()].copy_from_slice(b);
    };
    put(&mut d, 256, subnqn);
    put(&mut d, 512, hostnqn);
    d
}

/// A Fabrics command of type `fctype`.
fn fabrics_cmd(fctype: u8) -> Command {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::FABRICS);
    c.0[4] = fctype;
    c
}

/// Fabrics Connect: record format 0 @40, QID @42, SQSIZE (0-based) @44, KATO (ms) @48.
pub fn connect(qid: u16, sqsize: u16, kato_ms: u32) -> Command {
    let mut c = fabrics_cmd(fabrics::CONNECT);
    c.0[42..44].copy_from_slice(&qid.to_le_bytes());
    c.0[44..46].copy_from_slice(&sqsize.to_le_bytes());
    c.0[48..52].copy_from_slice(&kato_ms.to_le_bytes());
    c
}

/// Property Get of a 4- or 8-byte property: ATTRIB @40 (1 = 8 bytes), OFST @44.
pub fn property_get(offset: u32, size8: bool) -> Command {
    let mut c = fabrics_cmd(fabrics::PROPERTY_GET);
    c.0[40] = u8::from(size8);
    c.0[44..48].copy_from_slice(&offset.to_le_bytes());
    c
}

/// Property Set: ATTRIB @40, OFST @44, VALUE @48.
pub fn property_set(offset: u32, size8: bool, value: u64) -> Command {
    let mut c = fabrics_cmd(fabrics::PROPERTY_SET);
    c.0[40] = u8::from(size8);
    c.0[44..48].copy_from_slice(&offset.to_le_bytes());
    c.0[48..56].copy_from_slice(&value.to_le_bytes());
    c
}

/// Identify with CNS in CDW10 bits 7:0 (0 namespace, 1 controller, 2 active NSID list,
/// 3 namespace identification descriptors).
pub fn identify(cns: u8, nsid: u32) -> Command {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::IDENTIFY).set_nsid(nsid).set_cdw(10, u32::from(cns));
    c
}

/// Get Log Page of `len` bytes (a multiple of 4, at least 4) at byte `offset`:
/// LID CDW10 7:0, NUMDL CDW10 31:16 and NUMDU CDW11 15:0 (dwords, 0-based), offset
/// CDW12/13.
pub fn get_log_page(nsid: u32, lid: u8, offset: u64, len: usize) -> Command {
    let numd = (len / 4).saturating_sub(1) as u32;
    let mut c = Command::zeroed();
    c.set_opcode(opcode::GET_LOG_PAGE)
        .set_nsid(nsid)
        .set_cdw(10, u32::from(lid) | (numd & 0xFFFF) << 16)
        .set_cdw(11, numd >> 16)
        .set_cdw(12, offset as u32)
        .set_cdw(13, (offset >> 32) as u32);
    c
}

/// Set Features, Number of Queues (FID 7): NSQR and NCQR, 0-based, in CDW11.
pub fn set_num_queues(n: u16) -> Command {
    let n = u32::from(n.max(1) - 1);
    let mut c = Command::zeroed();
    c.set_opcode(opcode::SET_FEATURES).set_cdw(10, 7).set_cdw(11, n | n << 16);
    c
}

/// Keep Alive.
pub fn keep_alive() -> Command {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::KEEP_ALIVE);
    c
}

/// Read or Write (or any command with the same layout): SLBA CDW10/11, NLB-1 CDW12 15:0.
/// `nlb` must be 1..=65536.
pub fn rw(op: u8, nsid: u32, slba: u64, nlb: u32) -> Command {
    debug_assert!((1..=MAX_NLB).contains(&nlb));
    let mut c = Command::zeroed();
    c.set_opcode(op).set_nsid(nsid).set_cdw(10, slba as u32).set_cdw(11, (slba >> 32) as u32).set_cdw(12, nlb - 1);
    c
}

/// Flush.
pub fn flush(nsid: u32) -> Command {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::FLUSH).set_nsid(nsid);
    c
}

/// Dataset Management with `nr` ranges (1..=256) and the Attribute Deallocate bit.
pub fn deallocate(nsid: u32, nr: usize) -> Command {
    debug_assert!((1..=MAX_DSM_RANGES).contains(&nr));
    let mut c = Command::zeroed();
    c.set_opcode(opcode::DSM).set_nsid(nsid).set_cdw(10, (nr - 1) as u32).set_cdw(11, 1 << 2);
    c
}

/// The 16-byte DSM ranges: context attributes u32, length in blocks u32, SLBA u64.
pub fn dsm_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut d = Vec::with_capacity(ranges.len() * 16);
    for &(slba, nlb) in ranges {
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&nlb.to_le_bytes());
        d.extend_from_slice(&slba.to_le_bytes());
    }
    d
}

/// Most blocks one Read/Write/Write Zeroes can carry (NLB is 16 bits, 0-based).
pub const MAX_NLB: u32 = 1 << 16;
/// Most ranges in one Dataset Management command.
pub const MAX_DSM_RANGES: usize = 256;
/// Transfer size used per command when the controller reports no limit (MDTS 0).
pub const UNLIMITED_TRANSFER_CAP: usize = 4 << 20;

/// Bytes one command may move: MDTS (`None` = unlimited) capped at
/// [`UNLIMITED_TRANSFER_CAP`] when unlimited.
pub fn max_transfer(mdts_bytes: Option<u64>) -> usize {
    match mdts_bytes {
        Some(b) => usize::try_from(b).unwrap_or(usize::MAX).min(u32::MAX as usize),
        None => UNLIMITED_TRANSFER_CAP,
    }
}

/// Splits `nlb` blocks from `slba` into commands of at most `max_bytes` bytes (and at most
/// [`MAX_NLB`] blocks); each piece is (slba, nlb, byte offset into the whole transfer).
/// `max_bytes` smaller than one block is treated as one block.
pub fn split_blocks(slba: u64, nlb: u64, lba_size: u32, max_bytes: usize) -> Vec<(u64, u32, usize)> {
    let per = ((max_bytes / lba_size as usize) as u64).clamp(1, u64::from(MAX_NLB));
    let mut out = Vec::with_capacity(nlb.div_ceil(per) as usize);
    let mut done = 0u64;
    while done < nlb {
        let n = per.min(nlb - done);
        out.push((slba + done, n as u32, (done * u64::from(lba_size)) as usize));
        done += n;
    }
    out
}

/// Splits a byte length into pieces of at most `max` bytes: (offset, len).
pub fn split_bytes(len: usize, max: usize) -> Vec<(usize, usize)> {
    let max = max.max(1);
    (0..len).step_by(max).map(|o| (o, max.min(len - o))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_data_layout() {
        let hostid = [7u8; 16];
        let d = connect_data(&hostid, 0xFFFF, "nqn.sub", "nqn.host");
        assert_eq!(d.len(), 1024);
        assert_eq!(&d[0..16], &hostid);
        assert_eq!(&d[16..18], &[0xFF, 0xFF]);
        assert!(d[18..256].iter().all(|&b| b == 0));
        assert_eq!(&d[256..263], b"nqn.sub");
        assert_eq!(d[263], 0);
        assert_eq!(&d[512..520], b"nqn.host");
        assert!(d[520..].iter().all(|&b| b == 0));
        // Over-long NQNs are cut to 255 bytes so the field stays NUL-terminated.
        let long = "x".repeat(400);
        let d = connect_data(&hostid, 1, &long, &long);
        assert_eq!(d[256 + 254], b'x');
        assert_eq!(d[256 + 255], 0);
        assert_eq!(d[512 + 255], 0);
    }

    #[test]
    fn fabrics_commands_layout() {
        let c = connect(3, 31, 30_000);
        assert_eq!((c.opcode(), c.fctype()), (0x7F, 0x01));
        assert_eq!(&c.0[42..46], &[3, 0, 31, 0]);
        assert_eq!(u32::from_le_bytes(c.0[48..52].try_into().unwrap()), 30_000);
        let g = property_get(property::CAP, true);
        assert_eq!((g.fctype(), g.0[40], g.cdw(11)), (0x04, 1, 0));
        let s = property_set(property::CC, false, u64::from(CC_ENABLE));
        assert_eq!((s.fctype(), s.0[40], s.cdw(11), s.cdw(12)), (0x00, 0, property::CC, CC_ENABLE));
        assert_eq!(CC_ENABLE, 0x0046_0001);
    }

    #[test]
    fn admin_and_io_commands_layout() {
        let c = get_log_page(0xFFFF_FFFF, 0x70, 0x1_0000_0400, 8192);
        assert_eq!(c.cdw(10), 0x70 | (2047 << 16));
        assert_eq!((c.cdw(11), c.cdw(12), c.cdw(13)), (0, 0x400, 1));
        let big = get_log_page(0, 2, 0, 1 << 20);
        assert_eq!((big.cdw(10) >> 16, big.cdw(11)), (0xFFFF, 3));
        let q = set_num_queues(4);
        assert_eq!((q.opcode(), q.cdw(10), q.cdw(11)), (0x09, 7, 0x0003_0003));
        let r = rw(opcode::READ, 1, 0x1_2345_6789, 8);
        assert_eq!((r.opcode(), r.nsid(), r.cdw(10), r.cdw(11), r.cdw(12)), (0x02, 1, 0x2345_6789, 1, 7));
        let r = rw(opcode::WRITE, 1, 0, MAX_NLB);
        assert_eq!(r.cdw(12), 0xFFFF);
        let d = deallocate(2, 3);
        assert_eq!((d.opcode(), d.cdw(10), d.cdw(11)), (0x09, 2, 4));
        let ranges = dsm_ranges(&[(0x10, 8), (u64::MAX, 1)]);
        assert_eq!(ranges.len(), 32);
        assert_eq!(&ranges[0..16], &[0, 0, 0, 0, 8, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&ranges[24..32], &[0xFF; 8]);
        assert_eq!(identify(1, 0).cdw(10), 1);
        assert_eq!(keep_alive().opcode(), 0x18);
    }

    #[test]
    fn mdts_splitting() {
        assert_eq!(max_transfer(Some(128 << 10)), 128 << 10);
        assert_eq!(max_transfer(None), UNLIMITED_TRANSFER_CAP);
        // 1000 blocks of 512 bytes, 128 KiB per command: 256 blocks each.
        let s = split_blocks(10, 1000, 512, 128 << 10);
        assert_eq!(s, vec![(10, 256, 0), (266, 256, 131072), (522, 256, 262144), (778, 232, 393216)]);
        assert_eq!(s.iter().map(|p| u64::from(p.1)).sum::<u64>(), 1000);
        // Exactly one command's worth.
        assert_eq!(split_blocks(0, 32, 4096, 128 << 10), vec![(0, 32, 0)]);
        // NLB's 16 bits cap a command even when MDTS does not.
        let s = split_blocks(0, 70_000, 512, usize::MAX);
        assert_eq!(s, vec![(0, 65536, 0), (65536, 4464, 65536 * 512)]);
        // An MDTS below one block still makes progress.
        assert_eq!(split_blocks(0, 2, 4096, 512), vec![(0, 1, 0), (1, 1, 4096)]);
        assert!(split_blocks(5, 0, 512, 4096).is_empty());
        assert_eq!(split_bytes(10, 4), vec![(0, 4), (4, 4), (8, 2)]);
        assert!(split_bytes(0, 4).is_empty());
    }
}
