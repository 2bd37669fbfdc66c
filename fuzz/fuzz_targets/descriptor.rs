// SPDX-License-Identifier: Apache-2.0
//! Compute descriptors from anywhere: decoding never panics, and what decodes re-encodes
//! to a descriptor that decodes the same.
#![no_main]

use insitu_wire::{Descriptor, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(d) = Descriptor::decode(data, &limits) {
        let again = Descriptor::decode(&d.encode(), &limits).expect("a decoded descriptor re-encodes to a valid one");
        assert_eq!(again, d);
    }
});
