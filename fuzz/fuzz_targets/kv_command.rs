// SPDX-License-Identifier: Apache-2.0
//! Key Value command set commands and List data from anywhere (`proto::kv`): decoding
//! never panics, and a command that decodes re-encodes to dwords that decode the same.
#![no_main]

use insitu_proto::kv::{decode_list, KvCommand};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 65 {
        let _ = decode_list(data);
        return;
    }
    let opcode = data[0];
    let mut cdw = [0u32; 16];
    for (i, c) in data[1..65].chunks_exact(4).enumerate() {
        cdw[i] = u32::from_le_bytes(c.try_into().expect("4 bytes"));
    }
    if let Ok(cmd) = KvCommand::decode(opcode, &cdw) {
        let (op, again) = cmd.encode();
        assert_eq!(KvCommand::decode(op, &again).expect("re-encodes"), cmd);
    }
    let _ = decode_list(&data[65..]);
});
