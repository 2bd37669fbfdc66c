// SPDX-License-Identifier: Apache-2.0
//! `nvme-tcp://HOST:PORT/NQN[/NSID]` URLs.

use std::fmt;

/// A parsed target URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetUrl {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Subsystem NQN.
    pub nqn: String,
    /// Namespace ID, when given.
    pub nsid: Option<u32>,
}

/// Why a URL is not a target URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url:?} is not a target URL ({why}); expected nvme-tcp://HOST:PORT/NQN[/NSID], e.g. nvme-tcp://127.0.0.1:4420/nqn.2024-01.io.insitu:target/1")]
pub struct UrlError {
    /// The text given.
    pub url: String,
    /// What is wrong.
    pub why: String,
}

impl TargetUrl {
    /// Parses a URL; the port defaults to 4420.
    pub fn parse(s: &str) -> Result<TargetUrl, UrlError> {
        let err = |why: &str| UrlError { url: s.chars().take(300).collect(), why: why.into() };
        let rest = s.strip_prefix("nvme-tcp://").ok_or_else(|| err("it must start with nvme-tcp://"))?;
        let (authority, path) = rest.split_once('/').ok_or_else(|| err("no subsystem NQN after the address"))?;
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| err("unclosed [ in the address"))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || "-._:".contains(c)) {
            return Err(err("bad host"));
        }
        let port = match port {
            None => 4420,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| err("bad port"))?,
        };
        let (nqn, nsid) = match path.rsplit_once('/') {
            Some((n, id)) => (n, Some(id.parse::<u32>().ok().filter(|i| *i != 0 && *i != u32::MAX).ok_or_else(|| err("bad namespace ID"))?)),
            None => (path, None),
        };
        if !nqn.starts_with("nqn.") || nqn.len() > 223 || nqn.contains('/') || nqn.chars().any(|c| c.is_control() || c == ' ') {
            return Err(err("bad subsystem NQN"));
        }
        Ok(TargetUrl { host: host.into(), port, nqn: nqn.into(), nsid })
    }

    /// `host:port`, bracketed for IPv6, for connecting.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for TargetUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvme-tcp://{}/{}", self.address(), self.nqn)?;
        if let Some(n) = self.nsid {
            write!(f, "/{n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let u = TargetUrl::parse("nvme-tcp://127.0.0.1:4421/nqn.2024-01.io.insitu:a/2").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nqn.as_str(), u.nsid), ("127.0.0.1", 4421, "nqn.2024-01.io.insitu:a", Some(2)));
        let v6 = TargetUrl::parse("nvme-tcp://[::1]/nqn.x:y").unwrap();
        assert_eq!((v6.host.as_str(), v6.port, v6.nsid), ("::1", 4420, None));
        assert_eq!(v6.address(), "[::1]:4420");
        for bad in [
            "http://x/nqn.a",
            "nvme-tcp://h:0/nqn.a",
            "nvme-tcp://h:99999/nqn.a",
            "nvme-tcp://h/notnqn",
            "nvme-tcp://h/nqn.a/0",
            "nvme-tcp://h",
            "nvme-tcp:///nqn.a",
            "nvme-tcp://[::1/nqn.a",
        ] {
            assert!(TargetUrl::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn display_parses_back(host in "[a-z][a-z0-9.-]{0,20}", port in 1u16.., nqn in "nqn\\.[a-z0-9.:-]{1,40}", nsid in proptest::option::of(1u32..1000)) {
            let u = TargetUrl { host, port, nqn, nsid };
            prop_assert_eq!(TargetUrl::parse(&u.to_string()).unwrap(), u);
        }

        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,80}") {
            let _ = TargetUrl::parse(&s);
            let _ = TargetUrl::parse(&format!("nvme-tcp://{s}"));
        }
    }
}
