// SPDX-License-Identifier: Apache-2.0
//! The rules of frame commands, their status codes in words, and interface addresses.

use crate::{EtherError, FrameError, MAX_FRAME, MIN_FRAME, RECEIVE_BUFFER};
use std::net::IpAddr;
use std::str::FromStr;

/// Checks that `frame` is an Ethernet frame this bridge carries: at least [`MIN_FRAME`] and
/// at most [`MAX_FRAME`] bytes (no frame check sequence).
pub fn check_frame(frame: &[u8]) -> Result<(), FrameError> {
    match frame.len() {
        len if len < MIN_FRAME => Err(FrameError::TooShort { len }),
        len if len > MAX_FRAME => Err(FrameError::TooLong { len, max: MAX_FRAME }),
        _ => Ok(()),
    }
}

/// Checks a TRANSMIT_FRAME: `cdw10` must equal the length of `data`, which must be a
/// frame ([`check_frame`]). Returns the frame.
pub fn check_transmit(cdw10: u32, data: &[u8]) -> Result<&[u8], FrameError> {
    if usize::try_from(cdw10).ok() != Some(data.len()) {
        return Err(FrameError::LengthMismatch { declared: cdw10, carried: data.len() });
    }
    check_frame(data)?;
    Ok(data)
}

/// Checks a RECEIVE_FRAME's buffer length (its SGL length): at least [`RECEIVE_BUFFER`].
pub fn check_receive(buffer_len: u32) -> Result<(), FrameError> {
    let len = buffer_len as usize;
    if len < RECEIVE_BUFFER {
        return Err(FrameError::BufferTooSmall { len, min: RECEIVE_BUFFER });
    }
    Ok(())
}

/// What an Ether-oN status field means and what to do, for messages on the host; `None`
/// for a status that is not one of Ether-oN's own.
pub fn status_message(status: u16) -> Option<&'static str> {
    Some(match status & 0x7FF {
        s if s == crate::STATUS_NO_INTERFACE & 0x7FF => "this target has no Ether-oN interface; start it with --ether ADDR/PREFIX",
        s if s == crate::STATUS_BRIDGE_BUSY & 0x7FF => "another host's association owns this target's Ether-oN bridge; stop `insitu ethernet` there first (a bridge is one host at a time)",
        s if s == crate::STATUS_TOO_MANY_RECEIVES & 0x7FF => "the target already holds 64 RECEIVE_FRAME commands of this host; post fewer",
        _ => return None,
    })
}

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
    fn frame_lengths() {
        assert_eq!(check_frame(&[0; 13]), Err(FrameError::TooShort { len: 13 }));
        assert!(check_frame(&[0; 14]).is_ok());
        assert!(check_frame(&[0; 1518]).is_ok());
        assert_eq!(check_frame(&[0; 1519]), Err(FrameError::TooLong { len: 1519, max: 1518 }));
        assert!(check_frame(&[]).is_err());
    }

    #[test]
    fn transmit_length_must_match_the_data() {
        assert_eq!(check_transmit(60, &[1; 60]).unwrap().len(), 60);
        assert_eq!(check_transmit(61, &[1; 60]), Err(FrameError::LengthMismatch { declared: 61, carried: 60 }));
        assert_eq!(check_transmit(0, &[]), Err(FrameError::TooShort { len: 0 }));
        assert_eq!(check_transmit(9000, &[0; 9000]).unwrap_err().status(), crate::STATUS_INVALID_FIELD);
    }

    #[test]
    fn receive_buffers() {
        assert!(check_receive(2048).is_ok());
        assert!(check_receive(4096).is_ok());
        let e = check_receive(1518).unwrap_err();
        assert_eq!(e.status(), crate::STATUS_SGL_LENGTH_INVALID);
        assert!(e.to_string().contains("at least 2048"));
    }

    #[test]
    fn status_messages_say_what_to_do() {
        assert!(status_message(crate::STATUS_NO_INTERFACE).unwrap().contains("--ether ADDR/PREFIX"));
        assert!(status_message(crate::STATUS_BRIDGE_BUSY).is_some());
        assert!(status_message(crate::STATUS_TOO_MANY_RECEIVES).is_some());
        assert!(status_message(crate::STATUS_INVALID_FIELD).is_none());
        assert!(status_message(0).is_none());
    }

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
        /// Any CDW10 and any data: accepted exactly when the lengths agree and are in range,
        /// and never a panic.
        #[test]
        fn transmit_rules(cdw10 in any::<u32>(), len in 0usize..3000, fill in any::<u8>()) {
            let data = vec![fill; len];
            let ok = cdw10 as usize == len && (MIN_FRAME..=MAX_FRAME).contains(&len);
            let r = check_transmit(cdw10, &data);
            prop_assert_eq!(r.is_ok(), ok);
            if let Err(e) = r {
                prop_assert_eq!(e.status(), crate::STATUS_INVALID_FIELD);
            }
        }

        #[test]
        fn receive_rules(len in any::<u32>()) {
            prop_assert_eq!(check_receive(len).is_ok(), len as usize >= RECEIVE_BUFFER);
        }

        #[test]
        fn any_text_parses_or_explains(s in "\\PC{0,40}") {
            if let Err(e) = s.parse::<Cidr>() {
                prop_assert!(e.to_string().contains("ADDR/PREFIX"));
            }
        }
    }
}
