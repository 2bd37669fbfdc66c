// SPDX-License-Identifier: Apache-2.0
//! Fuzzes `Descriptor::decode`: it must never panic, and whatever it accepts must be the
//! canonical encoding of what it returns. Accepted descriptors also go through
//! `check_extents` against a namespace size taken from the input.
#![no_main]

use insitu_wire::{Descriptor, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Descriptor::decode(data, &Limits::default()) {
        assert_eq!(d.encode(), data, "decode accepted a non-canonical encoding");
        let mut ns = [0u8; 8];
        let n = data.len().min(8);
        ns[..n].copy_from_slice(&data[data.len() - n..]);
        let _ = d.check_extents(u64::from_le_bytes(ns));
        let _ = d.check_extents(u64::MAX);
    }
});
