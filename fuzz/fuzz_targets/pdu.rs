// SPDX-License-Identifier: Apache-2.0
//! NVMe/TCP PDUs from a peer. The first byte chooses the negotiated digests (bit 0 header,
//! bit 1 data); the rest is one PDU. Parsing never panics; a PDU that decodes re-encodes to
//! one that decodes the same.
#![no_main]

use insitu_fabric::{CommonHeader, Digests, Pdu};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else { return };
    let digests = Digests { header: flags & 1 != 0, data: flags & 2 != 0 };
    let Some(ch) = bytes.get(..8).and_then(|h| CommonHeader::parse(h.try_into().expect("8 bytes"), 1 << 20).ok()) else { return };
    let Some(rest) = bytes.get(8..ch.plen as usize) else { return };
    if let Ok(pdu) = Pdu::decode(&ch, rest, digests) {
        let mut out = Vec::new();
        pdu.encode(digests, 0, &mut out);
        let ch2 = CommonHeader::parse(out[..8].try_into().expect("8 bytes"), 1 << 24).expect("an encoded header parses");
        assert_eq!(Pdu::decode(&ch2, &out[8..], digests).expect("an encoded PDU decodes"), pdu);
    }
});
