// SPDX-License-Identifier: Apache-2.0
//! The rules of frame commands, their status codes in words, and interface addresses.

use crate::EtherError;
use std::net::IpAddr;
use std::str::FromStr;

/// An interface address with its prefix length, `ADDR/PREFIX` (IPv4 or IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length: 0–32 for IPv4, 0–128 for IPv6.
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = EtherError;

    fn from_str(s: &str) -> Result<Cidr, EtherError> {
        let bad = |why: &str| EtherError::BadAddress { text: s.chars().take(100).collect(), why: why.into() };
        let (a, p) = s.split_once('/').ok_or_else(|| bad("no /PREFIX"))?;
        let addr: IpAddr = a.parse().map_err(|_| bad("not an IPv4 or IPv6 address"))?;
        let prefix: u8 = p.parse().map_err(|_| bad("the prefix is not a number"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad(&format!("the prefix exceeds {max}")));
        }
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(bad("an interface needs a unicast address"));
        }
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses() {
        let c: Cidr = "10.77.0.2/24".parse().unwrap();
        assert_eq!(c.to_string(), "10.77.0.2/24");
        let c: Cidr = "fd00::2/64".parse().unwrap();
        assert_eq!(c.prefix, 64);
        for bad in ["10.77.0.2", "10.77.0.2/33", "x/24", "10.77.0.2/", "0.0.0.0/8", "224.0.0.1/4", "fd00::1/129", ""] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.to_string().contains("ADDR/PREFIX"), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn any_text_parses_or_explains(s in "\\PC{0,40}") {
            if let Err(e) = s.parse::<Cidr>() {
                prop_assert!(e.to_string().contains("ADDR/PREFIX"));
            }
        }
    }
}
