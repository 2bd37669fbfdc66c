// SPDX-License-Identifier: Apache-2.0
//! The ceiling the fabric is measured against: plain TCP on loopback, with the fabric
//! benchmark's request size, connection count, requests outstanding and client shape, and no
//! NVMe framing. A client asks for `request` bytes at an offset with an 8-byte request and
//! the server answers with that many bytes, as an ideal target with nothing to frame would.
//!
//! The server's bytes come from one of two places ([`Source`]):
//!
//! * **the benchmark's file**, sent with `sendfile` from the page cache, and received into
//!   span-sized buffers as the fabric's reader receives them: TCP moving the same bytes
//!   through the same memory as the fabric, the ceiling a storage target can reach;
//! * **one small buffer** that stays in the CPU's cache on both ends (what `iperf3` measures):
//!   the transport alone, with no memory traffic at all, which no server of real data meets.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How the ceiling is measured.
#[derive(Debug, Clone, Copy)]
pub struct TcpLoad {
    /// Bytes each request asks for.
    pub request: usize,
    /// TCP connections, each with its own server thread and client thread.
    pub connections: usize,
    /// Requests outstanding in all, spread over the connections.
    pub depth: usize,
    /// Bytes a client thread takes at a time and asks for in `request`-sized pieces (the
    /// fabric reader's span); at least one request.
    pub span: usize,
}

/// Where the server's bytes come from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// The requested range of this file, sent from the page cache; the client receives into
    /// a span-sized buffer.
    File(&'a Path),
    /// One request-sized buffer, on both ends.
    Cached,
}

/// Moves `total` bytes (rounded up to whole requests) from server to client over loopback
/// with `load`; returns the seconds the transfer took. With [`Source::File`], `total` must
/// not exceed the file's size.
pub fn tcp_loopback(total: u64, load: TcpLoad, source: Source<'_>) -> io::Result<f64> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    let connections = load.connections.max(1);
    let request = load.request.max(1);
    let span = load.span.max(request).next_multiple_of(request);
    let file = match source {
        Source::File(path) => Some(File::open(path)?),
        Source::Cached => None,
    };
    let per_conn_depth = load.depth.div_ceil(connections).max(1);
    let next = AtomicU64::new(0);
    let started = std::thread::scope(|scope| -> io::Result<Instant> {
        let server = scope.spawn(|| -> io::Result<()> {
            let mut workers = Vec::new();
            for _ in 0..connections {
                let (s, _) = listener.accept()?;
                let file = file.as_ref();
                workers.push(scope.spawn(move || serve(s, request, file)));
            }
            workers.into_iter().try_for_each(|w| w.join().map_err(|_| io::Error::other("a loopback server thread panicked"))?)
        });
        let streams: Vec<TcpStream> = (0..connections).map(|_| TcpStream::connect(addr)).collect::<io::Result<_>>()?;
        let started = Instant::now();
        let clients: Vec<_> = streams
            .into_iter()
            .map(|s| {
                let buffer = if file.is_some() { span } else { request };
                let next = &next;
                scope.spawn(move || fetch(s, total, next, span, request, buffer, per_conn_depth))
            })
            .collect();
        for c in clients {
            c.join().map_err(|_| io::Error::other("a loopback client thread panicked"))??;
        }
        server.join().map_err(|_| io::Error::other("the loopback server panicked"))??;
        Ok(started)
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// Answers every 8-byte request (an offset) with `request` bytes until the client closes:
/// from `file` at that offset, or from a buffer.
fn serve(mut s: TcpStream, request: usize, file: Option<&File>) -> io::Result<()> {
    s.set_nodelay(true)?;
    let data = if file.is_none() { vec![0x5Au8; request] } else { Vec::new() };
    let mut ask = [0u8; 8];
    loop {
        match s.read_exact(&mut ask) {
            Ok(()) => match file {
                Some(f) => insitu_media::send_file_range(s.as_fd(), f, u64::from_le_bytes(ask), request)?,
                None => s.write_all(&data)?,
            },
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Takes `span` bytes of `[0, total)` at a time from `next` and fetches each in `request`
/// pieces with up to `depth` outstanding, into a buffer of `buffer` bytes (reused from its
/// start whenever the span outgrows it).
fn fetch(mut s: TcpStream, total: u64, next: &AtomicU64, span: usize, request: usize, buffer: usize, depth: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; buffer];
    loop {
        let at = next.fetch_add(span as u64, Ordering::Relaxed);
        if at >= total {
            return Ok(());
        }
        let count = (total - at).min(span as u64).div_ceil(request as u64);
        let ask = |s: &mut TcpStream, i: u64| s.write_all(&(at + i * request as u64).to_le_bytes());
        let mut asked = 0;
        while asked < count.min(depth as u64) {
            ask(&mut s, asked)?;
            asked += 1;
        }
        for i in 0..count {
            let place = (i as usize * request) % buffer;
            s.read_exact(&mut buf[place..place + request])?;
            if asked < count {
                ask(&mut s, asked)?;
                asked += 1;
            }
        }
        std::hint::black_box(&buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_whole_requests_over_several_connections() {
        let load = TcpLoad { request: 128 << 10, connections: 4, depth: 32, span: 1 << 20 };
        assert!(tcp_loopback(3 << 20, load, Source::Cached).unwrap() > 0.0);
        // Fewer requests than connections and than the depth still finish.
        let small = TcpLoad { request: 4096, connections: 4, depth: 32, span: 4096 };
        assert!(tcp_loopback(4096, small, Source::Cached).unwrap() > 0.0);
    }

    #[test]
    fn serves_a_file_and_refuses_ranges_beyond_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 2 << 20]).unwrap();
        let load = TcpLoad { request: 64 << 10, connections: 2, depth: 4, span: 512 << 10 };
        assert!(tcp_loopback(2 << 20, load, Source::File(&path)).unwrap() > 0.0);
        assert!(tcp_loopback(4 << 20, load, Source::File(&path)).is_err(), "asking past the end of the file must fail");
    }
}
