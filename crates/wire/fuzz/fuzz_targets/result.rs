// SPDX-License-Identifier: Apache-2.0
//! Fuzzes `ExecResult::decode`: it must never panic, and whatever it accepts must be the
//! canonical encoding of what it returns.
#![no_main]

use insitu_wire::ExecResult;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ExecResult::decode(data) {
        assert_eq!(r.encode(), data, "decode accepted a non-canonical encoding");
    }
});
