// SPDX-License-Identifier: Apache-2.0
//! Ether-oN's commands: Ethernet frames carried in vendor commands (DockerSSD's Ethernet
//! over NVMe). [`TRANSMIT_FRAME`] carries one frame host→target (CDW10 holds its length);
//! [`RECEIVE_FRAME`] offers a buffer the target completes with one frame for the host. The
//! rules of both, their status codes and what those mean (`docs/etheron.md`).

pub use crate::opcode::{RECEIVE_FRAME, TRANSMIT_FRAME};

/// The shortest frame accepted: an Ethernet header (destination, source, EtherType).
pub const MIN_FRAME: usize = 14;

/// The longest frame accepted: 1500 bytes of payload, the 14-byte header and a 4-byte
/// 802.1Q tag (the frame check sequence is never carried).
pub const MAX_FRAME: usize = 1518;

/// The smallest buffer a RECEIVE_FRAME may offer.
pub const RECEIVE_BUFFER: usize = 2048;

/// NVMe status field (DNR, SCT 7, SC 0xD0): the target has no Ether-oN interface.
pub const STATUS_NO_INTERFACE: u16 = status(7, 0xD0);

/// NVMe status field (DNR, SCT 7, SC 0xD1): another host's association owns the bridge.
pub const STATUS_BRIDGE_BUSY: u16 = status(7, 0xD1);

/// NVMe status field (DNR, SCT 7, SC 0xD2): the target holds as many receives as it allows (Ether-oN's `MAX_HELD_RECEIVES`).
pub const STATUS_TOO_MANY_RECEIVES: u16 = status(7, 0xD2);

/// NVMe status field (DNR, SCT 0, SC 0x02 Invalid Field in Command): a frame length out of
/// range or not the data length.
pub const STATUS_INVALID_FIELD: u16 = status(0, 0x02);

/// NVMe status field (DNR, SCT 0, SC 0x0F Data SGL Length Invalid): a receive buffer
/// shorter than [`RECEIVE_BUFFER`].
pub const STATUS_SGL_LENGTH_INVALID: u16 = status(0, 0x0F);

/// NVMe status field (DNR, SCT 0, SC 0x06 Internal Error): the TAP device refused a frame.
pub const STATUS_INTERNAL_ERROR: u16 = status(0, 0x06);

/// A completion status field with Do Not Retry set.
const fn status(sct: u8, sc: u8) -> u16 {
    (1 << 14) | ((sct as u16 & 7) << 8) | sc as u16
}

/// Why a frame command is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame is shorter than an Ethernet header.
    #[error("an Ethernet frame of {len} bytes is shorter than its 14-byte header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The frame is longer than the largest Ethernet frame.
    #[error("an Ethernet frame of {len} bytes exceeds {max} bytes (MTU 1500 with an 802.1Q tag); lower the interface MTU")]
    TooLong {
        /// Its length.
        len: usize,
        /// The longest accepted.
        max: usize,
    },
    /// TRANSMIT_FRAME's CDW10 does not match the data it carries.
    #[error("TRANSMIT_FRAME says the frame is {declared} bytes (CDW10) but carries {carried} bytes of data; set CDW10 to the data length")]
    LengthMismatch {
        /// CDW10.
        declared: u32,
        /// The data length.
        carried: usize,
    },
    /// RECEIVE_FRAME offers too small a buffer.
    #[error("RECEIVE_FRAME offers a {len}-byte buffer; offer at least {min} bytes")]
    BufferTooSmall {
        /// The buffer length.
        len: usize,
        /// The smallest accepted.
        min: usize,
    },
}

impl FrameError {
    /// The NVMe status field a target completes the command with.
    pub fn status(&self) -> u16 {
        match self {
            FrameError::BufferTooSmall { .. } => STATUS_SGL_LENGTH_INVALID,
            _ => STATUS_INVALID_FIELD,
        }
    }
}

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
        s if s == STATUS_NO_INTERFACE & 0x7FF => "this target has no Ether-oN interface; start it with --ether ADDR/PREFIX",
        s if s == STATUS_BRIDGE_BUSY & 0x7FF => {
            "another host's association owns this target's Ether-oN bridge; stop `insitu ethernet` there first (a bridge is one host at a time)"
        }
        s if s == STATUS_TOO_MANY_RECEIVES & 0x7FF => "the target already holds 64 RECEIVE_FRAME commands of this host; post fewer",
        _ => return None,
    })
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
        assert_eq!(check_transmit(9000, &[0; 9000]).unwrap_err().status(), STATUS_INVALID_FIELD);
    }

    #[test]
    fn receive_buffers() {
        assert!(check_receive(2048).is_ok());
        assert!(check_receive(4096).is_ok());
        let e = check_receive(1518).unwrap_err();
        assert_eq!(e.status(), STATUS_SGL_LENGTH_INVALID);
        assert!(e.to_string().contains("at least 2048"));
    }

    #[test]
    fn status_messages_say_what_to_do() {
        assert!(status_message(STATUS_NO_INTERFACE).unwrap().contains("--ether ADDR/PREFIX"));
        assert!(status_message(STATUS_BRIDGE_BUSY).is_some());
        assert!(status_message(STATUS_TOO_MANY_RECEIVES).is_some());
        assert!(status_message(STATUS_INVALID_FIELD).is_none());
        assert!(status_message(0).is_none());
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
                prop_assert_eq!(e.status(), STATUS_INVALID_FIELD);
            }
        }

        #[test]
        fn receive_rules(len in any::<u32>()) {
            prop_assert_eq!(check_receive(len).is_ok(), len as usize >= RECEIVE_BUFFER);
        }

    }
}
