// SPDX-License-Identifier: Apache-2.0
//! KV-command requests from anywhere: decoding never panics, and what decodes re-encodes
//! to bytes that decode the same.
#![no_main]

use insitu_proto::attention::{Admin, Append, Attend, AttendOptions, AttendResult};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = Admin::decode(data) {
        assert_eq!(Admin::decode(&a.encode()).expect("re-encodes"), a);
    }
    if let Ok(a) = Append::decode(data) {
        assert_eq!(Append::decode(&a.encode()).expect("re-encodes").encode(), a.encode());
    }
    if let Ok(a) = Attend::decode(data) {
        assert_eq!(Attend::decode(&a.encode()).expect("re-encodes").encode(), a.encode());
    }
    if let Ok(r) = AttendResult::decode(data) {
        assert_eq!(AttendResult::decode(&r.encode()).expect("re-encodes").encode(), r.encode());
    }
    // KV_ATTEND's CDW11 options: what is accepted is exactly what re-encodes.
    if let Some(c) = data.get(..4) {
        let c = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        if let Ok(o) = AttendOptions::from_cdw11(c) {
            assert_eq!(o.cdw11(), c);
        }
    }
});
