// SPDX-License-Identifier: Apache-2.0
//! Terminals for `docker run -t`: the pseudo-terminal runc makes for a container, received
//! over its console socket, and the supervision a detached runc needs.
//!
//! runc only hands a terminal's master out when it detaches (`--console-socket` is refused
//! in the foreground, where runc would instead copy between the pty and a terminal of its
//! own that the target does not have). So a TTY container runs as `runc run --detach
//! --console-socket SOCK`: runc init makes the pty inside the container, sends its master
//! as SCM_RIGHTS ancillary data over SOCK, and runc exits once the process runs. The
//! container's process then becomes the target's child because the target is made a child
//! subreaper ([`become_subreaper`]), so its exit code is still the target's to collect
//! ([`wait_exit`]), as with a foreground runc.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixListener;

/// How long runc may take to send the terminal once started.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// The listening end of a console socket; the file is removed on drop.
pub(super) struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    /// Listens on `path` (a stale file there, from a crash, is replaced).
    pub(super) fn bind(path: &Path) -> io::Result<ConsoleSocket> {
        let _ = std::fs::remove_file(path);
        Ok(ConsoleSocket { listener: UnixListener::bind(path)?, path: path.to_path_buf() })
    }

    /// The socket's path, for `--console-socket`.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts runc's connection and receives the terminal's master from it.
    pub(super) async fn receive(&self) -> io::Result<Pty> {
        let got = tokio::time::timeout(RECEIVE_TIMEOUT, async {
            let (conn, _) = self.listener.accept().await?;
            loop {
                conn.readable().await?;
                match conn.try_io(Interest::READABLE, || recv_fd(conn.as_raw_fd())) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => return r,
                }
            }
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "runc sent no terminal on the console socket"))??;
        Pty::new(got)
    }

    /// Runs `runc` (a `run` or `exec` given `--console-socket` this socket and `--pid-file
    /// pid_file`) and collects what it gives: the terminal's master and the process's pid.
    /// runc sends the terminal before it returns; a runc that fails before connecting is
    /// reported at once rather than waited for on the socket. `what` names the command in
    /// its errors. With `Ok`, either may still be missing (the caller stops the process).
    pub(super) async fn launch(
        &self,
        runc: &mut tokio::process::Command,
        pid_file: &Path,
        what: &str,
    ) -> Result<(io::Result<Pty>, Option<i32>), super::RuntimeError> {
        use super::RuntimeError;
        let ran = runc.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).output();
        tokio::pin!(ran);
        let receive = self.receive();
        tokio::pin!(receive);
        let mut pty = None;
        let ran = loop {
            tokio::select! {
                ran = &mut ran => break ran,
                got = &mut receive, if pty.is_none() => pty = Some(got),
            }
        };
        let ran = ran.map_err(|e| RuntimeError::Setup(format!("{what}: {e} (is runc installed?)")))?;
        if !ran.status.success() {
            return Err(RuntimeError::Setup(format!("{what}: {}", String::from_utf8_lossy(&ran.stderr).trim())));
        }
        let pty = match pty {
            Some(p) => p,
            None => receive.await,
        };
        let pid = std::fs::read_to_string(pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()).filter(|&p| p > 0);
        Ok((pty, pid))
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Receives one file descriptor sent as SCM_RIGHTS on the unix socket `sock`.
fn recv_fd(sock: RawFd) -> io::Result<OwnedFd> {
    // runc sends the terminal's name as the ordinary data; it is not needed, only read.
    let mut name = [0u8; 4096];
    let mut iov = libc::iovec { iov_base: name.as_mut_ptr().cast(), iov_len: name.len() };
    // Room for a few descriptors, so that a sender passing more than one is noticed
    // (and the extras closed) rather than truncated.
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((4 * std::mem::size_of::<RawFd>()) as u32) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * 8;
    // SAFETY: msg points at iov and control, both live and of the lengths given.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* walk stays within msg_controllen bytes of control, as filled by
    // the kernel; each SCM_RIGHTS payload is an array of descriptors now owned by us.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the console socket's message was truncated"));
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(fd), None) => Ok(fd),
        (None, _) if n == 0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "runc closed the console socket without sending a terminal")),
        (None, _) => Err(io::Error::new(io::ErrorKind::InvalidData, "the console socket's message carried no file descriptor")),
        (Some(_), Some(_)) => Err(io::Error::new(io::ErrorKind::InvalidData, "the console socket's message carried more than one file descriptor")),
    }
}

/// The master side of a container's pseudo-terminal.
pub(super) struct Pty {
    fd: AsyncFd<OwnedFd>,
}

impl Pty {
    fn new(fd: OwnedFd) -> io::Result<Pty> {
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: the OwnedFd moved into the AsyncFd keeps the descriptor open, and always
        // the same one, until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(Pty { fd })
    }

    /// Reads what the container wrote; `Ok(0)` once every process holding the terminal's
    /// other side is gone (the kernel answers EIO then, which is the terminal's end of file).
    pub(super) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            // SAFETY: read(2) into buf, at most buf.len() bytes.
            match guard.try_io(|fd| cvt(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` to the container's terminal (its keyboard).
    pub(super) async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            // SAFETY: write(2) from data, at most data.len() bytes.
            match guard.try_io(|fd| cvt(unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) })) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the window size; the kernel sends SIGWINCH to the terminal's foreground
    /// processes, as a resized terminal window does.
    pub(super) fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which is live.
        if unsafe { libc::ioctl(self.fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn cvt(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Makes this process a child subreaper (once), so that a detached runc's container
/// process, orphaned when runc exits, becomes its child and its exit code can be read.
///
/// This is process-wide: any other orphaned descendant is reparented here too. The
/// target spawns nothing else that daemonizes, and [`wait_exit`] reaps by pid only, so
/// the children other code waits for are left to it.
pub(super) fn become_subreaper() -> io::Result<()> {
    static DONE: OnceLock<i32> = OnceLock::new();
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes no pointers.
    let rc = *DONE.get_or_init(|| unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) });
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits (blocking) for the child `pid` to end: its exit code, or 128 + the signal that
/// killed it, as docker reports them.
pub(super) fn wait_exit(pid: i32) -> io::Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on one pid, with a local out-parameter.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn send_fds(sock: &UnixStream, fds: &[RawFd]) {
        let mut byte = *b"/dev/pts/0";
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: byte.len() };
        let size = std::mem::size_of_val(fds);
        // SAFETY: sizes only.
        let space = unsafe { libc::CMSG_SPACE(size as u32) } as usize;
        let mut control = vec![0u64; space.div_ceil(8)];
        // SAFETY: as in recv_fd; one SCM_RIGHTS message of fds.len() descriptors.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
            assert!(libc::sendmsg(sock.as_raw_fd(), &msg, 0) > 0);
        }
    }

    fn open_pty() -> (OwnedFd, std::fs::File) {
        // SAFETY: posix_openpt/grantpt/unlockpt/ptsname on a fresh master we own.
        unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
            assert!(m >= 0);
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            let name = std::ffi::CStr::from_ptr(libc::ptsname(m)).to_str().unwrap().to_string();
            (OwnedFd::from_raw_fd(m), std::fs::OpenOptions::new().read(true).write(true).open(name).unwrap())
        }
    }

    #[tokio::test]
    async fn a_terminal_passes_over_the_socket_and_carries_bytes_and_sizes() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let sock = ConsoleSocket::bind(&dir.path().join("c.sock")).unwrap();
        let (master, mut slave) = open_pty();
        let path = sock.path().to_path_buf();
        let sender = std::thread::spawn(move || send_fds(&UnixStream::connect(path).unwrap(), &[master.as_raw_fd()]));
        let pty = sock.receive().await.unwrap();
        sender.join().unwrap();
        pty.resize(33, 77).unwrap();
        let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one winsize.
        assert_eq!(unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) }, 0);
        assert_eq!((ws.ws_row, ws.ws_col), (33, 77));
        slave.write_all(b"out\n").unwrap();
        let mut buf = [0u8; 64];
        let n = pty.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"out\r\n", "a fresh terminal translates newlines, as docker's do");
        pty.write_all(b"in\n").await.unwrap();
        let n = slave.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"in\n");
        drop(slave);
        // The terminal echoes input, as docker's do; then the last holder of the other
        // side gone reads as end of file.
        let mut rest = Vec::new();
        loop {
            match pty.read(&mut buf).await.unwrap() {
                0 => break,
                n => rest.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(rest, b"in\r\n");
        drop(sock);
        assert!(!dir.path().join("c.sock").exists());
    }

    #[tokio::test]
    async fn a_message_without_a_descriptor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sock = ConsoleSocket::bind(&dir.path().join("c.sock")).unwrap();
        let path = sock.path().to_path_buf();
        let sender = std::thread::spawn(move || {
            let mut s = UnixStream::connect(path).unwrap();
            std::io::Write::write_all(&mut s, b"no fd").unwrap();
        });
        let err = sock.receive().await.err().unwrap();
        sender.join().unwrap();
        assert!(err.to_string().contains("no file descriptor"), "{err}");
        let (a, b) = (open_pty().0, open_pty().0);
        let path = sock.path().to_path_buf();
        let sender = std::thread::spawn(move || send_fds(&UnixStream::connect(path).unwrap(), &[a.as_raw_fd(), b.as_raw_fd()]));
        let err = sock.receive().await.err().unwrap();
        sender.join().unwrap();
        assert!(err.to_string().contains("more than one"), "{err}");
    }
}
