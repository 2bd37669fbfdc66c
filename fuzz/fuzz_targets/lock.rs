// SPDX-License-Identifier: Apache-2.0
//! LOCK payloads (`docs/lock-commands.md`) from anywhere: parsing never panics, and what
//! parses re-encodes to bytes that parse the same.
#![no_main]

use insitu_proto::lock::LockRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = LockRequest::parse(data) {
        assert!(r.extents.iter().all(|&(o, l)| l > 0 && o % 512 == 0 && l % 512 == 0 && o.checked_add(l).is_some()));
        assert_eq!(LockRequest::parse(&r.encode()).expect("re-encodes"), r);
    }
});
