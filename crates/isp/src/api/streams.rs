// SPDX-License-Identifier: Apache-2.0
//! The output of containers: `attach` (hijacked, both ways) and `logs` (replay of the
//! log, then what follows with `follow`).

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::body::{error, stream, ApiBody};
use super::detach::{self, EscapeMatcher, ParkedStdins, Scan};
use super::Target;
use crate::runtime::{frame, log, ExitEvent, Runtime, RuntimeError};

/// How long a hijacked connection waits before its first bytes. Clients such as the
/// Docker SDK for Python read the 101 answer through a buffered reader and then turn to
/// the raw socket: bytes that arrive with the answer's headers would land in that buffer
/// and be lost to them. Output produced meanwhile waits in its channel.
pub(crate) const HIJACK_SETTLE: std::time::Duration = std::time::Duration::from_millis(150);

fn fail(e: RuntimeError) -> Response<ApiBody> {
    error(e.http_status(), &e.to_string())
}

/// `POST /containers/{id}/attach?stream=1&stdin=1&stdout=1&stderr=1&detachKeys=KEYS`: the
/// connection is hijacked (101) and carries the container's input and output. This is
/// the attach of `docker run -i`, `docker start -a` and `docker attach` alike.
///
/// With a terminal and standard input, the input is watched for the detach sequence
/// (`detachKeys`, ctrl-p,ctrl-q by default; see [`super::detach`]): on it the attach ends
/// and the container keeps running. When a TTY attach's input ends, detached or not, its
/// output ends too (as Docker's) and the container's input is kept for the next attach.
/// A bad `detachKeys` is refused on any attach, as Docker does.
///
/// `logs=1` replays the log first (as `logs` would, the same streams); `stream=0` ends
/// the attach after that replay instead of carrying the run's output, so an attach to an
/// exited container answers its output and closes.
pub fn attach(rt: &Runtime, parked: &Arc<ParkedStdins>, id: &str, t: &Target, mut req: Request<Incoming>) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let keys = match detach::keys_of(t.get("detachKeys")) {
        Ok(k) => k,
        Err(m) => return error(400, &m),
    };
    let tty = c.spec.tty;
    let (want_out, want_err) = (t.flag("stdout"), t.flag("stderr"));
    // Read before the input is taken, so that an input parked later is not kept for a
    // run that began after this one ended.
    let exits = c.exits();
    let exits_before = exits.borrow().exits;
    let want_in = t.flag("stdin");
    let stdin = if want_in { c.take_stdin().or_else(|| if tty { parked.take(&c.id) } else { None }) } else { None };
    let park = tty.then(|| (parked.clone(), c.id.clone(), exits, exits_before));
    let (replay_logs, carry) = (t.flag("logs"), t.flag("stream"));
    let (len, out) = if carry { c.log_and_subscribe(true) } else { (u64::MAX, None) };
    let filter = log::Filter { stdout: want_out, stderr: want_err, ..Default::default() };
    let replay = if replay_logs { filter.apply(c.log_records(len)) } else { Vec::new() };
    // Without `stream` there is no input to carry either.
    let stdin = stdin.filter(|_| carry);
    let upgrade = hyper::upgrade::on(&mut req);
    let (parked, id) = (parked.clone(), c.id.clone());
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        tokio::time::sleep(HIJACK_SETTLE).await;
        let (rd, mut wr) = tokio::io::split(TokioIo::new(upgraded));
        // A TTY's input may still be held by the attach that just detached (see
        // `ParkedStdins::take_within`); without a terminal it is handed over once only.
        let waits = want_in && tty && stdin.is_none();
        let waits = waits && carry;
        let input = (stdin.is_some() || waits).then(|| {
            tokio::spawn(async move {
                let tx = match stdin {
                    Some(tx) => Some(tx),
                    None => parked.take_within(&id, PARKED_INPUT_PATIENCE).await,
                };
                match tx {
                    Some(tx) => forward_input(rd, StdinLease { tx: Some(tx), park }, tty.then(|| EscapeMatcher::new(keys))).await,
                    // No input to give: the attach carries output until the run ends.
                    None => std::future::pending().await,
                }
            })
        });
        let output = async {
            for r in replay {
                let bytes = if tty { r.line } else { frame(r.stream, &r.line) };
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let Some(mut out) = out else { return };
            pump_output(&mut out, &mut wr, tty, want_out, want_err).await;
        };
        match input {
            // A terminal's input ending (the detach sequence, or the client hanging up,
            // which is how the docker CLI detaches) ends the attach.
            Some(input) if tty => {
                tokio::select! {
                    _ = output => {}
                    _ = input => {}
                }
            }
            _ => output.await,
        }
        let _ = wr.flush().await;
        let _ = wr.shutdown().await;
    });
    let ct = if tty { "application/vnd.docker.raw-stream" } else { "application/vnd.docker.multiplexed-stream" };
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("Content-Type", ct)
        .header("Connection", "Upgrade")
        .header("Upgrade", "tcp")
        .body(http_body_util::BodyExt::boxed(http_body_util::Empty::new()))
        .expect("static response parts")
}

/// How long a TTY attach waits for the container's input to be released by the attach
/// before it (a detach is seen by the server a moment after the client hangs up).
const PARKED_INPUT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// A container's standard input, held by one attach. Dropped, it closes the input of a
/// container without a terminal (as Docker's `docker run -i` does at the client's end of
/// input) and parks that of a TTY container (a terminal has no end of input to pass on,
/// and `docker attach` may come back to it).
pub(super) struct StdinLease {
    pub(super) tx: Option<mpsc::UnboundedSender<Bytes>>,
    pub(super) park: Option<(Arc<ParkedStdins>, String, watch::Receiver<ExitEvent>, u64)>,
}

impl Drop for StdinLease {
    fn drop(&mut self) {
        if let (Some(tx), Some((parked, id, exits, before))) = (self.tx.take(), self.park.take()) {
            parked.park(&id, tx, exits, before);
        }
    }
}

/// Copies the client's input to the container until it ends or, when `escape` watches
/// for it, the detach sequence arrives (swallowed: the container never sees it).
async fn forward_input<R: tokio::io::AsyncRead + Unpin>(mut rd: R, stdin: StdinLease, mut escape: Option<EscapeMatcher>) {
    let Some(tx) = stdin.tx.as_ref() else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (data, detached) = match escape.as_mut().map(|m| m.scan(&buf[..n])) {
            None => (Bytes::copy_from_slice(&buf[..n]), false),
            Some(Scan::Forward(b)) => (Bytes::from(b), false),
            Some(Scan::Detach(b)) => (Bytes::from(b), true),
        };
        if !data.is_empty() && tx.send(data).is_err() {
            return;
        }
        if detached {
            return;
        }
    }
    // A sequence begun but never finished was the client's input after all.
    if let Some(rest) = escape.as_mut().map(EscapeMatcher::finish).filter(|r| !r.is_empty()) {
        let _ = tx.send(Bytes::from(rest));
    }
}

/// The filter of a `logs` request: its streams, `since`, `until` and `tail`.
pub(crate) fn log_filter(t: &Target) -> Result<log::Filter, String> {
    let (stdout, stderr) = (t.flag("stdout"), t.flag("stderr"));
    if !stdout && !stderr {
        return Err("You must choose at least one stream".into());
    }
    let time = |k: &str| -> Result<Option<std::time::SystemTime>, String> {
        // 0 is how clients say "no bound".
        match t.get(k).filter(|s| *s != "0") {
            None => Ok(None),
            Some(s) => log::parse_time(s).map(Some).map_err(|e| format!("{k}: {e}")),
        }
    };
    let tail = match t.get("tail").filter(|s| *s != "all") {
        None => None,
        Some(s) => match s.parse::<i64>() {
            // Docker reads a negative tail as all of it.
            Ok(n) => usize::try_from(n).ok(),
            Err(_) => return Err(format!("invalid tail {s:?}: a number of lines or \"all\"")),
        },
    };
    Ok(log::Filter { stdout, stderr, since: time("since")?, until: time("until")?, tail })
}

/// `GET /containers/{id}/logs?stdout=1&stderr=1&follow=1&tail=N&since=T&until=T&timestamps=1`:
/// the log's lines (see [`log`]), then, with `follow`, the output of the current run as it
/// comes (until `until`, if given, has passed).
pub async fn logs(rt: &Runtime, id: &str, t: &Target) -> Response<ApiBody> {
    let c = match rt.get(id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let filter = match log_filter(t) {
        Ok(f) => f,
        Err(m) => return error(400, &m),
    };
    if c.log_discarded() {
        return error(501, &format!("configured logging driver does not support reading: container {} logs with the none driver", c.name()));
    }
    let (follow, stamps) = (t.flag("follow"), t.flag("timestamps"));
    let (len, live) = if follow { c.follow_log() } else { (u64::MAX, None) };
    let records = filter.apply(c.log_records(len));
    let tty = c.spec.tty;
    let ct = if tty { "application/vnd.docker.raw-stream" } else { "application/vnd.docker.multiplexed-stream" };
    let (resp, tx) = stream(StatusCode::OK, ct);
    let enc = move |s: u8, d: &[u8], at: std::time::SystemTime| {
        let mut line = if stamps { format!("{} ", log::timestamp(at)).into_bytes() } else { Vec::new() };
        line.extend_from_slice(d);
        if tty {
            Bytes::from(line)
        } else {
            Bytes::from(frame(s, &line))
        }
    };
    tokio::spawn(async move {
        for r in records {
            if tx.send(enc(r.stream, &r.line, r.time)).await.is_err() {
                return;
            }
        }
        let Some(mut rx) = live else { return };
        loop {
            let next = match filter.until {
                Some(u) => {
                    let left = u.duration_since(std::time::SystemTime::now()).unwrap_or_default();
                    match tokio::time::timeout(left, rx.recv()).await {
                        Ok(n) => n,
                        Err(_) => return,
                    }
                }
                None => rx.recv().await,
            };
            let Some((s, d)) = next else { return };
            let now = std::time::SystemTime::now();
            // The live output is split into lines as the log keeps it.
            for line in d.split_inclusive(|&b| b == b'\n') {
                if filter.keeps(s, now) && tx.send(enc(s, line, now)).await.is_err() {
                    return;
                }
            }
        }
    });
    resp
}

/// Writes a process's output to a hijacked connection as it comes: raw with a terminal,
/// multiplexed without, leaving out the streams not asked for. Returns when the output
/// ends or the client has gone.
pub(super) async fn pump_output(
    out: &mut mpsc::UnboundedReceiver<(u8, Bytes)>,
    wr: &mut (impl tokio::io::AsyncWrite + Unpin),
    tty: bool,
    want_out: bool,
    want_err: bool,
) {
    while let Some((s, data)) = out.recv().await {
        if (s == crate::runtime::STDOUT && !want_out) || (s == crate::runtime::STDERR && !want_err) {
            continue;
        }
        let bytes = if tty { data.to_vec() } else { frame(s, &data) };
        if wr.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(q: &str) -> Target {
        Target::from_parts("/containers/x/logs", Some(q))
    }

    #[test]
    fn log_parameters_are_checked() {
        let f = log_filter(&target("stdout=1&tail=2&since=1700000000&until=0")).unwrap();
        assert!(f.stdout && !f.stderr);
        assert_eq!((f.tail, f.until), (Some(2), None));
        assert!(f.since.is_some());
        assert_eq!(log_filter(&target("stderr=1&tail=all")).unwrap().tail, None);
        assert_eq!(log_filter(&target("stderr=1&tail=-1")).unwrap().tail, None);
        assert!(log_filter(&target("tail=1")).unwrap_err().contains("stream"));
        assert!(log_filter(&target("stdout=1&tail=x")).unwrap_err().contains("tail"));
        assert!(log_filter(&target("stdout=1&since=yesterday")).unwrap_err().contains("since"));
    }

    proptest::proptest! {
        #[test]
        fn random_log_queries_never_panic(q in "[a-z=&0-9.:TZ-]{0,60}") {
            let _ = log_filter(&target(&q));
        }
    }
}
