// SPDX-License-Identifier: Apache-2.0
//! The ceiling the fabric is measured against: plain TCP on loopback, with the fabric
//! benchmark's request size, connection count and requests outstanding, and no NVMe
//! framing. A client asks for `request` bytes with an 8-byte request and the server answers
//! with that many bytes from memory, as an ideal target with nothing to read and nothing to
//! frame would.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

/// How the ceiling is measured.
#[derive(Debug, Clone, Copy)]
pub struct TcpLoad {
    /// Bytes each request asks for.
    pub request: usize,
    /// TCP connections, each with its own server thread.
    pub connections: usize,
    /// Requests outstanding in all, spread over the connections.
    pub depth: usize,
}

/// Moves `total` bytes (rounded up to whole requests) from server to client over loopback
/// with `load`; returns the seconds the transfer took.
pub fn tcp_loopback(total: u64, load: TcpLoad) -> io::Result<f64> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    let connections = load.connections.max(1);
    let request = load.request.max(1);
    let requests = total.div_ceil(request as u64);
    let server = std::thread::spawn(move || -> io::Result<()> {
        let mut workers = Vec::new();
        for _ in 0..connections {
            let (s, _) = listener.accept()?;
            workers.push(std::thread::spawn(move || serve(s, request)));
        }
        for w in workers {
            w.join().map_err(|_| io::Error::other("a loopback server thread panicked"))??;
        }
        Ok(())
    });
    let streams: Vec<TcpStream> = (0..connections).map(|_| TcpStream::connect(addr)).collect::<io::Result<_>>()?;
    let started = Instant::now();
    let per_conn_depth = load.depth.div_ceil(connections).max(1);
    let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                // Requests dealt round-robin: connection i takes every connections-th one.
                let mine = requests / connections as u64 + u64::from((i as u64) < requests % connections as u64);
                scope.spawn(move || fetch(s, request, mine, per_conn_depth))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(io::Error::other("a loopback client thread panicked")))).collect()
    });
    let secs = started.elapsed().as_secs_f64();
    results.into_iter().collect::<io::Result<()>>()?;
    server.join().map_err(|_| io::Error::other("the loopback server panicked"))??;
    Ok(secs)
}

/// Answers every 8-byte request with `request` bytes until the client closes.
fn serve(mut s: TcpStream, request: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    let data = vec![0x5Au8; request];
    let mut ask = [0u8; 8];
    loop {
        match s.read_exact(&mut ask) {
            Ok(()) => s.write_all(&data)?,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Fetches `count` responses keeping `depth` requests outstanding.
fn fetch(mut s: TcpStream, request: usize, count: u64, depth: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; request];
    let mut asked = 0u64;
    let ask = |s: &mut TcpStream, asked: &mut u64| -> io::Result<()> {
        *asked += 1;
        s.write_all(&(request as u64).to_le_bytes())
    };
    while asked < count.min(depth as u64) {
        ask(&mut s, &mut asked)?;
    }
    for _ in 0..count {
        s.read_exact(&mut buf)?;
        std::hint::black_box(&buf);
        if asked < count {
            ask(&mut s, &mut asked)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_whole_requests_over_several_connections() {
        let secs = tcp_loopback(3 << 20, TcpLoad { request: 128 << 10, connections: 4, depth: 32 }).unwrap();
        assert!(secs > 0.0);
        // Fewer requests than connections and than the depth still finish.
        assert!(tcp_loopback(4096, TcpLoad { request: 4096, connections: 4, depth: 32 }).unwrap() > 0.0);
    }
}
