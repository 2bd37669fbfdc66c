// SPDX-License-Identifier: Apache-2.0
//! The sending side of a connection: PDUs and completions back to the host, shared by the
//! connection's reader, its queue's workers and the handlers that complete commands later.

use insitu_fabric::{data_digest, write_all_vectored, Completion, Digests, Pdu};
use std::io::{IoSlice, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Largest C2HData payload sent in one PDU.
const C2H_CHUNK: usize = 256 << 10;

/// The sending side, shared by the reader and the queue's workers.
#[derive(Clone)]
pub(crate) struct Sink {
    pub(crate) stream: Arc<Mutex<Box<dyn Write + Send>>>,
    /// The modelled link towards the host, if any.
    pub(crate) link: Option<Arc<dyn crate::LinkPacer>>,
    pub(crate) digests: Digests,
    pub(crate) hpda: u8,
    pub(crate) sqid: u16,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The socket under `stream`, for data sent straight from the page cache; none for
    /// other transports.
    pub(crate) socket: Option<Arc<TcpStream>>,
}

impl Sink {
    /// Sends PDUs back to back; one lock so responses never interleave.
    pub(crate) fn send(&self, pdus: &[Pdu]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for p in pdus {
            p.encode(self.digests, self.hpda, &mut bytes);
        }
        self.write(&mut [IoSlice::new(&bytes)])
    }

    /// Writes the slices in order, as one message on the wire, once a modelled link would
    /// have delivered them.
    fn write(&self, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        if let Some(l) = &self.link {
            l.transfer(slices.iter().map(|s| s.len() as u64).sum());
        }
        self.write_now(slices)
    }

    /// Writes the slices in order, as one message on the wire, unpaced.
    fn write_now(&self, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        self.metrics.add_wire_out(slices.iter().map(|s| s.len() as u64).sum());
        write_all_vectored(&mut **self.stream.lock().unwrap_or_else(|e| e.into_inner()), slices)
    }

    /// Whether [`Sink::complete_from_media`] would send from `media`.
    pub(crate) fn can_send_from(&self, media: &insitu_media::Backing) -> bool {
        self.socket.is_some() && !self.digests.data && media.can_send_from_page_cache()
    }

    /// Sends `len` bytes at `offset` of `media` as a command's data, straight from the page
    /// cache to the socket (`sendfile`: the kernel sends the cached pages themselves), then
    /// its response capsule. On a device model the capsule, which is what tells the host its
    /// data is there, leaves when the modelled drive would have read the data and the
    /// modelled link carried it; the data itself goes at once, so the real send overlaps
    /// the modelled time rather than adding to it, and other commands' PDUs may go out
    /// meanwhile. Only for media that [`Sink::can_send_from`] accepts: no socket, data
    /// digests (they need the data in hand), or media read directly (see
    /// [`insitu_media::Backing::can_send_from_page_cache`]) fail with nothing sent.
    pub(crate) fn complete_from_media(&self, cid: u16, sqhd: u16, media: &insitu_media::Backing, offset: u64, len: usize) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        let Some(socket) = self.socket.as_ref().filter(|_| self.can_send_from(media)) else {
            return Err(std::io::Error::other("this connection cannot send from the page cache"));
        };
        let started = Instant::now();
        let ready = media.book_host_read(offset, len);
        let mut heads = Vec::with_capacity(32);
        let mut sent = 0;
        {
            let _stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
            let mut at = 0;
            while at < len {
                let n = (len - at).min(C2H_CHUNK);
                heads.clear();
                let pdu = Pdu::C2HData { cccid: cid, datao: at as u32, last: at + n == len, success: false, data: Vec::new() };
                pdu.encode_head(n, self.digests, self.hpda, &mut heads);
                send_more(socket, &heads)?;
                media.send_from_page_cache(socket.as_fd(), offset + at as u64, n)?;
                sent += heads.len() + n;
                at += n;
            }
        }
        self.metrics.add_wire_out(sent as u64);
        if let Some(t) = ready {
            media.wait_until(t);
        }
        heads.clear();
        Pdu::CapsuleResp { cqe: Completion { sqhd, sqid: self.sqid, cid, ..Completion::default() } }.encode(self.digests, self.hpda, &mut heads);
        self.metrics.add_wire_out(heads.len() as u64);
        // The modelled link carries the data from when the modelled drive has read it.
        if let Some(l) = &self.link {
            l.wait_until(l.book((sent + heads.len()) as u64, ready.unwrap_or(started)));
        }
        self.stream.lock().unwrap_or_else(|e| e.into_inner()).write_all(&heads)
    }

    /// Sends a command's data (if any) and its response capsule in one vectored write: the
    /// C2HData headers and digests are built aside and the data goes out from where it lies.
    pub(crate) fn complete(&self, cid: u16, sqhd: u16, status: u16, dw0: u32, dw1: u32, data: &[u8]) -> std::io::Result<()> {
        let chunks = data.len().div_ceil(C2H_CHUNK);
        let mut heads = Vec::with_capacity(chunks * 32 + 32);
        let mut marks = Vec::with_capacity(chunks); // (end of this head in `heads`, digest)
        for (i, c) in data.chunks(C2H_CHUNK).enumerate() {
            let pdu = Pdu::C2HData { cccid: cid, datao: (i * C2H_CHUNK) as u32, last: i + 1 == chunks, success: false, data: Vec::new() };
            let digest = pdu.encode_head(c.len(), self.digests, self.hpda, &mut heads).then(|| data_digest(c));
            marks.push((heads.len(), digest));
        }
        let resp_at = heads.len();
        Pdu::CapsuleResp { cqe: Completion { dw0, dw1, sqhd, sqid: self.sqid, cid, status } }.encode(self.digests, self.hpda, &mut heads);
        let mut slices = Vec::with_capacity(chunks * 3 + 1);
        let mut at = 0;
        for ((end, digest), c) in marks.iter().zip(data.chunks(C2H_CHUNK)) {
            slices.push(IoSlice::new(&heads[at..*end]));
            slices.push(IoSlice::new(c));
            if let Some(d) = digest {
                slices.push(IoSlice::new(d));
            }
            at = *end;
        }
        slices.push(IoSlice::new(&heads[resp_at..]));
        match &self.link {
            // Data of several PDUs goes at once and the capsule once the modelled link has
            // carried it all: the real send overlaps the modelled one instead of following
            // it. Less goes in one write after the wait, as a host would have to wake twice
            // for data and capsule sent apart, to save a few microseconds of link.
            Some(l) if data.len() > C2H_CHUNK => {
                let deadline = l.book(slices.iter().map(|s| s.len() as u64).sum(), Instant::now());
                let last = slices.len() - 1;
                let (pdus, capsule) = slices.split_at_mut(last);
                self.write_now(pdus)?;
                l.wait_until(deadline);
                self.write_now(capsule)
            }
            _ => self.write(&mut slices),
        }
    }
}

/// Writes all of `bytes` to `socket`, telling the kernel that more follows (`MSG_MORE`), so
/// that a PDU header and the data sent after it leave in the same segments.
fn send_more(socket: &TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: sends from a valid slice on the connection's own open socket.
        let n = unsafe { libc::send(socket.as_raw_fd(), bytes[at..].as_ptr().cast(), bytes.len() - at, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        at += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What happened, in order: bookings, waits, and writes of so many bytes.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Log {
        fn push(&self, e: String) {
            self.0.lock().unwrap().push(e);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// A modelled link that takes 1 ms per booking and logs what it is asked.
    struct Link(Log);

    impl crate::LinkPacer for Link {
        fn book(&self, bytes: u64, from: Instant) -> Instant {
            self.0.push(format!("book {bytes}"));
            from + Duration::from_millis(1)
        }
        fn wait_until(&self, deadline: Instant) {
            self.0.push("wait".into());
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
    }

    struct Stream(Log);

    impl Write for Stream {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(format!("write {}", buf.len()));
            Ok(buf.len())
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            let n = bufs.iter().map(|b| b.len()).sum();
            self.0.push(format!("write {n}"));
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn sink(log: &Log) -> Sink {
        Sink {
            stream: Arc::new(Mutex::new(Box::new(Stream(log.clone())))),
            link: Some(Arc::new(Link(log.clone()))),
            digests: Digests::default(),
            hpda: 0,
            sqid: 1,
            metrics: Arc::default(),
            socket: None,
        }
    }

    #[test]
    fn data_goes_at_once_and_its_completion_once_the_modelled_link_carried_it() {
        let log = Log::default();
        let s = sink(&log);
        let data = vec![7u8; 300 << 10];
        s.complete(3, 0, 0, 0, 0, &data).unwrap();
        // Two C2HData PDUs (256 KiB and 44 KiB, 24-byte headers) and a 24-byte capsule.
        let pdus = 2 * 24 + (300 << 10);
        assert_eq!(log.take(), [format!("book {}", pdus + 24), format!("write {pdus}"), "wait".into(), "write 24".into()]);
        // One PDU of data or none: data and capsule in one write, once the link has
        // carried them.
        s.complete(4, 0, 0, 0, 0, &[1; 2048]).unwrap();
        assert_eq!(log.take(), ["book 2096", "wait", "write 2096"]);
        s.complete(5, 0, 0, 0, 0, &[]).unwrap();
        assert_eq!(log.take(), ["book 24", "wait", "write 24"]);
    }
}
