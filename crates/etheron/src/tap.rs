// SPDX-License-Identifier: Apache-2.0
//! A TAP device: a virtual Ethernet interface whose frames a process reads and writes.

use crate::{check_frame, Cidr, EtherError};
use std::fs::File;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

/// `TUNSETIFF`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54CA;
/// `IFF_TAP`: Ethernet frames (not IP packets).
const IFF_TAP: libc::c_short = 0x0002;
/// `IFF_NO_PI`: no packet-information header before each frame.
const IFF_NO_PI: libc::c_short = 0x1000;
/// `IFNAMSIZ`, the terminating NUL included.
const IFNAMSIZ: usize = 16;

/// A TAP device (`IFF_TAP | IFF_NO_PI`) with an address, up. Each read returns one whole
/// frame the kernel sends out of the interface; each write injects one frame as received
/// by it. The device exists while this value lives (it is not persistent): dropping it
/// removes the interface and its address.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// The device name insitu gives the interface for `addr`: `isn-` and eight hex digits
    /// of the address (IPv4: the address itself; IPv6: its low 32 bits), so a host and a
    /// target with different addresses never clash in one network namespace.
    pub fn name_for(addr: IpAddr) -> String {
        let v = match addr {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(a) => (u128::from(a) & 0xFFFF_FFFF) as u32,
        };
        format!("isn-{v:08x}")
    }

    /// Creates the device `name` (default [`Tap::name_for`] the address), assigns `cidr`
    /// and sets it up, with `ip` from iproute2. Needs CAP_NET_ADMIN.
    pub fn create(cidr: &Cidr, name: Option<&str>) -> Result<Tap, EtherError> {
        let name = name.map_or_else(|| Tap::name_for(cidr.addr), str::to_string);
        let tap = Tap::open(&name)?;
        tap.ip(&["addr", "add", &cidr.to_string(), "dev", &name])?;
        tap.ip(&["link", "set", "dev", &name, "up"])?;
        Ok(tap)
    }

    /// Creates the device `name` with no address, down.
    pub fn open(name: &str) -> Result<Tap, EtherError> {
        let err = |source: std::io::Error| EtherError::Tap { name: name.to_string(), source };
        if name.is_empty() || name.len() >= IFNAMSIZ || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
            return Err(err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "an interface name is 1-15 characters of A-Z a-z 0-9 - _ .")));
        }
        let file = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").map_err(err)?;
        // struct ifreq: the name (IFNAMSIZ bytes), then a union whose first member here is
        // ifr_flags (a short); 40 bytes in all on Linux.
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        ifr[IFNAMSIZ..IFNAMSIZ + 2].copy_from_slice(&(IFF_TAP | IFF_NO_PI).to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq; `ifr` is a live, writable
        // 40-byte buffer laid out as one, and `file` is an open /dev/net/tun descriptor.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, ifr.as_mut_ptr()) };
        if rc < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(Tap { file, name: name.to_string() })
    }

    fn ip(&self, args: &[&str]) -> Result<(), EtherError> {
        let fail = |detail: String| EtherError::Configure { name: self.name.clone(), args: args.join(" "), detail };
        let out = Command::new("ip").args(args).output().map_err(|e| fail(e.to_string()))?;
        if !out.status.success() {
            return Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        Ok(())
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits up to `timeout` for a frame to read; true when one is ready.
    pub fn wait_readable(&self, timeout: Duration) -> Result<bool, EtherError> {
        let mut p = libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: poll on one live pollfd owned by this frame.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(self.io(e));
        }
        Ok(rc > 0 && p.revents & libc::POLLIN != 0)
    }

    /// Reads one frame into `buf` (give at least 2048 bytes: a longer frame is cut short
    /// by the kernel) and returns its length. Blocks until a frame is there.
    pub fn read_frame(&self, buf: &mut [u8]) -> Result<usize, EtherError> {
        loop {
            match (&self.file).read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    /// Writes one frame (checked with [`check_frame`]) into the interface.
    pub fn write_frame(&self, frame: &[u8]) -> Result<(), EtherError> {
        check_frame(frame)?;
        let n = (&self.file).write(frame).map_err(|e| self.io(e))?;
        if n != frame.len() {
            return Err(self.io(std::io::Error::new(std::io::ErrorKind::WriteZero, format!("wrote {n} of {} bytes of a frame", frame.len()))));
        }
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> EtherError {
        EtherError::Io { name: self.name.clone(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz_and_follow_the_address() {
        let n = Tap::name_for("10.77.0.2".parse().unwrap());
        assert_eq!(n, "isn-0a4d0002");
        assert!(n.len() < IFNAMSIZ);
        assert_ne!(n, Tap::name_for("10.77.0.1".parse().unwrap()));
        assert_eq!(Tap::name_for("fd00::1:2".parse().unwrap()), "isn-00010002");
    }

    #[test]
    fn bad_names_are_refused_before_any_system_call() {
        for bad in ["", "a-name-longer-than-15", "sp ace", "sl/ash"] {
            let e = Tap::open(bad).unwrap_err();
            assert!(e.to_string().contains("1-15 characters"), "{bad}: {e}");
        }
    }
}
