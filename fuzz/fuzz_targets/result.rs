// SPDX-License-Identifier: Apache-2.0
//! Result records from a target: decoding never panics, and what decodes re-encodes to
//! records that decode the same.
#![no_main]

use insitu_proto::ExecResult;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ExecResult::decode(data) {
        let again = ExecResult::decode(&r.encode()).expect("decoded records re-encode to valid ones");
        assert_eq!(again, r);
    }
});
