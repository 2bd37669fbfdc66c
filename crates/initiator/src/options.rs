// SPDX-License-Identifier: Apache-2.0
//! Connection options and the host's default identity.

use insitu_fabric::Digests;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// How to reach a subsystem and who the host is.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Target address, `"host:port"` (the NVMe/TCP port is usually 4420).
    pub addr: String,
    /// NQN of the subsystem to connect to, or [`DISCOVERY_NQN`](crate::DISCOVERY_NQN) for
    /// the discovery controller (admin queue only).
    pub subnqn: String,
    /// This host's NQN (default: [`default_hostnqn`]).
    pub hostnqn: String,
    /// This host's identifier (default: [`default_hostid`]).
    pub hostid: [u8; 16],
    /// Header and data digests to request (default: none).
    pub digests: Digests,
    /// Commands outstanding per I/O queue (default 32; capped by the controller's CAP.MQES).
    pub queue_depth: u16,
    /// I/O queues to open (default 1; capped by what Set Features grants).
    pub io_queues: u16,
    /// Keep-alive timeout in milliseconds; Keep Alive is sent every half of it (default
    /// 30000; 0 disables keep-alive).
    pub kato_ms: u32,
    /// How long to wait for the connection and for each command (default 30 s).
    pub timeout: Duration,
    /// Largest transfer of one Read or Write command; longer reads and writes are split
    /// into commands of this size, pipelined on one queue (as Linux's `max_sectors_kb`
    /// does). Default `None`: the controller's MDTS. Never above MDTS; passthrough
    /// commands are not split and are held to MDTS only.
    pub max_io_bytes: Option<usize>,
}

impl ConnectOptions {
    /// Options for `subnqn` at `addr` with the defaults above.
    pub fn new(addr: impl Into<String>, subnqn: impl Into<String>) -> Self {
        ConnectOptions {
            addr: addr.into(),
            subnqn: subnqn.into(),
            hostnqn: default_hostnqn(),
            hostid: default_hostid(),
            digests: Digests::default(),
            queue_depth: 32,
            io_queues: 1,
            kato_ms: 30_000,
            timeout: Duration::from_secs(30),
            max_io_bytes: None,
        }
    }
}

impl Default for ConnectOptions {
    /// The discovery controller at `127.0.0.1:4420`, with the defaults above; set `addr`
    /// and `subnqn` with struct update syntax.
    fn default() -> Self {
        ConnectOptions::new("127.0.0.1:4420", crate::DISCOVERY_NQN)
    }
}

/// 16 bytes that identify this host, stable across runs: a hash of `/etc/machine-id`
/// (never sent as is, as systemd asks), or of the host name when there is no machine ID,
/// shaped as an RFC 9562 version-8 UUID.
pub fn default_hostid() -> [u8; 16] {
    let seed = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .map(|s| format!("machine-id:{s}"))
        .unwrap_or_else(|| format!("hostname:{}", hostname()));
    uuid_from_seed(&seed)
}

/// `nqn.2014-08.org.nvmexpress:uuid:<uuid>` with the UUID of [`default_hostid`].
pub fn default_hostnqn() -> String {
    hostnqn_for(&default_hostid())
}

/// The UUID-form host NQN for a host identifier.
pub fn hostnqn_for(id: &[u8; 16]) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(id))
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

fn uuid_from_seed(seed: &str) -> [u8; 16] {
    let h = Sha256::new().chain_update(b"insitu-initiator host id\0").chain_update(seed.as_bytes()).finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&h[..16]);
    id[6] = (id[6] & 0x0F) | 0x80; // version 8
    id[8] = (id[8] & 0x3F) | 0x80; // variant 10
    id
}

/// Lower-case 8-4-4-4-12 form.
pub(crate) fn format_uuid(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnqn_is_a_stable_uuid_nqn() {
        let a = default_hostnqn();
        assert_eq!(a, default_hostnqn());
        let uuid = a.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:").expect("prefix");
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, vec![8, 4, 4, 4, 12]);
        assert!(uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(&uuid[14..15], "8", "version nibble");
        assert!("89ab".contains(&uuid[19..20]), "variant");
        assert_eq!(a, hostnqn_for(&default_hostid()));
    }

    #[test]
    fn different_seeds_differ() {
        assert_ne!(uuid_from_seed("machine-id:a"), uuid_from_seed("machine-id:b"));
        assert_eq!(format_uuid(&[0xAB; 16]), "abababab-abab-abab-abab-abababababab");
    }

    #[test]
    fn defaults() {
        let o = ConnectOptions::new("127.0.0.1:4420", "nqn.x");
        assert_eq!((o.queue_depth, o.io_queues, o.kato_ms, o.timeout), (32, 1, 30_000, Duration::from_secs(30)));
        assert_eq!(o.digests, Digests::default());
    }
}
