// SPDX-License-Identifier: Apache-2.0
//! Parsing of Identify data structures and the discovery log page.

/// Fields of the Identify Controller data structure (CNS 01h) the initiator uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Controller ID (bytes 78-79).
    pub cntlid: u16,
    /// PCI Vendor ID (bytes 0-1).
    pub vid: u16,
    /// Serial number, trimmed (bytes 4-23).
    pub serial: String,
    /// Model number, trimmed (bytes 24-63).
    pub model: String,
    /// Firmware revision, trimmed (bytes 64-71).
    pub firmware: String,
    /// Maximum data transfer size in bytes (byte 77: 2^MDTS minimum-size pages);
    /// `None` when the controller reports no limit.
    pub mdts_bytes: Option<u64>,
    /// Number of namespaces (bytes 516-519).
    pub nn: u32,
    /// Subsystem NQN (bytes 768-1023).
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units (bytes 1792-1795).
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units (bytes 1796-1799).
    pub iorcsz: u32,
    /// Maximum outstanding commands (bytes 514-515).
    pub maxcmd: u16,
    /// Keep-alive granularity, in 100 ms units (bytes 320-321).
    pub kas: u16,
    /// SGL support (bytes 536-539).
    pub sgls: u32,
    /// The whole 4096-byte structure.
    pub raw: Vec<u8>,
}

use insitu_proto::le::{u16_at, u32_at, u64_at};

/// An ASCII field: space-padded (Identify) or NUL-padded (NQNs, discovery entries).
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim().to_string()
}

impl ControllerInfo {
    /// Parses a 4096-byte Identify Controller structure; `min_page` is the controller's
    /// minimum memory page size (CAP.MPSMIN, 4096 for 0) that MDTS counts in.
    pub fn parse(raw: &[u8], min_page: u64) -> Option<ControllerInfo> {
        if raw.len() < 4096 {
            return None;
        }
        let mdts = raw[77];
        Some(ControllerInfo {
            cntlid: u16_at(raw, 78),
            vid: u16_at(raw, 0),
            serial: text(&raw[4..24]),
            model: text(&raw[24..64]),
            firmware: text(&raw[64..72]),
            mdts_bytes: (mdts != 0).then(|| min_page.checked_shl(u32::from(mdts)).unwrap_or(u64::MAX)),
            nn: u32_at(raw, 516),
            subnqn: text(&raw[768..1024]),
            ioccsz: u32_at(raw, 1792),
            iorcsz: u32_at(raw, 1796),
            maxcmd: u16_at(raw, 514),
            kas: u16_at(raw, 320),
            sgls: u32_at(raw, 536),
            raw: raw[..4096].to_vec(),
        })
    }

    /// Bytes of data an I/O command capsule can carry in-capsule: IOCCSZ × 16 − 64.
    pub fn in_capsule_bytes(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(64)
    }
}

/// Fields of the Identify Namespace data structure (CNS 00h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// The namespace.
    pub nsid: u32,
    /// Namespace size, in logical blocks.
    pub nsze: u64,
    /// Namespace capacity, in logical blocks.
    pub ncap: u64,
    /// Namespace utilization, in logical blocks.
    pub nuse: u64,
    /// Bytes per logical block of the format in use (FLBAS).
    pub lba_size: u32,
    /// The whole 4096-byte structure.
    pub raw: Vec<u8>,
}

impl NamespaceInfo {
    /// Parses a 4096-byte Identify Namespace structure. `None` for an inactive namespace
    /// (all zeroes: no size, no valid LBA format) or a short buffer.
    pub fn parse(nsid: u32, raw: &[u8]) -> Option<NamespaceInfo> {
        if raw.len() < 4096 {
            return None;
        }
        let flbas = raw[26];
        // Format index: bits 3:0, plus bits 6:5 as the high bits when NLBAF > 16.
        let idx = usize::from(flbas & 0xF) | if raw[25] >= 16 { usize::from((flbas >> 5) & 3) << 4 } else { 0 };
        let lbads = raw[128 + idx * 4 + 2];
        let nsze = u64_at(raw, 0);
        if nsze == 0 || !(9..32).contains(&lbads) {
            return None;
        }
        Some(NamespaceInfo { nsid, nsze, ncap: u64_at(raw, 8), nuse: u64_at(raw, 16), lba_size: 1 << lbads, raw: raw[..4096].to_vec() })
    }

    /// Size of the namespace in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nsze.saturating_mul(u64::from(self.lba_size))
    }
}

/// The command set of a namespace, from the Command Set Identifier of its Namespace
/// Identification Descriptors (Identify CNS 03h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSet {
    /// The NVM command set (CSI 00h): logical blocks, Read and Write.
    Nvm,
    /// The Key Value command set (CSI 01h): Store, Retrieve, Delete, Exist, List.
    KeyValue,
    /// Any other command set.
    Other(u8),
}

impl From<u8> for CommandSet {
    fn from(csi: u8) -> CommandSet {
        match csi {
            0 => CommandSet::Nvm,
            1 => CommandSet::KeyValue,
            n => CommandSet::Other(n),
        }
    }
}

impl CommandSet {
    /// The name `insitu nvme identify` shows (`nvm`, `key-value`, or `csi-N`).
    pub fn name(self) -> String {
        match self {
            CommandSet::Nvm => "nvm".into(),
            CommandSet::KeyValue => "key-value".into(),
            CommandSet::Other(n) => format!("csi-{n}"),
        }
    }

    /// The Command Set Identifier of a descriptor list (CNS 03h); a list without a CSI
    /// descriptor (type 04h) is an NVM namespace's, as the specification defaults it.
    pub fn of_descriptors(list: &[u8]) -> CommandSet {
        let mut at = 0usize;
        while at + 4 <= list.len() && list[at] != 0 {
            let len = usize::from(list[at + 1]);
            if list[at] == 4 && len >= 1 {
                return list.get(at + 4).map_or(CommandSet::Nvm, |&c| CommandSet::from(c));
            }
            let Some(next) = at.checked_add(4 + len) else { break };
            at = next;
        }
        CommandSet::Nvm
    }
}

/// Fields of the Key Value command set's Identify Namespace structure (CNS 05h, CSI 01h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvNamespaceInfo {
    /// The namespace.
    pub nsid: u32,
    /// Namespace size: the bytes of keys and values it can hold (NSZE).
    pub capacity_bytes: u64,
    /// The longest key of KV format 0, in bytes (KML).
    pub max_key_bytes: u16,
    /// The longest value of KV format 0, in bytes (VML).
    pub max_value_bytes: u32,
}

impl KvNamespaceInfo {
    /// Parses the 4096-byte structure; `None` for a short buffer or one with no KV format.
    pub fn parse(nsid: u32, raw: &[u8]) -> Option<KvNamespaceInfo> {
        if raw.len() < 4096 || raw[25] == 0 {
            return None;
        }
        Some(KvNamespaceInfo {
            nsid,
            capacity_bytes: u64_at(raw, 0),
            max_key_bytes: u16::from_le_bytes([raw[72], raw[73]]),
            max_value_bytes: u32::from_le_bytes(raw[76..80].try_into().expect("4 bytes")),
        })
    }
}

/// The NSIDs of an Active Namespace ID list (CNS 02h): u32s up to the first zero.
pub fn parse_ns_list(raw: &[u8]) -> Vec<u32> {
    raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).take_while(|&n| n != 0).collect()
}

/// One entry of the discovery log page (log identifier 70h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (3 = TCP).
    pub trtype: u8,
    /// Address family (1 = IPv4, 2 = IPv6).
    pub adrfam: u8,
    /// Subsystem type (1 = referral to a discovery service, 2 = NVM subsystem,
    /// 3 = current discovery subsystem).
    pub subtype: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Transport service identifier (the TCP port, as text).
    pub trsvcid: String,
    /// Transport address (the IP address, as text).
    pub traddr: String,
    /// Subsystem NQN.
    pub subnqn: String,
}

/// Length of the discovery log page header, and of each entry.
pub const DISCOVERY_RECORD: usize = 1024;

/// The generation counter and record count of a discovery log page header.
pub fn discovery_header(raw: &[u8]) -> Option<(u64, u64)> {
    (raw.len() >= 16).then(|| (u64_at(raw, 0), u64_at(raw, 8)))
}

/// Parses a discovery log page: header (GENCTR @0, NUMREC @8, RECFMT @16) then 1024-byte
/// entries from byte 1024. Entries beyond the buffer are ignored.
pub fn parse_discovery_log(raw: &[u8]) -> Vec<DiscoveryEntry> {
    let Some((_, numrec)) = discovery_header(raw) else { return Vec::new() };
    raw.get(DISCOVERY_RECORD..)
        .unwrap_or(&[])
        .chunks_exact(DISCOVERY_RECORD)
        .take(usize::try_from(numrec).unwrap_or(usize::MAX))
        .map(|e| DiscoveryEntry {
            trtype: e[0],
            adrfam: e[1],
            subtype: e[2],
            portid: u16_at(e, 4),
            cntlid: u16_at(e, 6),
            trsvcid: text(&e[32..64]),
            subnqn: text(&e[256..512]),
            traddr: text(&e[512..768]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut [u8], at: usize, s: &[u8]) {
        b[at..at + s.len()].copy_from_slice(s);
    }

    #[test]
    fn identify_controller_fields() {
        let mut raw = vec![0u8; 4096];
        put(&mut raw, 0, &0x1B36u16.to_le_bytes());
        put(&mut raw, 4, b"SN123               ");
        put(&mut raw, 24, b"insitu                                  ");
        put(&mut raw, 64, b"0.1     ");
        raw[77] = 5;
        put(&mut raw, 78, &9u16.to_le_bytes());
        put(&mut raw, 320, &10u16.to_le_bytes());
        put(&mut raw, 514, &128u16.to_le_bytes());
        put(&mut raw, 516, &4u32.to_le_bytes());
        put(&mut raw, 536, &0x0010_0001u32.to_le_bytes());
        put(&mut raw, 768, b"nqn.2024-01.io.insitu:ns");
        put(&mut raw, 1792, &260u32.to_le_bytes());
        put(&mut raw, 1796, &1u32.to_le_bytes());
        let c = ControllerInfo::parse(&raw, 4096).unwrap();
        assert_eq!((c.vid, c.cntlid, c.kas, c.maxcmd, c.nn, c.sgls), (0x1B36, 9, 10, 128, 4, 0x0010_0001));
        assert_eq!((c.serial.as_str(), c.model.as_str(), c.firmware.as_str()), ("SN123", "insitu", "0.1"));
        assert_eq!(c.mdts_bytes, Some(128 << 10));
        assert_eq!(c.subnqn, "nqn.2024-01.io.insitu:ns");
        assert_eq!((c.ioccsz, c.iorcsz, c.in_capsule_bytes()), (260, 1, 4096));
        raw[77] = 0;
        assert_eq!(ControllerInfo::parse(&raw, 4096).unwrap().mdts_bytes, None);
        assert!(ControllerInfo::parse(&raw[..100], 4096).is_none());
    }

    #[test]
    fn command_sets_of_descriptor_lists() {
        let mut list = vec![0u8; 4096];
        // An NGUID descriptor (type 02h, 16 bytes), then a CSI descriptor (type 04h) saying 01h.
        list[0] = 2;
        list[1] = 16;
        list[20] = 4;
        list[21] = 1;
        list[24] = 1;
        assert_eq!(CommandSet::of_descriptors(&list), CommandSet::KeyValue);
        list[24] = 7;
        assert_eq!(CommandSet::of_descriptors(&list).name(), "csi-7");
        list[20] = 0;
        assert_eq!(CommandSet::of_descriptors(&list), CommandSet::Nvm);
        // A descriptor whose length runs past the buffer ends the walk without a panic.
        assert_eq!(CommandSet::of_descriptors(&[2, 255, 0, 0, 1, 2]), CommandSet::Nvm);
    }

    #[test]
    fn kv_namespace_fields() {
        let mut raw = vec![0u8; 4096];
        raw[..8].copy_from_slice(&(64u64 << 20).to_le_bytes());
        raw[25] = 1;
        raw[72..74].copy_from_slice(&16u16.to_le_bytes());
        raw[76..80].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let kv = KvNamespaceInfo::parse(3, &raw).unwrap();
        assert_eq!((kv.nsid, kv.capacity_bytes, kv.max_key_bytes, kv.max_value_bytes), (3, 64 << 20, 16, 1 << 20));
        raw[25] = 0;
        assert!(KvNamespaceInfo::parse(3, &raw).is_none());
        assert!(KvNamespaceInfo::parse(3, &raw[..100]).is_none());
    }

    #[test]
    fn identify_namespace_fields() {
        let mut raw = vec![0u8; 4096];
        assert!(NamespaceInfo::parse(1, &raw).is_none(), "inactive namespace");
        put(&mut raw, 0, &2048u64.to_le_bytes());
        put(&mut raw, 8, &2048u64.to_le_bytes());
        put(&mut raw, 16, &100u64.to_le_bytes());
        raw[25] = 1; // two formats
        raw[26] = 1; // the second is in use
        raw[128 + 2] = 9;
        raw[132 + 2] = 12;
        let n = NamespaceInfo::parse(3, &raw).unwrap();
        assert_eq!((n.nsid, n.nsze, n.ncap, n.nuse, n.lba_size), (3, 2048, 2048, 100, 4096));
        assert_eq!(n.size_bytes(), 8 << 20);
        // NLBAF > 16: FLBAS bits 6:5 extend the index.
        raw[25] = 20;
        raw[26] = 0x21; // index 0x11
        raw[128 + 17 * 4 + 2] = 10;
        assert_eq!(NamespaceInfo::parse(3, &raw).unwrap().lba_size, 1024);
    }

    #[test]
    fn ns_list_stops_at_zero() {
        let mut raw = vec![0u8; 4096];
        put(&mut raw, 0, &1u32.to_le_bytes());
        put(&mut raw, 4, &7u32.to_le_bytes());
        put(&mut raw, 12, &9u32.to_le_bytes());
        assert_eq!(parse_ns_list(&raw), vec![1, 7]);
        assert!(parse_ns_list(&[0; 8]).is_empty());
    }

    #[test]
    fn discovery_log_page() {
        let mut raw = vec![0u8; 3 * 1024];
        put(&mut raw, 0, &42u64.to_le_bytes());
        put(&mut raw, 8, &2u64.to_le_bytes());
        for (i, (nqn, port)) in [("nqn.2014-08.org.nvmexpress.discovery", "4420"), ("nqn.2024-01.io.insitu:a", "4421")].iter().enumerate() {
            let e = 1024 * (i + 1);
            raw[e] = 3;
            raw[e + 1] = 1;
            raw[e + 2] = if i == 0 { 3 } else { 2 };
            put(&mut raw, e + 4, &(i as u16 + 1).to_le_bytes());
            put(&mut raw, e + 6, &0xFFFFu16.to_le_bytes());
            put(&mut raw, e + 32, port.as_bytes());
            put(&mut raw, e + 256, nqn.as_bytes());
            put(&mut raw, e + 512, b"127.0.0.1");
        }
        assert_eq!(discovery_header(&raw), Some((42, 2)));
        let entries = parse_discovery_log(&raw);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[1],
            DiscoveryEntry {
                trtype: 3,
                adrfam: 1,
                subtype: 2,
                portid: 2,
                cntlid: 0xFFFF,
                trsvcid: "4421".into(),
                traddr: "127.0.0.1".into(),
                subnqn: "nqn.2024-01.io.insitu:a".into()
            }
        );
        assert_eq!(entries[0].subtype, 3);
        // A header that promises more entries than the buffer holds.
        put(&mut raw, 8, &10u64.to_le_bytes());
        assert_eq!(parse_discovery_log(&raw).len(), 2);
        assert!(parse_discovery_log(&raw[..8]).is_empty());
        assert!(parse_discovery_log(&raw[..1024]).is_empty());
    }
}
