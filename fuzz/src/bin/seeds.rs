// SPDX-License-Identifier: Apache-2.0
//! Writes the seed corpus of the `capsule` and `pdu` targets into DIR (default
//! fuzz/seeds): well-formed sessions, and each PDU of them alone.

use insitu_fabric::CommonHeader;

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "seeds".into()));
    let (capsule, pdu) = (dir.join("capsule"), dir.join("pdu"));
    std::fs::create_dir_all(&capsule)?;
    std::fs::create_dir_all(&pdu)?;
    for (name, bytes) in insitu_nvmf::fuzzing::seed_inputs() {
        std::fs::write(capsule.join(name), &bytes)?;
        // Each PDU alone, after the digest byte the pdu target reads first (ICReq never
        // carries digests; the rest use the session's).
        let flags = if name.ends_with("digests") { 3u8 } else { 0 };
        let mut at = 0;
        let mut n = 0;
        while at + 8 <= bytes.len() {
            let ch = CommonHeader::parse(bytes[at..at + 8].try_into().expect("8 bytes"), 1 << 24).expect("seeds are well formed");
            let end = at + ch.plen as usize;
            let mut one = vec![if n == 0 { 0 } else { flags }];
            one.extend_from_slice(&bytes[at..end]);
            std::fs::write(pdu.join(format!("{name}-{n:02}")), one)?;
            (at, n) = (end, n + 1);
        }
    }
    Ok(())
}
