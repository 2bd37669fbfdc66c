// SPDX-License-Identifier: Apache-2.0
//! The embedded DNS server of user-defined networks, as Docker gives each container on
//! one: names of the containers on the asker's networks (container names, network
//! aliases, the asker's links, short ids) resolve to their addresses there; other names
//! are forwarded to the resolvers of the target's own `/etc/resolv.conf`, or, on an
//! `Internal` network, answered SERVFAIL (Docker forwards nothing from those either).
//!
//! Docker listens on 127.0.0.11 inside each container and redirects it with iptables;
//! here one server per network listens on port 53 of the network's gateway address, UDP
//! and TCP, in the hub namespace that holds the bridge (see [`bridge`](super::bridge)), and
//! a container's `/etc/resolv.conf` names that address. Nothing listens anywhere else: the
//! sockets are opened by a thread that entered the hub namespace. The asker is told apart
//! by its source address on that network. Messages are read and written with
//! hickory-proto; [`respond`] is the pure part (fuzzed, property-tested).

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, PTR};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Semaphore;

use super::Runtime;

/// TTL of the answers about containers (Docker's 600 s).
const TTL: u32 = 600;
/// Most answer records in one reply: far below what fills a 512-byte datagram.
const MAX_ANSWERS: usize = 16;
/// How long one upstream resolver is given to answer a forwarded query.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// Most forwarded queries in flight per network.
const MAX_FORWARDS: usize = 64;
/// The largest DNS message over UDP read or relayed (EDNS's usual ceiling).
const MAX_MESSAGE: usize = 4096;

/// What the network knows, for one asker.
pub(crate) trait Names {
    /// The addresses `name` (lower case, no trailing dot) has on the asker's networks;
    /// empty when none of them knows it.
    fn addresses(&self, name: &str) -> Vec<Ipv4Addr>;
    /// The name of the container with address `ip` on the asker's networks.
    fn name_of(&self, ip: Ipv4Addr) -> Option<String>;
}

/// What to do with a datagram.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Send these bytes back to the asker.
    Answer(Vec<u8>),
    /// Not a name of the network's: pass the query on as it came, and its answer back.
    Forward,
    /// Not a query (a response, or too short to carry an id): say nothing.
    Ignore,
}

/// The answer to `packet` (a DNS message from a container): the network's names from
/// `names`; others are [`Reply::Forward`] when `forward`, else SERVFAIL. A message that
/// does not parse gets FORMERR when its header does; a response gets nothing, so that two
/// servers can never answer each other for ever.
pub(crate) fn respond(packet: &[u8], names: &dyn Names, forward: bool) -> Reply {
    let Ok(query) = Message::from_vec(packet) else {
        // A query's header (QR clear) with an id: tell it, as a server must.
        return match packet {
            [hi, lo, flags, ..] if packet.len() >= 12 && flags & 0x80 == 0 => reply(&error(u16::from_be_bytes([*hi, *lo]), ResponseCode::FormErr)),
            _ => Reply::Ignore,
        };
    };
    if query.metadata.message_type != MessageType::Query {
        return Reply::Ignore;
    }
    let mut out = Message::response(query.metadata.id, query.metadata.op_code);
    out.metadata.recursion_desired = query.metadata.recursion_desired;
    out.metadata.recursion_available = true;
    if query.metadata.op_code != OpCode::Query {
        out.metadata.response_code = ResponseCode::NotImp;
        return reply(&out);
    }
    let [q] = query.queries.as_slice() else {
        out.metadata.response_code = ResponseCode::FormErr;
        return reply(&out);
    };
    out.queries.push(q.clone());
    let name = q.name().to_lowercase().to_ascii();
    let name = name.trim_end_matches('.');
    if q.query_class() != DNSClass::IN {
        return if forward { Reply::Forward } else { servfail(out) };
    }
    let owner = q.name().clone();
    if q.query_type() == RecordType::PTR {
        if let Some(n) = reverse(name).and_then(|ip| names.name_of(ip)).and_then(|n| Name::from_ascii(format!("{n}.")).ok()) {
            out.answers.push(Record::from_rdata(owner, TTL, RData::PTR(PTR(n))));
            return reply(&out);
        }
        // A reverse name of a network's own address that no container holds: this
        // server is the authority for it, as Docker's is.
        return if forward { Reply::Forward } else { servfail(out) };
    }
    let addrs = names.addresses(name);
    if addrs.is_empty() {
        return if forward { Reply::Forward } else { servfail(out) };
    }
    // A name of the network's: A records; other types have no data (NOERROR, empty), as
    // Docker's server answers AAAA on a network without IPv6.
    if matches!(q.query_type(), RecordType::A | RecordType::ANY) {
        out.metadata.authoritative = true;
        out.answers.extend(addrs.into_iter().take(MAX_ANSWERS).map(|a| Record::from_rdata(owner.clone(), TTL, RData::A(A(a)))));
    }
    reply(&out)
}

/// An error answer with only a header.
fn error(id: u16, code: ResponseCode) -> Message {
    let mut m = Message::error_msg(id, OpCode::Query, code);
    m.metadata.recursion_available = true;
    m
}

fn servfail(mut out: Message) -> Reply {
    out.metadata.response_code = ResponseCode::ServFail;
    reply(&out)
}

fn reply(m: &Message) -> Reply {
    m.to_vec().map(Reply::Answer).unwrap_or(Reply::Ignore)
}

/// The address of a reverse name: `4.3.2.1.in-addr.arpa` is 1.2.3.4.
fn reverse(name: &str) -> Option<Ipv4Addr> {
    let rest = name.strip_suffix(".in-addr.arpa")?;
    let mut o = [0u8; 4];
    let mut parts = rest.split('.');
    for i in (0..4).rev() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        o[i] = p.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(o))
}

/// The nameservers of a `resolv.conf`, in order (those that are not addresses skipped).
pub(crate) fn nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().collect::<Vec<_>>().get(..2).filter(|w| w[0] == "nameserver").map(|w| w[1].to_string()))
        .filter_map(|a| a.split('%').next().and_then(|a| a.parse::<IpAddr>().ok()))
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// The `/etc/resolv.conf` of a container whose networks' server listens on `server`.
pub(crate) fn resolv_conf(server: Ipv4Addr) -> String {
    format!("nameserver {server}\noptions ndots:0\n")
}

/// What a server asks of the runtime for an asker at an address: that asker's view of
/// its networks and whether the network is `Internal`; `None` once the runtime is gone.
pub(crate) type Lookup = Arc<dyn Fn(Ipv4Addr) -> Option<(View, bool)> + Send + Sync>;

/// Serves network `nid`'s names on `udp` and `tcp` (both bound in the hub namespace to
/// the gateway's port 53) until aborted or the runtime is gone.
pub(crate) async fn serve(udp: tokio::net::UdpSocket, tcp: tokio::net::TcpListener, nid: String, rt: Weak<Runtime>) {
    let lookup: Lookup = Arc::new(move |src| rt.upgrade().map(|rt| rt.dns_view(&nid, src)));
    let upstream: Arc<[SocketAddr]> = nameservers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()).into();
    let gate = Arc::new(Semaphore::new(MAX_FORWARDS));
    // The UDP side ends once the runtime is gone; the TCP side (its connections too) with it.
    tokio::select! {
        () = serve_udp(udp, lookup.clone(), upstream.clone(), gate.clone()) => {}
        () = serve_tcp(tcp, lookup, upstream, gate, TcpLimits::DEFAULT) => {}
    }
}

/// The server over UDP: one datagram, one answer; forwarded queries answered from tasks
/// of their own (at most [`MAX_FORWARDS`] in flight, the rest dropped as if lost).
async fn serve_udp(sock: tokio::net::UdpSocket, lookup: Lookup, upstream: Arc<[SocketAddr]>, gate: Arc<Semaphore>) {
    let sock = Arc::new(sock);
    let mut forwards = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        while forwards.try_join_next().is_some() {}
        let (n, from) = super::ports::recv_from(&sock, &mut buf).await;
        let IpAddr::V4(src) = from.ip() else { continue };
        let Some((names, internal)) = lookup(src) else { return };
        match respond(&buf[..n], &names, !internal && !upstream.is_empty()) {
            Reply::Answer(bytes) => {
                let _ = sock.send_to(&bytes, from).await;
            }
            Reply::Ignore => {}
            Reply::Forward => {
                // Too many in flight: the asker retries, as after a lost datagram.
                let Ok(permit) = gate.clone().try_acquire_owned() else { continue };
                let (query, sock, upstream) = (buf[..n].to_vec(), sock.clone(), upstream.clone());
                forwards.spawn(async move {
                    let _permit = permit;
                    if let Some(answer) = forward(&query, &upstream, Transport::Udp).await {
                        let _ = sock.send_to(&answer, from).await;
                    }
                });
            }
        }
    }
}

/// Bounds of the server over TCP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpLimits {
    /// Most connections open at once per network; a connection past them is closed as
    /// soon as it is accepted.
    pub(crate) connections: usize,
    /// How long a connection may take to deliver its next message (its two length bytes
    /// and the message), and an answer to be taken; past it the connection is closed, so
    /// that a client that connects and sends nothing holds nothing for long.
    pub(crate) idle: Duration,
}

impl TcpLimits {
    /// 64 connections; 10 s (RFC 7766 asks for idle timeouts of seconds).
    pub(crate) const DEFAULT: TcpLimits = TcpLimits { connections: 64, idle: Duration::from_secs(10) };
}

/// The server over TCP (RFC 1035 4.2.2, RFC 7766): each message carries a two-byte
/// big-endian length; a connection may carry many queries, answered in order, the same
/// answers as over UDP, forwarded ones over TCP too (a query with no forward slot left
/// gets SERVFAIL: over TCP there is no loss to retry after).
pub(crate) async fn serve_tcp(listener: tokio::net::TcpListener, lookup: Lookup, upstream: Arc<[SocketAddr]>, gate: Arc<Semaphore>, limits: TcpLimits) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let Ok((stream, from)) = listener.accept().await else {
            // Out of descriptors, or the like: wait rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let IpAddr::V4(src) = from.ip() else { continue };
        // Past the bound the connection is dropped (closed) at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let (lookup, upstream, gate) = (lookup.clone(), upstream.clone(), gate.clone());
        conns.spawn(async move {
            let _slot = slot;
            let _ = tcp_connection(stream, src, &lookup, &upstream, &gate, limits.idle).await;
        });
    }
}

/// One TCP connection: messages answered in order until the client closes, sends
/// something that is not a message, or is idle past `idle`.
async fn tcp_connection(
    mut stream: tokio::net::TcpStream,
    src: Ipv4Addr,
    lookup: &Lookup,
    upstream: &[SocketAddr],
    gate: &Semaphore,
    idle: Duration,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    loop {
        let Ok(read) = tokio::time::timeout(idle, read_framed(&mut stream)).await else { return Ok(()) };
        let Some(query) = read? else { return Ok(()) };
        let Some((names, internal)) = lookup(src) else { return Ok(()) };
        let answer = match respond(&query, &names, !internal && !upstream.is_empty()) {
            Reply::Answer(a) => a,
            Reply::Ignore => continue,
            Reply::Forward => match gate.try_acquire() {
                Ok(_permit) => forward(&query, upstream, Transport::Tcp).await,
                Err(_) => fail(&query),
            }
            .unwrap_or_default(),
        };
        if answer.is_empty() {
            continue;
        }
        let Ok(written) = tokio::time::timeout(idle, stream.write_all(&framed(&answer))).await else { return Ok(()) };
        written?;
    }
}

/// Reads one length-prefixed message; `None` at a clean end of the stream before one.
pub(crate) async fn read_framed<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 2];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

/// `msg` with its two-byte length in front (a message is at most 65535 bytes: longer
/// ones are cut there, which no answer of this server's comes near).
pub(crate) fn framed(msg: &[u8]) -> Vec<u8> {
    let msg = &msg[..msg.len().min(usize::from(u16::MAX))];
    let mut out = Vec::with_capacity(msg.len() + 2);
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// How a query reached the server, and so how it is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// The upstream answer to `query`, or SERVFAIL when no resolver gives one; `None` when
/// not even that can be made.
async fn forward(query: &[u8], upstream: &[SocketAddr], transport: Transport) -> Option<Vec<u8>> {
    let answer = match transport {
        Transport::Udp => ask_upstream(query, upstream).await,
        Transport::Tcp => ask_upstream_tcp(query, upstream).await,
    };
    answer.or_else(|| fail(query))
}

/// SERVFAIL for `query`.
fn fail(query: &[u8]) -> Option<Vec<u8>> {
    match respond(query, &NoNames, false) {
        Reply::Answer(a) => Some(a),
        _ => None,
    }
}

/// No names at all: what a failed forward answers from (SERVFAIL).
struct NoNames;

impl Names for NoNames {
    fn addresses(&self, _: &str) -> Vec<Ipv4Addr> {
        Vec::new()
    }
    fn name_of(&self, _: Ipv4Addr) -> Option<String> {
        None
    }
}

/// `query` sent, from the daemon's own namespace, to each upstream resolver in turn;
/// the first answer with the query's id.
async fn ask_upstream(query: &[u8], upstream: &[SocketAddr]) -> Option<Vec<u8>> {
    for server in upstream {
        let local: SocketAddr = if server.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let Ok(s) = tokio::net::UdpSocket::bind(local).await else { continue };
        if s.connect(server).await.is_err() || s.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; MAX_MESSAGE];
        if let Ok(Ok(n)) = tokio::time::timeout(UPSTREAM_TIMEOUT, s.recv(&mut buf)).await {
            if n >= 2 && buf[..2] == query[..2] {
                buf.truncate(n);
                return Some(buf);
            }
        }
    }
    None
}

/// `query` sent over TCP, from the daemon's own namespace, to each upstream resolver in
/// turn ([`UPSTREAM_TIMEOUT`] for each, connection included); the first answer with the
/// query's id.
async fn ask_upstream_tcp(query: &[u8], upstream: &[SocketAddr]) -> Option<Vec<u8>> {
    use tokio::io::AsyncWriteExt;
    for server in upstream {
        let ask = async {
            let mut s = tokio::net::TcpStream::connect(server).await.ok()?;
            s.write_all(&framed(query)).await.ok()?;
            read_framed(&mut s).await.ok().flatten()
        };
        if let Ok(Some(a)) = tokio::time::timeout(UPSTREAM_TIMEOUT, ask).await {
            if a.len() >= 2 && a[..2] == query[..2] {
                return Some(a);
            }
        }
    }
    None
}

/// One asker's view of its networks: every running container on them with its names.
pub(crate) struct View {
    /// (address, names), names in lower case.
    pub(crate) entries: Vec<(Ipv4Addr, Vec<String>)>,
}

impl View {
    /// Two containers, `web` (alias `store`, short id `0123456789ab`) at 172.18.0.2 and
    /// `db` (alias `store`) at 172.18.0.3: what the tests and the fuzz target ask.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn sample() -> View {
        View {
            entries: vec![
                (Ipv4Addr::new(172, 18, 0, 2), vec!["web".into(), "store".into(), "0123456789ab".into()]),
                (Ipv4Addr::new(172, 18, 0, 3), vec!["db".into(), "store".into()]),
            ],
        }
    }
}

impl Names for View {
    fn addresses(&self, name: &str) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.entries.iter().filter(|(_, names)| names.iter().any(|n| n == name)).map(|(a, _)| *a).collect();
        v.dedup();
        v
    }
    fn name_of(&self, ip: Ipv4Addr) -> Option<String> {
        self.entries.iter().find(|(a, _)| *a == ip).and_then(|(_, n)| n.first().cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use proptest::prelude::*;

    fn view() -> View {
        View::sample()
    }

    fn ask(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0x4242;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn answer(r: Reply) -> Message {
        match r {
            Reply::Answer(b) => Message::from_vec(&b).unwrap(),
            other => panic!("no answer: {other:?}"),
        }
    }

    #[test]
    fn names_of_the_network_resolve_and_others_are_forwarded_or_refused() {
        let m = answer(respond(&ask("Web.", RecordType::A), &view(), true));
        assert_eq!((m.metadata.id, m.metadata.message_type, m.metadata.response_code), (0x4242, MessageType::Response, ResponseCode::NoError));
        assert!(m.metadata.recursion_desired && m.metadata.authoritative);
        let addrs: Vec<_> = m.answers.iter().map(|r| r.data.clone()).collect();
        assert_eq!(addrs, vec![RData::A(A(Ipv4Addr::new(172, 18, 0, 2)))]);
        // An alias two containers share: both.
        assert_eq!(answer(respond(&ask("store", RecordType::A), &view(), true)).answers.len(), 2);
        // AAAA of a known name: no data, no error.
        let m = answer(respond(&ask("db", RecordType::AAAA), &view(), true));
        assert!(m.answers.is_empty() && m.metadata.response_code == ResponseCode::NoError);
        // Reverse lookups.
        let m = answer(respond(&ask("3.0.18.172.in-addr.arpa.", RecordType::PTR), &view(), true));
        assert_eq!(m.answers[0].data, RData::PTR(PTR(Name::from_ascii("db.").unwrap())));
        // Unknown names.
        assert_eq!(respond(&ask("example.org", RecordType::A), &view(), true), Reply::Forward);
        assert_eq!(answer(respond(&ask("example.org", RecordType::A), &view(), false)).metadata.response_code, ResponseCode::ServFail);
    }

    #[test]
    fn bad_messages_get_formerr_or_nothing() {
        let mut junk = ask("web", RecordType::A);
        junk.truncate(20);
        let m = answer(respond(&junk, &view(), true));
        assert_eq!((m.metadata.id, m.metadata.response_code), (0x4242, ResponseCode::FormErr));
        assert_eq!(respond(&[1, 2, 3], &view(), true), Reply::Ignore);
        // A response is never answered.
        let mut resp = Message::from_vec(&ask("web", RecordType::A)).unwrap();
        resp.metadata.message_type = MessageType::Response;
        assert_eq!(respond(&resp.to_vec().unwrap(), &view(), true), Reply::Ignore);
        // Two questions at once.
        let mut two = Message::from_vec(&ask("web", RecordType::A)).unwrap();
        two.add_query(Query::query(Name::from_ascii("db").unwrap(), RecordType::A));
        assert_eq!(answer(respond(&two.to_vec().unwrap(), &view(), true)).metadata.response_code, ResponseCode::FormErr);
    }

    #[test]
    fn resolv_conf_nameservers_are_read() {
        let text = "# generated\nsearch example.org\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver bogus\noptions ndots:1\n";
        assert_eq!(nameservers(text), vec!["10.0.0.2:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
        assert_eq!(reverse("4.3.2.1.in-addr.arpa"), Some(Ipv4Addr::new(1, 2, 3, 4)));
        for bad in ["3.2.1.in-addr.arpa", "5.4.3.2.1.in-addr.arpa", "256.1.1.1.in-addr.arpa", "a.b.c.d.in-addr.arpa", "1.2.3.4"] {
            assert_eq!(reverse(bad), None, "{bad}");
        }
    }

    /// A TCP server of the sample view on a loopback port, forwarding to `upstream`.
    async fn tcp_server(limits: TcpLimits, upstream: Vec<SocketAddr>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lookup: Lookup = Arc::new(|_| Some((View::sample(), false)));
        tokio::spawn(serve_tcp(listener, lookup, upstream.into(), Arc::new(Semaphore::new(MAX_FORWARDS)), limits));
        addr
    }

    async fn closed_within(s: &mut tokio::net::TcpStream, d: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        matches!(tokio::time::timeout(d, s.read(&mut b)).await, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test]
    async fn tcp_carries_length_prefixed_queries_in_order() {
        use tokio::io::AsyncWriteExt;
        let addr = tcp_server(TcpLimits::DEFAULT, Vec::new()).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Two queries in one write, the second split from its length: answered in order,
        // as over UDP (no upstream: unknown names get SERVFAIL).
        let (web, other) = (ask("web", RecordType::A), ask("example.org", RecordType::A));
        let mut bytes = framed(&web);
        bytes.extend(framed(&other));
        s.write_all(&bytes[..bytes.len() - 5]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(&bytes[bytes.len() - 5..]).await.unwrap();
        let first = read_framed(&mut s).await.unwrap().unwrap();
        assert_eq!(Reply::Answer(first), respond(&web, &View::sample(), false));
        let second = Message::from_vec(&read_framed(&mut s).await.unwrap().unwrap()).unwrap();
        assert_eq!(second.metadata.response_code, ResponseCode::ServFail);
        // A response is not answered; the connection stays for the next query.
        let mut resp = Message::from_vec(&web).unwrap();
        resp.metadata.message_type = MessageType::Response;
        s.write_all(&framed(&resp.to_vec().unwrap())).await.unwrap();
        s.write_all(&framed(&ask("db", RecordType::A))).await.unwrap();
        let db = Message::from_vec(&read_framed(&mut s).await.unwrap().unwrap()).unwrap();
        assert_eq!(db.answers[0].data, RData::A(A(Ipv4Addr::new(172, 18, 0, 3))));
        s.shutdown().await.unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(2)).await, "the server ends with the client");
    }

    #[tokio::test]
    async fn tcp_connections_are_bounded_and_idle_ones_closed() {
        use tokio::io::AsyncWriteExt;
        let limits = TcpLimits { connections: 2, idle: Duration::from_millis(300) };
        let addr = tcp_server(limits, Vec::new()).await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Half a message: its length says 100 bytes, 10 come.
        half.write_all(&[0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut third, Duration::from_millis(200)).await, "past the bound a connection is closed at once");
        assert!(closed_within(&mut silent, Duration::from_secs(2)).await, "a client that sends nothing is let go");
        assert!(closed_within(&mut half, Duration::from_secs(2)).await, "so is one that stops mid-message");
        // Their slots are free again.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&framed(&ask("web", RecordType::A))).await.unwrap();
        assert!(read_framed(&mut s).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn tcp_queries_are_forwarded_over_tcp() {
        use tokio::io::AsyncWriteExt;
        // An upstream resolver that answers every query with REFUSED (its own mark).
        let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_addr = up.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut c, _) = up.accept().await.unwrap();
            let q = Message::from_vec(&read_framed(&mut c).await.unwrap().unwrap()).unwrap();
            let a = Message::error_msg(q.metadata.id, OpCode::Query, ResponseCode::Refused);
            c.write_all(&framed(&a.to_vec().unwrap())).await.unwrap();
        });
        let addr = tcp_server(TcpLimits::DEFAULT, vec![up_addr]).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&framed(&ask("example.org", RecordType::A))).await.unwrap();
        let a = Message::from_vec(&read_framed(&mut s).await.unwrap().unwrap()).unwrap();
        assert_eq!((a.metadata.id, a.metadata.response_code), (0x4242, ResponseCode::Refused));
        // Names of the network are still the server's own.
        s.write_all(&framed(&ask("web", RecordType::A))).await.unwrap();
        assert!(Message::from_vec(&read_framed(&mut s).await.unwrap().unwrap()).unwrap().metadata.authoritative);
    }

    proptest! {
        #[test]
        fn any_datagram_gets_a_well_formed_answer_or_none(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            check(&data);
        }

        #[test]
        fn mangled_queries_get_a_well_formed_answer_or_none(
            name in "[a-z0-9.-]{1,40}", t in 0u16..300, flips in proptest::collection::vec((0usize..80, any::<u8>()), 0..6)
        ) {
            let Ok(n) = Name::from_ascii(&name) else { return Ok(()) };
            let mut m = Message::query();
            m.add_query(Query::query(n, RecordType::from(t)));
            let Ok(mut bytes) = m.to_vec() else { return Ok(()) };
            for (at, b) in flips {
                if let Some(x) = bytes.get_mut(at) {
                    *x ^= b;
                }
            }
            check(&bytes);
        }
    }

    /// What the server relies on (the fuzz target's checks).
    fn check(data: &[u8]) {
        crate::fuzzing::dns_message(data);
    }
}
