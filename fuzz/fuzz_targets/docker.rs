// SPDX-License-Identifier: Apache-2.0
//! The Docker API's parsers of outside input, all on each input: a request's path and
//! query (and the parameters read from it), a JSON body as a `containers/create`
//! request, an image reference, and the manifests, configs and archive `manifest.json`
//! a registry or `docker load` sends. None may panic; each also asserts what the target
//! relies on from what it accepts (see `insitu_isp::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    insitu_isp::fuzzing::all(data);
});
