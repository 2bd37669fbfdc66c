// SPDX-License-Identifier: Apache-2.0
//! `insitu kv put|get|rm|exists|ls URL ...`: a target's key-value namespace (NVMe Key Value
//! command set, `docs/kv-store.md`) through insitu's initiator.
//!
//! URLs are `nvme-tcp://HOST:PORT/NQN[/NSID]`; without NSID the command uses the namespace
//! whose Identify reports the Key Value command set. Keys are 1 to 16 bytes: text as given,
//! or `0x` and hex digits for any bytes. `ls` prints keys that are not plain text (not
//! UTF-8, control characters, or text starting with `0x`) in that hex form, so every line
//! it prints is a key the other commands accept.

use crate::Failure;
use clap::Subcommand;
use insitu_attach::TargetUrl;
use insitu_initiator::{ConnectOptions, InitiatorError, Session, StoreMode};
use serde_json::json;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

/// Longest key the Key Value command set carries.
const MAX_KEY: usize = 16;

/// How long to wait for the connection and each command.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `insitu kv ...`.
#[derive(Subcommand, Debug)]
pub(crate) enum KvCmd {
    /// Store VALUE under KEY (replacing any value); returns once the target made it durable.
    Put {
        /// nvme-tcp://HOST:PORT/NQN[/NSID] (without NSID: the target's KV namespace).
        url: String,
        /// 1 to 16 bytes: text, or 0x and hex digits.
        key: String,
        /// The value as text; `-` reads it from standard input.
        #[arg(conflicts_with = "file", required_unless_present = "file")]
        value: Option<String>,
        /// Read the value from this file.
        #[arg(long, value_name = "F")]
        file: Option<PathBuf>,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// Write KEY's value to standard output as raw bytes (exit 1 if the key is absent).
    Get {
        /// nvme-tcp://HOST:PORT/NQN[/NSID].
        url: String,
        /// 1 to 16 bytes: text, or 0x and hex digits.
        key: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// Delete KEY (exit 1 if it is absent).
    Rm {
        /// nvme-tcp://HOST:PORT/NQN[/NSID].
        url: String,
        /// 1 to 16 bytes: text, or 0x and hex digits.
        key: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// Print yes and exit 0 if KEY exists, no and exit 1 if not.
    Exists {
        /// nvme-tcp://HOST:PORT/NQN[/NSID].
        url: String,
        /// 1 to 16 bytes: text, or 0x and hex digits.
        key: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// List keys in byte order, one a line (0x and hex digits for keys that are not text).
    Ls {
        /// nvme-tcp://HOST:PORT/NQN[/NSID].
        url: String,
        /// Only keys starting with these bytes (text, or 0x and hex digits).
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// The key-value benchmark: the same as `insitu bench kv` (direct stack vs redirection
    /// vs system calls; YCSB A-F, db_bench, a genome job).
    Bench(crate::bench_cmd::KvArgs),
}

/// Runs one `insitu kv` command.
pub(crate) fn dispatch(cmd: KvCmd, json_out: bool) -> Result<i32, Failure> {
    match cmd {
        KvCmd::Bench(a) => crate::bench_cmd::kv(a, json_out),
        KvCmd::Put { url, key, value, file, hostnqn } => {
            let k = parse_key(&key)?;
            let value = match (value, file) {
                (_, Some(f)) => std::fs::read(&f).map_err(|e| format!("--file {}: {e}", f.display()))?,
                (Some(v), None) if v == "-" => {
                    let mut buf = Vec::new();
                    std::io::stdin().read_to_end(&mut buf).map_err(|e| format!("reading the value from standard input: {e}"))?;
                    buf
                }
                (Some(v), None) => v.into_bytes(),
                (None, None) => return Err("give the value: VALUE, `-` for standard input, or --file F".to_string().into()),
            };
            let (u, s, nsid) = open(&url, hostnqn)?;
            s.kv_store(nsid, &k, &value, StoreMode::Upsert).map_err(|e| failure(&u, e))?;
            report(
                json_out,
                json!({"key": show_key(&k), "nsid": nsid, "stored": value.len()}),
                &format!("stored {} bytes under {}", value.len(), show_key(&k)),
            );
            Ok(0)
        }
        KvCmd::Get { url, key, hostnqn } => {
            let k = parse_key(&key)?;
            let (u, s, nsid) = open(&url, hostnqn)?;
            match s.kv_retrieve(nsid, &k) {
                Ok(v) => {
                    if json_out {
                        let text = std::str::from_utf8(&v).ok();
                        println!("{}", json!({"key": show_key(&k), "nsid": nsid, "size": v.len(), "value": text, "value_hex": hex(&v)}));
                    } else {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&v).and_then(|()| out.flush()).map_err(|e| format!("writing the value: {e}"))?;
                    }
                    Ok(0)
                }
                Err(InitiatorError::KeyNotFound { .. }) => Err(absent(&k, &u, nsid)),
                Err(e) => Err(failure(&u, e)),
            }
        }
        KvCmd::Rm { url, key, hostnqn } => {
            let k = parse_key(&key)?;
            let (u, s, nsid) = open(&url, hostnqn)?;
            match s.kv_delete(nsid, &k) {
                Ok(()) => {
                    report(json_out, json!({"key": show_key(&k), "nsid": nsid, "deleted": true}), &format!("deleted {}", show_key(&k)));
                    Ok(0)
                }
                Err(InitiatorError::KeyNotFound { .. }) => Err(absent(&k, &u, nsid)),
                Err(e) => Err(failure(&u, e)),
            }
        }
        KvCmd::Exists { url, key, hostnqn } => {
            let k = parse_key(&key)?;
            let (u, s, nsid) = open(&url, hostnqn)?;
            let found = s.kv_exist(nsid, &k).map_err(|e| failure(&u, e))?;
            report(json_out, json!({"key": show_key(&k), "nsid": nsid, "exists": found}), if found { "yes" } else { "no" });
            Ok(if found { 0 } else { 1 })
        }
        KvCmd::Ls { url, prefix, hostnqn } => {
            let p = match prefix.as_deref() {
                Some(p) if !p.is_empty() => parse_bytes(p, "prefix")?,
                _ => Vec::new(),
            };
            let (u, s, nsid) = open(&url, hostnqn)?;
            let keys = s.kv_list(nsid, &p).map_err(|e| failure(&u, e))?;
            if json_out {
                println!("{}", json!({"nsid": nsid, "keys": keys.iter().map(|k| show_key(k)).collect::<Vec<_>>()}));
            } else {
                let mut out = std::io::stdout().lock();
                for k in &keys {
                    writeln!(out, "{}", show_key(k)).map_err(|e| format!("writing the keys: {e}"))?;
                }
            }
            Ok(0)
        }
    }
}

fn report(json_out: bool, doc: serde_json::Value, text: &str) {
    if json_out {
        println!("{doc}");
    } else {
        println!("{text}");
    }
}

/// Exit code 1 with a message naming the key and where it was looked for.
fn absent(key: &[u8], u: &TargetUrl, nsid: u32) -> Failure {
    Failure { code: 1, message: format!("key {} does not exist in namespace {nsid} of {} at {}", show_key(key), u.nqn, u.address()) }
}

/// A key argument: `0x` and hex digits, or the text's UTF-8 bytes; 1 to 16 bytes.
pub(crate) fn parse_key(arg: &str) -> Result<Vec<u8>, Failure> {
    let k = parse_bytes(arg, "key")?;
    if k.is_empty() {
        return Err("the key is empty: keys are 1 to 16 bytes".to_string().into());
    }
    if k.len() > MAX_KEY {
        return Err(format!(
            "the key {arg:?} has {} bytes: keys are 1 to {MAX_KEY} bytes (the NVMe Key Value command set carries them in the command)",
            k.len()
        )
        .into());
    }
    Ok(k)
}

/// `0x` and an even number of hex digits as bytes; any other text as its UTF-8 bytes.
fn parse_bytes(arg: &str, what: &str) -> Result<Vec<u8>, Failure> {
    let Some(digits) = arg.strip_prefix("0x").or_else(|| arg.strip_prefix("0X")) else {
        return Ok(arg.as_bytes().to_vec());
    };
    if digits.len() % 2 != 0 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "the {what} {arg:?} starts with 0x but is not an even number of hex digits after it; write bytes as 0x6b6579, or text without a leading 0x"
        )
        .into());
    }
    Ok((0..digits.len()).step_by(2).map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap_or_default()).collect())
}

/// A key as `ls` prints it: the text itself when it reads back as the same key, else hex.
pub(crate) fn show_key(k: &[u8]) -> String {
    match std::str::from_utf8(k) {
        Ok(t) if !t.is_empty() && !t.starts_with("0x") && !t.starts_with("0X") && !t.chars().any(char::is_control) => t.to_string(),
        _ => format!("0x{}", hex(k)),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Connects (one I/O queue) and finds the KV namespace: the one whose Identify reports the
/// Key Value command set, which the URL's NSID, if given, must name.
fn open(url: &str, hostnqn: Option<String>) -> Result<(TargetUrl, Session, u32), Failure> {
    let u = TargetUrl::parse(url).map_err(|e| e.to_string())?;
    let mut opts = ConnectOptions::new(u.address(), u.nqn.clone());
    if let Some(h) = hostnqn {
        opts.hostnqn = h;
    }
    opts.kato_ms = 0;
    opts.timeout = TIMEOUT;
    let s = Session::connect(opts).map_err(|e| failure(&u, e))?;
    let found = s.kv_namespace().map_err(|e| failure(&u, e))?.ok_or_else(|| Failure {
        code: 2,
        message: format!(
            "{} at {} serves no key-value namespace; start the target with `insitu target start --private IMG --kv-store SIZE`",
            u.nqn,
            u.address()
        ),
    })?;
    // A block namespace would answer the KV opcodes as Reads and Writes, or refuse them
    // with a bare status: name the right one instead.
    if let Some(n) = u.nsid.filter(|n| *n != found) {
        return Err(Failure {
            code: 2,
            message: format!(
                "namespace {n} of {} at {} is not a key-value namespace; its key-value namespace is {found} (leave /NSID out of the URL to use it)",
                u.nqn,
                u.address()
            ),
        });
    }
    Ok((u, s, found))
}

/// An initiator error as a message; a refused connection says how to start a target.
fn failure(u: &TargetUrl, e: InitiatorError) -> Failure {
    let message = match &e {
        InitiatorError::Connect { addr, source } if source.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "nothing listens on {addr} (connection refused); start a target there with `insitu target start --listen {addr} --namespace PATH --private IMG --kv-store SIZE`"
        ),
        _ => format!("{u}: {e}"),
    };
    Failure { code: 2, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_as_text_or_hex() {
        assert_eq!(parse_key("abc").ok(), Some(b"abc".to_vec()));
        assert_eq!(parse_key("0x00ff").ok(), Some(vec![0, 0xff]));
        assert_eq!(parse_key("0X6B").ok(), Some(b"k".to_vec()));
        assert_eq!(parse_key("0123456789abcdef").map(|k| k.len()).ok(), Some(16));
        let long = parse_key("0123456789abcdefg").err().unwrap();
        assert!(long.message.contains("17 bytes") && long.message.contains("1 to 16"), "{}", long.message);
        assert!(parse_key("").is_err());
        assert!(parse_key("0x").is_err(), "0x alone is an empty key");
        assert!(parse_key("0x123").err().unwrap().message.contains("hex digits"));
        assert!(parse_key("0xzz").is_err());
        assert!(parse_key(&format!("0x{}", "ab".repeat(17))).is_err());
    }

    #[test]
    fn shown_keys_parse_back_to_themselves() {
        for k in [&b"plain"[..], b"0xlooks-hex", b"\xff\x00", b"tab\there", b"caf\xc3\xa9", b"a"] {
            let shown = show_key(k);
            assert_eq!(parse_key(&shown).ok().as_deref(), Some(k), "{shown}");
        }
        assert_eq!(show_key(b"\xff\x00"), "0xff00");
        assert_eq!(show_key(b"plain"), "plain");
    }

    #[test]
    fn refused_connection_says_how_to_start_a_target() {
        let f = open("nvme-tcp://127.0.0.1:1/nqn.2024-01.io.insitu:target", None).err().expect("nothing listens on port 1");
        assert!(f.message.contains("--kv-store"), "{}", f.message);
    }
}
