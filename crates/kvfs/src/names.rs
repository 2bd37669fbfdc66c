// SPDX-License-Identifier: Apache-2.0
//! File names for keys, and keys for file names.
//!
//! A key is its own file name when it reads as plain text: valid UTF-8, no `/`, no control
//! characters (NUL included), not `.` or `..`, and not starting with `0x`/`0X`. Any other
//! key is named `0x` and its bytes in lowercase hex. This is the rule `insitu kv ls` prints
//! keys by, so a name seen in `/kv` is what the host lists, and `insitu kv get URL NAME`
//! takes it as is.
//!
//! Going back, a name starting with `0x` or `0X` is hex (either case); any other name is its
//! own bytes. So `0x61` also names the key `a` (whose listed name is `a`): there is no
//! other way to read a name starting with `0x`, and refusing it would only surprise.

use insitu_proto::kv::{Key, MAX_KEY_LEN};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// Why a file name names no key. [`NameError::errno`] is what the file system answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// `0x` with nothing after it.
    #[error("the name {0:?} has no key bytes: keys are 1 to 16 bytes")]
    Empty(String),
    /// More than 16 key bytes.
    #[error("the name {name:?} is a key of {len} bytes: keys are 1 to 16 bytes (the NVMe Key Value command set carries them in the command)")]
    TooLong {
        /// The name, lossily as text.
        name: String,
        /// Bytes it decodes to.
        len: usize,
    },
    /// `0x` followed by something that is not an even number of hex digits.
    #[error("the name {0:?} starts with 0x but is not an even number of hex digits after it; write binary keys as 0x6b6579, text keys without a leading 0x")]
    BadHex(String),
}

impl NameError {
    /// The errno the file system answers with: ENAMETOOLONG for a key over 16 bytes,
    /// EINVAL for the others.
    pub fn errno(&self) -> libc::c_int {
        match self {
            NameError::TooLong { .. } => libc::ENAMETOOLONG,
            NameError::Empty(_) | NameError::BadHex(_) => libc::EINVAL,
        }
    }
}

/// The file name of `key` (see the module's rule).
pub fn name_of(key: &[u8]) -> OsString {
    match std::str::from_utf8(key) {
        Ok(t) if is_plain(t) => OsString::from(t),
        _ => {
            let mut s = String::with_capacity(2 + key.len() * 2);
            s.push_str("0x");
            for b in key {
                s.push_str(&format!("{b:02x}"));
            }
            OsString::from(s)
        }
    }
}

/// Whether text is a file name that reads back as the same key.
fn is_plain(t: &str) -> bool {
    !t.is_empty() && t != "." && t != ".." && !t.starts_with("0x") && !t.starts_with("0X") && !t.chars().any(|c| c == '/' || c.is_control())
}

/// The key a file name stands for; nothing is looked up.
pub fn key_of(name: &OsStr) -> Result<Key, NameError> {
    let bytes = name.as_bytes();
    let lossy = || name.to_string_lossy().into_owned();
    let key: Vec<u8> = match bytes.strip_prefix(b"0x").or_else(|| bytes.strip_prefix(b"0X")) {
        Some(digits) => {
            if digits.len() % 2 != 0 || !digits.iter().all(u8::is_ascii_hexdigit) {
                return Err(NameError::BadHex(lossy()));
            }
            digits.chunks(2).map(|p| (hex_digit(p[0]) << 4) | hex_digit(p[1])).collect()
        }
        None => bytes.to_vec(),
    };
    if key.is_empty() {
        return Err(NameError::Empty(lossy()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(NameError::TooLong { name: lossy(), len: key.len() });
    }
    Key::new(&key).map_err(|_| NameError::TooLong { name: lossy(), len: key.len() })
}

/// The value of one ASCII hex digit (checked by the caller).
fn hex_digit(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        _ => d - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStringExt;

    /// A name of raw bytes.
    fn os(b: &[u8]) -> OsString {
        OsString::from_vec(b.to_vec())
    }

    #[test]
    fn text_keys_are_their_own_names_others_are_hex() {
        assert_eq!(name_of(b"greeting"), "greeting");
        assert_eq!(name_of(b"user:1 x"), "user:1 x");
        assert_eq!(name_of("cl\u{e9}".as_bytes()), "cl\u{e9}");
        for (key, name) in [
            (&b"a/b"[..], "0x612f62"),
            (b"\0", "0x00"),
            (b"0xab", "0x30786162"),
            (b"0Xab", "0x30586162"),
            (b".", "0x2e"),
            (b"..", "0x2e2e"),
            (b"\xff\xfe", "0xfffe"),
            (b"a\nb", "0x610a62"),
        ] {
            assert_eq!(name_of(key), name, "{key:?}");
        }
    }

    #[test]
    fn names_decode_or_say_why_not() {
        assert_eq!(key_of(OsStr::new("greeting")).unwrap().as_bytes(), b"greeting");
        assert_eq!(key_of(OsStr::new("0x00FF")).unwrap().as_bytes(), b"\0\xff");
        assert_eq!(key_of(OsStr::new("0X61")).unwrap().as_bytes(), b"a", "0x is case-blind");
        assert_eq!(key_of(&os(b"\xff")).unwrap().as_bytes(), b"\xff", "a non-UTF-8 name is its bytes");
        assert_eq!(key_of(OsStr::new("0123456789abcdef")).unwrap().as_bytes().len(), 16);
        let e = key_of(OsStr::new("0123456789abcdefg")).unwrap_err();
        assert_eq!((e.errno(), e.to_string().contains("17 bytes")), (libc::ENAMETOOLONG, true), "{e}");
        assert_eq!(key_of(OsStr::new(&format!("0x{}", "ab".repeat(17)))).unwrap_err().errno(), libc::ENAMETOOLONG);
        assert_eq!(key_of(OsStr::new("0x")).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(key_of(OsStr::new("0xabc")).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(key_of(OsStr::new("0xzz")).unwrap_err().errno(), libc::EINVAL);
    }

    proptest! {
        /// Every key has one name that is a valid file name and decodes to the same key.
        #[test]
        fn every_key_round_trips(key in proptest::collection::vec(any::<u8>(), 1..=16)) {
            let name = name_of(&key);
            let b = name.as_bytes();
            prop_assert!(!b.is_empty() && b.len() <= 255 && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0));
            let back = key_of(&name).unwrap();
            prop_assert_eq!(back.as_bytes(), &key[..]);
        }

        /// Text keys of printable characters keep their text as the name.
        #[test]
        fn printable_text_is_kept(text in "[a-zA-Z0-9_.:@ -]{1,16}") {
            prop_assume!(text != "." && text != ".." && !text.starts_with("0x") && !text.starts_with("0X"));
            prop_assert_eq!(name_of(text.as_bytes()), OsString::from(&text));
        }

        /// Any name either decodes to a key whose name decodes to that key again, or is
        /// refused with ENAMETOOLONG (too many bytes) or EINVAL (bad hex, nothing).
        #[test]
        fn any_name_decodes_or_is_refused(name in proptest::collection::vec(any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0), 1..40)) {
            match key_of(&os(&name)) {
                Ok(k) => prop_assert_eq!(key_of(&name_of(k.as_bytes())).unwrap(), k),
                Err(e) => prop_assert!(matches!(e.errno(), libc::ENAMETOOLONG | libc::EINVAL)),
            }
        }
    }
}
