// SPDX-License-Identifier: Apache-2.0
//! accelfs images from anywhere: open() and fsck never panic or hang, agree on what is
//! clean, and an image that opens stays clean through writes, a sync and a reopen. Byte 0
//! picks raw bytes or a patched valid image, with or without recomputed checksums
//! (`insitu_accelfs::fuzzing::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    insitu_accelfs::fuzzing::run(data);
});
