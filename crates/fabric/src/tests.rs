// SPDX-License-Identifier: Apache-2.0
use super::*;
use proptest::prelude::*;

fn roundtrip(pdu: &Pdu, d: Digests, pda: u8) -> Vec<u8> {
    let mut bytes = Vec::new();
    pdu.encode(d, pda, &mut bytes);
    let ch = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 24).unwrap();
    assert_eq!(ch.plen as usize, bytes.len());
    assert_eq!(&Pdu::decode(&ch, &bytes[8..], d).unwrap(), pdu);
    bytes
}

fn samples() -> Vec<Pdu> {
    let mut sqe = Command::zeroed();
    sqe.set_opcode(opcode::WRITE).set_cid(9).set_nsid(1).set_cdw(10, 5).set_sgl(0, 4096, SGL_DATA_BLOCK_OFFSET);
    vec![
        Pdu::IcReq { pfv: 0, hpda: 0, digests: Digests { header: true, data: false }, maxr2t: 0 },
        Pdu::IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 131072 },
        Pdu::CapsuleCmd { sqe, data: vec![0xAB; 4096] },
        Pdu::CapsuleCmd { sqe, data: vec![] },
        Pdu::CapsuleResp { cqe: Completion { dw0: 1, dw1: 2, sqhd: 3, sqid: 1, cid: 9, status: 0x4002 } },
        Pdu::H2CData { cccid: 9, ttag: 1, datao: 8192, last: true, data: vec![1, 2, 3] },
        Pdu::C2HData { cccid: 9, datao: 0, last: true, success: false, data: vec![7; 1000] },
        Pdu::R2T { cccid: 9, ttag: 1, r2to: 0, r2tl: 65536 },
        Pdu::TermReq { from_host: false, fes: 1, fei: 2, data: vec![0; 24] },
    ]
}

#[test]
fn every_pdu_roundtrips_with_and_without_digests_and_alignment() {
    for pdu in samples() {
        for (h, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            for pda in [0, 3] {
                roundtrip(&pdu, Digests { header: h, data: dd }, pda);
            }
        }
    }
}

#[test]
fn digests_catch_corruption() {
    let d = Digests { header: true, data: true };
    let pdu = Pdu::C2HData { cccid: 1, datao: 0, last: true, success: true, data: vec![5; 64] };
    let mut bytes = roundtrip(&pdu, d, 0);
    let n = bytes.len();
    bytes[n - 10] ^= 1;
    let ch = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 20).unwrap();
    assert_eq!(Pdu::decode(&ch, &bytes[8..], d), Err(PduError::DataDigest));
    bytes[n - 10] ^= 1;
    bytes[12] ^= 1;
    assert_eq!(Pdu::decode(&ch, &bytes[8..], d), Err(PduError::HeaderDigest));
}

#[test]
fn headers_are_checked() {
    assert_eq!(CommonHeader::parse(&[0x08, 0, 24, 0, 24, 0, 0, 0], 1 << 20), Err(PduError::UnknownType(8)));
    assert!(matches!(CommonHeader::parse(&[0x04, 0, 24, 0, 72, 0, 0, 0], 1 << 20), Err(PduError::BadHeaderLength { .. })));
    assert!(matches!(CommonHeader::parse(&[0x04, 0, 72, 0, 10, 0, 0, 0], 1 << 20), Err(PduError::BadLength { .. })));
    assert!(matches!(CommonHeader::parse(&[0x04, 0, 72, 0, 0, 0, 0, 1], 1 << 20), Err(PduError::BadLength { .. })));
    // Digest flags that were not negotiated.
    let mut bytes = Vec::new();
    Pdu::R2T { cccid: 1, ttag: 1, r2to: 0, r2tl: 1 }.encode(Digests { header: true, data: false }, 0, &mut bytes);
    let ch = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 20).unwrap();
    assert!(matches!(Pdu::decode(&ch, &bytes[8..], Digests::default()), Err(PduError::DigestFlags { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Arbitrary bytes never panic the decoder; what decodes re-encodes to a PDU that
    /// decodes to the same value.
    #[test]
    fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 8..400), h in any::<bool>(), dd in any::<bool>()) {
        let d = Digests { header: h, data: dd };
        if let Ok(ch) = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 20) {
            let plen = ch.plen as usize;
            if plen <= bytes.len() {
                if let Ok(pdu) = Pdu::decode(&ch, &bytes[8..plen], d) {
                    let mut again = Vec::new();
                    pdu.encode(d, 0, &mut again);
                    let ch2 = CommonHeader::parse(again[..8].try_into().unwrap(), 1 << 20).unwrap();
                    prop_assert_eq!(Pdu::decode(&ch2, &again[8..], d).unwrap(), pdu);
                }
            }
        }
    }

    /// Mutating one byte of a valid PDU never panics.
    #[test]
    fn mutated_pdus_never_panic(which in 0usize..9, pos in any::<prop::sample::Index>(), byte in any::<u8>(), h in any::<bool>(), dd in any::<bool>()) {
        let d = Digests { header: h, data: dd };
        let mut bytes = Vec::new();
        samples()[which].encode(d, 0, &mut bytes);
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        if let Ok(ch) = CommonHeader::parse(bytes[..8].try_into().unwrap(), 1 << 20) {
            if (ch.plen as usize) <= bytes.len() {
                let _ = Pdu::decode(&ch, &bytes[8..ch.plen as usize], d);
            }
        }
    }
}
