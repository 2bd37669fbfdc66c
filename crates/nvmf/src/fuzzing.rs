// SPDX-License-Identifier: Apache-2.0
//! Entry points for coverage-guided fuzzing (cargo feature `fuzzing`): the bytes a stranger
//! sends on a connection, fed to the real connection state machine and controllers of a
//! bound [`Server`] (never served), without a socket. The assembled target's harness, with
//! its seeds, is `insitu_daemon::fuzzing`.

use crate::connection::{serve_on, Transport};
use crate::Server;
use std::io::{Cursor, Read};
use std::time::Duration;

/// Creates an enabled controller of `nqn` for host `hostnqn` / `hostid`, so that an input
/// may connect an I/O queue to it without first building a whole association; returns its
/// controller ID (`None`: no such NVM subsystem, or no IDs left).
pub fn ready_controller(server: &Server, nqn: &str, hostnqn: &str, hostid: [u8; 16]) -> Option<u16> {
    let subsys = server.shared.subsystem(nqn)?;
    subsys.nvm()?;
    let ctrl = subsys.add_controller(hostnqn, hostid, 0)?;
    ctrl.property_set(0x14, 1); // CC.EN: ready for I/O queues
    Some(ctrl.cntlid)
}

/// Serves `input` as everything one connection receives, then the end of the stream;
/// what the target sends is discarded. Returns once the connection has ended.
pub fn serve_bytes(server: &Server, input: &[u8]) {
    serve_on(server.shared.clone(), Box::new(Bytes(Cursor::new(input.to_vec()))), Box::new(std::io::sink()), "fuzz".into());
}

/// Bytes in memory as a connection's receiving side.
struct Bytes(Cursor<Vec<u8>>);

impl Read for Bytes {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Transport for Bytes {
    fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }

    fn shutdown(&self) {}
}
