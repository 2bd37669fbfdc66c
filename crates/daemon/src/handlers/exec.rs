// SPDX-License-Identifier: Apache-2.0
//! EXEC over the fabric: the descriptor arrives as the command's data; the result goes to
//! the descriptor's result object and its length to dword 0 (dword 1: media bytes read, in
//! KiB, saturating).

use std::sync::Arc;

use insitu_engine::Engine;
use insitu_fabric::Command;
use insitu_nvmf::{IoContext, IoHandler, Outcome};
use insitu_proto::{Status, FLAG_RESULT_OBJECT};

/// EXEC against an engine.
pub(crate) struct Exec(pub(crate) Arc<Engine>);

impl IoHandler for Exec {
    fn execute(&self, _: &IoContext<'_>, cmd: &Command, descriptor: &[u8]) -> Outcome {
        let function = metric_function(&self.0, descriptor);
        // Over the fabric the result must go to an object: the command returns no data.
        if descriptor.len() >= 32 && descriptor[22] & FLAG_RESULT_OBJECT == 0 {
            return Outcome { function, ..Outcome::status(Status::INVALID_FIELD.to_nvme_field()) };
        }
        match self.0.exec(cmd.nsid(), descriptor) {
            Ok(out) => Outcome {
                dw0: out.result.len() as u32,
                dw1: u32::try_from(out.media_read_bytes >> 10).unwrap_or(u32::MAX),
                media_bytes: out.media_read_bytes + out.media_written_bytes,
                function,
                ..Outcome::ok()
            },
            Err(e) => Outcome { function, ..e.into() },
        }
    }
}

/// The `function` label of an EXEC's metrics: its function when the engine has it,
/// `unknown` otherwise (the name comes from the host, which must not grow the metrics).
fn metric_function(engine: &Engine, descriptor: &[u8]) -> String {
    let f = function_name(descriptor);
    if engine.registry().get(&f).is_some() {
        f
    } else {
        "unknown".to_string()
    }
}

/// The function name of a descriptor (empty when malformed): the length byte at offset
/// 16, the name at offset 32, from the alphabet `a-z 0-9 _ -`.
fn function_name(descriptor: &[u8]) -> String {
    let n = descriptor.get(16).map_or(0, |n| usize::from(*n)).min(32);
    match descriptor.get(32..32 + n) {
        Some(name) if name.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-') => {
            String::from_utf8_lossy(name).into_owned()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_functions_are_bounded_by_what_the_engine_has() {
        let e = Engine::new();
        let desc = |f: &str| insitu_proto::Descriptor::new(f, vec![]).encode();
        assert_eq!(metric_function(&e, &desc("crc32c")), "crc32c");
        assert_eq!(metric_function(&e, &desc("made-up-function")), "unknown");
        assert_eq!(metric_function(&e, b"garbage"), "unknown");
    }
}
