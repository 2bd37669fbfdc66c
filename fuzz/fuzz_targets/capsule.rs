// SPDX-License-Identifier: Apache-2.0
//! The target's connection handling, the first code a stranger's bytes reach: the input is
//! everything one connection receives (ICReq, capsules, H2CData, ...), served by the real
//! connection state machine, controllers and a target with real namespace files.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| insitu_daemon::fuzzing::serve_bytes(data));
