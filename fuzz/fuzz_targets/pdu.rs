// SPDX-License-Identifier: Apache-2.0
//! NVMe/TCP PDUs from a peer. The first byte chooses the negotiated digests (bit 0 header,
//! bit 1 data); the rest is one PDU. Parsing never panics; the split path receivers use
//! (`layout`, `decode_head`, the data checked in place) accepts exactly what the whole-PDU
//! decode accepts and yields the same PDU; a PDU that decodes re-encodes to one that decodes
//! the same.
#![no_main]

use insitu_fabric::{check_data_digest, CommonHeader, Digests, Pdu};
use libfuzzer_sys::fuzz_target;

/// What a receiver reading head, data and digest separately makes of the bytes.
fn split(ch: &CommonHeader, rest: &[u8], digests: Digests) -> Option<Pdu> {
    let layout = ch.layout(digests).ok()?;
    if layout.head + layout.data + layout.digest != rest.len() {
        return None;
    }
    let mut pdu = Pdu::decode_head(ch, &rest[..layout.head], &layout).ok()?;
    let data = &rest[layout.head..layout.head + layout.data];
    if layout.digest > 0 {
        check_data_digest(data, &rest[layout.head + layout.data..]).ok()?;
    }
    if let Some(d) = pdu.data_mut() {
        d.extend_from_slice(data);
    }
    Some(pdu)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else { return };
    let digests = Digests { header: flags & 1 != 0, data: flags & 2 != 0 };
    let Some(ch) = bytes.get(..8).and_then(|h| CommonHeader::parse(h.try_into().expect("8 bytes"), 1 << 20).ok()) else { return };
    let Some(rest) = bytes.get(8..ch.plen as usize) else { return };
    let whole = Pdu::decode(&ch, rest, digests).ok();
    assert_eq!(split(&ch, rest, digests), whole, "the split and whole decodes disagree");
    if let Some(pdu) = whole {
        let mut out = Vec::new();
        pdu.encode(digests, 0, &mut out);
        let ch2 = CommonHeader::parse(out[..8].try_into().expect("8 bytes"), 1 << 24).expect("an encoded header parses");
        assert_eq!(Pdu::decode(&ch2, &out[8..], digests).expect("an encoded PDU decodes"), pdu);
        // The head alone, as the senders build it, followed by the data, is the same bytes.
        let mut head = Vec::new();
        let digest = pdu.encode_head(pdu.data().len(), digests, 0, &mut head);
        head.extend_from_slice(pdu.data());
        if digest {
            head.extend_from_slice(&insitu_fabric::data_digest(pdu.data()));
        }
        assert_eq!(head, out);
    }
});
