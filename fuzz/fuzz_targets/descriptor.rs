// SPDX-License-Identifier: Apache-2.0
//! Compute descriptors from anywhere: decoding never panics, and what decodes re-encodes
//! to a descriptor that decodes the same; extent checks against any namespace size never
//! panic either.
#![no_main]

use insitu_proto::{Descriptor, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(d) = Descriptor::decode(data, &limits) {
        let again = Descriptor::decode(&d.encode(), &limits).expect("a decoded descriptor re-encodes to a valid one");
        assert_eq!(again, d);
        let mut ns = [0u8; 8];
        let n = data.len().min(8);
        ns[..n].copy_from_slice(&data[data.len() - n..]);
        let _ = d.check_extents(u64::from_le_bytes(ns));
        let _ = d.check_extents(u64::MAX);
    }
});
