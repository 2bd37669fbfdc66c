// SPDX-License-Identifier: Apache-2.0
//! Entry points for coverage-guided fuzzing (cargo feature `fuzzing`; also built for the
//! crate's tests): the parsers of what reaches the Docker API from outside, fed any bytes.
//!
//! * [`request_target`]: a request's path and query (`/v1.47/containers/ID/resize?h=40&w=80`)
//!   and every query parameter read from it (kill's signal, resize's size, stop's timeout,
//!   pull's `fromImage` + `tag`, which becomes an image reference, attach's `detachKeys`).
//! * [`json_body`]: a request body as JSON, then as a `containers/create` request.
//! * [`image_reference`]: `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`.
//! * [`image_documents`]: what a registry or a `docker load` archive sends: manifests,
//!   indexes, image configs, an archive's `manifest.json`.
//! * [`build_inputs`]: a build's query (`POST /build?...`), an `X-Registry-Auth` header,
//!   a Dockerfile's `FROM` lines, and a target's `--registry-mirror`/`--insecure-registry`.
//! * [`dns_message`]: a datagram a container sends the DNS server of its network.
//!
//! Each returns nothing and must not panic on any input; each also asserts what the rest
//! of the target relies on from what it accepts (a signal that reaches runc's command
//! line is letters and digits, a digest that becomes a file name is hex), so that the
//! fuzzer finds a parser that lets through what it should refuse, not just a crash.

use crate::api::containers::{signal_name, timeout, window_size};
use crate::api::create::create_spec;
use crate::api::detach::{keys_of, EscapeMatcher, Scan};
use crate::api::images::pull_reference;
use crate::api::streams::log_filter;
use crate::api::Target;
use crate::image::manifest::{is_sha256, parse_config, parse_manifest, parse_save_manifest, parse_time, Manifest};
use crate::image::Reference;

/// Every parser below on the same bytes (what the `docker` fuzz target runs).
pub fn all(data: &[u8]) {
    dns_message(data);
    request_target(data);
    json_body(data);
    image_reference(data);
    image_documents(data);
    build_inputs(data);
}

/// A datagram to a network's DNS server, answered from two containers' names: an answer
/// carries the query's id, is a response that parses back, and never answers a response
/// (two servers would answer each other for ever).
pub fn dns_message(data: &[u8]) {
    use crate::runtime::dns::{respond, Reply, View};
    use hickory_proto::op::{Message, MessageType};
    let names = View::sample();
    for forward in [true, false] {
        match respond(data, &names, forward) {
            Reply::Answer(bytes) => {
                let m = Message::from_vec(&bytes).expect("an answer parses back");
                assert_eq!(m.metadata.message_type, MessageType::Response);
                assert_eq!(bytes[..2], data[..2], "the answer's id is not the query's");
                assert!(data[2] & 0x80 == 0, "a response was answered");
                assert!(m.answers.len() <= 16);
            }
            Reply::Forward => assert!(forward, "forwarded where forwarding is off"),
            Reply::Ignore => {}
        }
    }
}

/// A request target: `PATH[?QUERY]` as text, and as hyper parses a request line's URI.
pub fn request_target(data: &[u8]) {
    if let Ok(uri) = hyper::Uri::try_from(data) {
        query_readers(&Target::parse(&uri));
    }
    let text = String::from_utf8_lossy(data);
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (&*text, None),
    };
    query_readers(&Target::from_parts(path, query));
}

fn query_readers(t: &Target) {
    for k in ["all", "force", "stream", "stdin", "stdout", "stderr", "follow", "logs"] {
        let _ = t.flag(k);
    }
    let _ = log_filter(t);
    let _ = timeout(t);
    let _ = window_size(t);
    if let Ok(sig) = signal_name(t) {
        let bare = sig.strip_prefix("SIG").unwrap_or(sig);
        assert!(!bare.is_empty() && bare.bytes().all(|b| b.is_ascii_alphanumeric()), "signal {sig:?} would reach runc's command line");
    }
    if let Ok(keys) = keys_of(t.get("detachKeys")) {
        // An empty sequence would never detach; a sequence must detach on itself, all swallowed.
        assert!(!keys.is_empty(), "detach keys {:?} gave an empty sequence", t.get("detachKeys"));
        assert_eq!(EscapeMatcher::new(keys.clone()).scan(&keys), Scan::Detach(Vec::new()), "detach keys {keys:?}");
    }
    if let Some(from) = t.get("fromImage") {
        let _ = Reference::parse(&pull_reference(from, t.get("tag"))).map(|r| check_reference(&r));
    }
}

/// A request body: JSON, then a `containers/create` request.
pub fn json_body(data: &[u8]) {
    let Ok(v) = crate::api::json_body(data) else { return };
    if let Ok(spec) = create_spec(&v) {
        assert!(!spec.image.is_empty(), "create accepted without an image");
        assert!(spec.console_size.is_none_or(|(r, c)| r > 0 && c > 0), "a zero console size was kept");
    }
}

/// An image reference, as text.
pub fn image_reference(data: &[u8]) {
    if let Ok(r) = Reference::parse(&String::from_utf8_lossy(data)) {
        check_reference(&r);
    }
}

fn check_reference(r: &Reference) {
    // The repository becomes a path in the registry's URL and the store's index.
    assert!(!r.repository.split('/').any(|p| p.is_empty() || p == "." || p == ".."), "repository {:?}", r.repository);
    assert!(r.digest.as_deref().is_none_or(is_sha256), "digest {:?}", r.digest);
    assert!(r.tag.is_some() || r.digest.is_some(), "neither tag nor digest");
    let _ = r.api_host();
    // What the CLI is shown must read back as a reference.
    if let Err(e) = Reference::parse(&r.familiar()) {
        panic!("{r:?} is shown as {:?}, which does not parse: {e}", r.familiar());
    }
}

/// What a build and the registry settings read from outside: the query of `POST /build`,
/// an `X-Registry-Auth` header, a Dockerfile's base images, registry settings (the text's
/// first line as a mirror, the rest as an insecure registry).
pub fn build_inputs(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(opts) = crate::api::build::options(&Target::from_parts("/build", Some(&text)), Some(&text)) {
        // The Dockerfile is opened inside the unpacked context.
        let p = std::path::Path::new(&opts.dockerfile);
        assert!(!p.is_absolute() && !p.components().any(|c| c == std::path::Component::ParentDir), "dockerfile {:?} leaves the context", opts.dockerfile);
        assert!(opts.tags.iter().all(|t| Reference::parse(t).is_ok()), "tags {:?}", opts.tags);
    }
    if let Ok(v) = hyper::header::HeaderValue::from_bytes(data) {
        let mut h = hyper::HeaderMap::new();
        h.insert("X-Registry-Auth", v);
        let _ = crate::api::distribution::registry_auth(&h);
    }
    let _ = crate::build::base_images(&text);
    let (mirror, insecure) = text.split_once('\n').unwrap_or((&text, ""));
    // A plain-HTTP mirror's host is resolved (to see whether it is insecure): not here.
    if mirror.starts_with("http://") {
        return;
    }
    if let Ok(cfg) = crate::image::RegistryConfig::new(&[mirror.to_string()], &[]) {
        // A mirror becomes a URL prefix: a scheme and a host, nothing after it.
        assert!(cfg.mirrors().iter().all(|m| (m.starts_with("http://") || m.starts_with("https://")) && m.ends_with('/')), "{:?}", cfg.mirrors());
    }
    let _ = crate::image::RegistryConfig::new(&[], &[insecure.to_string()]);
}

/// Registry and archive documents: a manifest or index (under each content type a
/// registry may claim), an image config, a `docker save` archive's `manifest.json`.
pub fn image_documents(data: &[u8]) {
    for content_type in ["", "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"] {
        match parse_manifest(data, content_type, "fuzzed manifest") {
            // Digests become file names in the store.
            Ok(Manifest::Index(list)) => assert!(list.iter().all(|d| is_sha256(&d.digest))),
            Ok(Manifest::Image { config, layers }) => assert!(is_sha256(&config.digest) && layers.iter().all(|d| is_sha256(&d.digest))),
            Err(_) => {}
        }
    }
    if let Ok(c) = parse_config(data, "fuzzed config") {
        assert!(c.diff_ids.iter().all(|d| is_sha256(d)));
    }
    let _ = parse_save_manifest(data);
    let _ = parse_time(&String::from_utf8_lossy(data));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Inputs the fuzzer starts from (the committed seeds are these and more).
    const SEEDS: &[&str] = &[
        "/v1.47/containers/3f2a/resize?h=40&w=120",
        "/v1.47/containers/x/kill?signal=SIGTERM",
        "/v1.47/containers/x/attach?stream=1&stdin=1&stdout=1&detachKeys=ctrl-a%2Ca",
        "/v1.47/images/create?fromImage=127.0.0.1%3A5000%2Fbusybox&tag=latest",
        r#"{"Image":"busybox","Cmd":["sh"],"Tty":true,"OpenStdin":true,"HostConfig":{"ConsoleSize":[40,120],"NanoCpus":500000000,"DeviceCgroupRules":["c 42:* rm"]}}"#,
        "127.0.0.1:5000/tools/bb:1.0@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        r#"{"schemaVersion":2,"config":{"digest":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":2},"layers":[]}"#,
        r#"[{"Config":"c.json","RepoTags":["x:1"],"Layers":["l.tar"]}]"#,
    ];

    #[test]
    fn seeds_and_edge_cases_parse_without_panicking() {
        for s in SEEDS {
            all(s.as_bytes());
        }
        for s in ["", "?", "??", "/v/", "/v1./x", "%", "%ff%fe", "a=%", "h=&w=", "\u{0}", "{", "[]", "null", "\"x\"", "@", ":", "/"] {
            all(s.as_bytes());
        }
        all(&[0xff, 0xfe, b'?', 0x80]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_are_refused_not_panicked_on(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            all(&data);
        }

        #[test]
        fn mutated_seeds_are_refused_not_panicked_on(
            seed in 0..SEEDS.len(),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8),
        ) {
            // Byte flips, insertions and deletions of a well-formed input reach further
            // into the parsers than random bytes do.
            let mut b = SEEDS[seed].as_bytes().to_vec();
            for (at, byte, op) in edits {
                let i = at % (b.len() + 1);
                match op {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ if i < b.len() => { b.remove(i); }
                    _ => {}
                }
            }
            all(&b);
        }

        #[test]
        fn random_queries_are_refused_not_panicked_on(q in "[a-zA-Z=&%0-9+:/@._-]{0,60}") {
            request_target(format!("/v1.47/containers/x/resize?{q}").as_bytes());
            request_target(format!("/images/create?fromImage={q}&tag={q}").as_bytes());
        }

        #[test]
        fn random_detach_keys_are_refused_not_panicked_on(k in "(ctrl-|DEL|[a-z@^_,%\\\\\\[\\]-]){0,12}") {
            request_target(format!("/v1.47/containers/x/attach?stdin=1&detachKeys={k}").as_bytes());
        }

        #[test]
        fn random_create_bodies_are_refused_not_panicked_on(
            image in ".{0,20}",
            cmd in prop_oneof![Just("null".to_string()), Just("3".to_string()), "\\[(\"[a-z]{0,3}\",?){0,3}\\]"],
            size in prop_oneof![Just("null".to_string()), "\\[-?[0-9]{0,6}(,-?[0-9]{0,6}){0,2}\\]", "\"[0-9x]{0,5}\""],
            tty in any::<bool>(),
        ) {
            let body = format!(r#"{{"Image":{},"Cmd":{cmd},"Tty":{tty},"HostConfig":{{"ConsoleSize":{size}}}}}"#, serde_json::Value::String(image));
            json_body(body.as_bytes());
        }
    }
}
