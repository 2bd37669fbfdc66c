// SPDX-License-Identifier: Apache-2.0
//! The sending side of a connection: PDUs and completions back to the host, shared by the
//! connection's reader, its queue's workers and the handlers that complete commands later.

use insitu_fabric::{data_digest, write_all_vectored, Completion, Digests, Pdu};
use std::io::{IoSlice, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

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

    /// Writes the slices in order, as one message on the wire.
    fn write(&self, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let total: usize = slices.iter().map(|s| s.len()).sum();
        self.metrics.add_wire_out(total as u64);
        // A modelled link delivers the bytes only when it would have carried them.
        if let Some(l) = &self.link {
            l.transfer(total as u64);
        }
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
        if let Some(l) = &self.link {
            l.transfer((sent + heads.len()) as u64);
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
        self.write(&mut slices)
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
