# SPDX-License-Identifier: Apache-2.0
"""Terminals for containers on a target (`docker run -t` / `-it`), with the stock docker CLI.

The same world as test_containers.py (its `env` fixture: a target with the Docker API on
loopback and a loopback docker-registry holding the busybox image). With `-t` the
container gets a pseudo-terminal: its output is one raw stream (no multiplexed frame
headers, newlines as the terminal writes them, `\\r\\n`), the window size follows the
client's terminal (the create request's ConsoleSize, then `resize`), and with `-i` what
the user types reaches it through the terminal's line discipline (echo, ^D as end of
input). The interactive cases run the CLI itself on a pseudo-terminal made here, as a
user's shell would.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import threading
import time

import pytest

from test_containers import DOCKER, Env, env  # noqa: F401  (env is the module's fixture)


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The docker CLI run on a pseudo-terminal of `rows` x `cols`, as from a shell."""

    def __init__(self, env: Env, args: list[str], rows: int, cols: int):
        self.master, slave = pty.openpty()
        _set_size(slave, rows, cols)
        self.proc = subprocess.Popen([DOCKER, *args], stdin=slave, stdout=slave, stderr=slave, env=env.env, start_new_session=True)
        os.close(slave)
        self.out = b""

    def _read(self, timeout: float) -> bool:
        """Reads what is there within `timeout`; False at end of output."""
        r, _, _ = select.select([self.master], [], [], timeout)
        if not r:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError as e:  # EIO: the CLI, the terminal's last user, is gone
            if e.errno != errno.EIO:
                raise
            data = b""
        self.out += data
        return bool(data)

    def expect(self, text: bytes, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while text not in self.out:
            assert time.time() < deadline, f"no {text!r} within {timeout}s; the terminal shows {self.out!r}"
            if not self._read(0.2):
                assert text in self.out, f"the CLI ended without {text!r}; the terminal shows {self.out!r}"

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        # The CLI is not this terminal's session leader, so the kernel's SIGWINCH has no
        # one to go to: send it as a terminal emulator's shell would deliver it.
        _set_size(self.master, rows, cols)
        self.proc.send_signal(signal.SIGWINCH)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.time() + timeout
        while self._read(0.2) or self.proc.poll() is None:
            assert time.time() < deadline, f"the CLI did not end within {timeout}s; the terminal shows {self.out!r}"
        return self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def raw(env: Env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """docker with its output as bytes (text mode would turn the terminal's \\r\\n into \\n)."""
    return subprocess.run([DOCKER, *args], capture_output=True, env=env.env, timeout=timeout)


@pytest.fixture
def terminal(env):
    made: list[Terminal] = []

    def run(args: list[str], rows: int = 24, cols: int = 80, via: Env | None = None) -> Terminal:
        t = Terminal(via or env, args, rows, cols)
        made.append(t)
        return t

    yield run
    for t in made:
        t.close()


@pytest.fixture
def names(env):
    """Names of containers a test makes, removed afterwards whatever happened."""
    made: list[str] = []
    yield made
    for n in made:
        env.docker("rm", "-f", n)


def test_t_gives_the_container_a_terminal_and_without_t_none(env):
    env.ok("pull", env.image)
    out = env.ok("run", "-t", "--rm", env.image, "sh", "-c", "test -t 1 && echo tty-yes")
    assert "tty-yes" in out
    p = env.docker("run", "--rm", env.image, "sh", "-c", "test -t 1 && echo tty-yes")
    assert p.returncode == 1 and p.stdout == "", (p.returncode, p.stdout)
    # One raw stream: standard error comes out of the terminal too, with the terminal's
    # \r\n, and no frame header (stream byte, three zeros, length) is mixed in.
    p = raw(env, "run", "-t", "--rm", env.image, "sh", "-c", "echo out; echo err >&2; exit 7")
    assert p.returncode == 7
    assert p.stdout == b"out\r\nerr\r\n" and p.stderr == b"", (p.stdout, p.stderr)
    # Without -t the two streams stay apart.
    p = env.docker("run", "--rm", env.image, "sh", "-c", "echo out; echo err >&2")
    assert (p.stdout, p.stderr) == ("out\n", "err\n")


def test_inspect_and_logs_of_a_tty_container(env, names):
    names += ["tty-logs", "plain-logs"]
    env.ok("run", "-d", "-t", "--name", "tty-logs", env.image, "sh", "-c", "echo one; echo two >&2; tty")
    env.ok("run", "-d", "--name", "plain-logs", env.image, "sh", "-c", "echo one; echo two >&2")
    assert env.ok("wait", "tty-logs").strip() == "0" and env.ok("wait", "plain-logs").strip() == "0"
    doc = json.loads(env.ok("inspect", "tty-logs"))[0]
    assert doc["Config"]["Tty"] is True and json.loads(env.ok("inspect", "plain-logs"))[0]["Config"]["Tty"] is False
    # Raw, as the terminal wrote it; the container's terminal is its own /dev/pts/0.
    p = raw(env, "logs", "tty-logs")
    assert p.returncode == 0 and p.stdout == b"one\r\ntwo\r\n/dev/pts/0\r\n" and p.stderr == b"", (p.stdout, p.stderr)
    p = env.docker("logs", "plain-logs")
    assert (p.stdout, p.stderr) == ("one\n", "two\n")


def test_initial_size_and_resize_through_the_api(env, names):
    env.ok("pull", env.image)
    # The create request's ConsoleSize sizes the terminal before the process runs.
    body = {"Image": env.image, "Cmd": ["stty", "size"], "Tty": True, "HostConfig": {"ConsoleSize": [33, 77]}}
    st, data = env.request("POST", "/v1.47/containers/create?name=tty-sized", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert st == 201, data
    names.append("tty-sized")
    env.ok("start", "tty-sized")
    assert env.ok("wait", "tty-sized").strip() == "0"
    assert raw(env, "logs", "tty-sized").stdout == b"33 77\r\n"
    # A resize reaches a running container's terminal (and its SIGWINCH).
    names.append("tty-resize")
    env.ok(
        "run",
        "-d",
        "-t",
        "--name",
        "tty-resize",
        env.image,
        "sh",
        "-c",
        "trap 'echo winch' WINCH; i=0; while [ \"$(stty size)\" != '25 100' ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; stty size",
    )
    st, data = env.request("POST", "/v1.47/containers/tty-resize/resize?h=25&w=100")
    assert st == 200, data
    assert env.ok("wait", "tty-resize", timeout=60).strip() == "0"
    logs = raw(env, "logs", "tty-resize").stdout
    assert logs.endswith(b"25 100\r\n") and b"winch\r\n" in logs, logs
    # Errors: a bad size, an unknown container, a TTY container that is not running;
    # a container without a terminal has nothing to resize, which is no error (as Docker).
    st, data = env.request("POST", "/v1.47/containers/tty-resize/resize?h=x&w=100")
    assert st == 400 and b"height" in data
    st, data = env.request("POST", "/v1.47/containers/tty-resize/resize?h=10&w=10")
    assert st == 409 and b"not running" in data
    st, data = env.request("POST", "/v1.47/containers/no-such-one/resize?h=10&w=10")
    assert st == 404
    names.append("plain-resize")
    env.ok("run", "-d", "--name", "plain-resize", env.image, "sleep", "30")
    st, data = env.request("POST", "/v1.47/containers/plain-resize/resize?h=10&w=10")
    assert st == 200, data


def test_stdin_without_and_with_a_terminal(env, terminal):
    env.ok("pull", env.image)
    assert env.ok("run", "-i", "--rm", env.image, "cat", input="hello\n") == "hello\n"
    # -it from a terminal: the container's terminal echoes what is typed, cat repeats
    # the line, ^D ends its input; the CLI exits with cat's code.
    t = terminal(["run", "-it", "--rm", env.image, "sh", "-c", "test -t 0 && test -t 1 && echo both-tty; exec cat"])
    t.expect(b"both-tty\r\n")
    t.send(b"hello\n")
    t.expect(b"hello\r\nhello\r\n")
    t.send(b"\x04")
    assert t.finish() == 0
    # Ctrl-C reaches the container as SIGINT through its terminal.
    t = terminal(["run", "-it", "--rm", env.image, "sh", "-c", "trap 'echo got-int; exit 3' INT; echo armed; while :; do sleep 0.1; done"])
    t.expect(b"armed")
    t.send(b"\x03")
    t.expect(b"got-int")
    assert t.finish() == 3


def test_the_terminal_follows_the_cli_window(env, terminal):
    env.ok("pull", env.image)
    t = terminal(
        [
            "run",
            "-it",
            "--rm",
            env.image,
            "sh",
            "-c",
            "i=0; while [ \"$(stty size)\" != '37 91' ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; "
            "echo size1 $(stty size); "
            "i=0; while [ \"$(stty size)\" = '37 91' ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
            "echo size2 $(stty size)",
        ],
        rows=37,
        cols=91,
    )
    t.expect(b"size1 37 91")
    # Under load the CLI may miss the first window change (its SIGWINCH watcher starts
    # after it attaches); a user would resize again, and so does the test, a few times.
    for attempt in range(5):
        t.resize(50, 132)
        try:
            t.expect(b"size2 50 132", timeout=5)
            break
        except AssertionError:
            if attempt == 4 or b"size2" in t.out:
                raise
            t.resize(37, 91)  # back, so that the next resize is a change the CLI is told of
            time.sleep(0.5)
    assert t.finish() == 0
    # Without a terminal for the CLI, `-t` still gives one, of the kernel's 0x0 (the CLI
    # has no size to send), and busybox's stty then reports LINES/COLUMNS from -e (24
    # lines when unset): a sane size either way.
    p = raw(env, "run", "-t", "--rm", "-e", "COLUMNS=120", env.image, "sh", "-c", "stty size; test -t 0 || echo no-stdin-tty")
    assert p.returncode == 0 and p.stdout == b"24 120\r\n", p.stdout


def _running(env: Env, name: str) -> bool:
    return name in env.ok("ps", "--format", "{{.Names}}").split()


def _forward(a: socket.socket, b: socket.socket) -> None:
    """Copies a to b, passing on the end of a's data as a half close."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def unix_env(env):
    """The same world reached through a unix socket, as a local docker daemon is.

    The docker CLI recognizes its own detach sequence only there: over tcp:// (v28) it
    copies the terminal to the connection with the socket's ReadFrom, which wraps the
    escape error so that the CLI takes the detach for an end of input and waits for the
    container to exit. A forwarder here passes the unix socket's connections to the
    target's TCP API unchanged.
    """
    d = tempfile.mkdtemp(prefix="insitu-dock-")
    path = os.path.join(d, "docker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    host, port = env.api.rsplit(":", 1)

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_forward, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    local = copy.copy(env)
    local.env = {**env.env, "DOCKER_HOST": f"unix://{path}"}
    yield local
    listener.close()
    shutil.rmtree(d, ignore_errors=True)


def test_detach_keys_leave_the_container_running_and_attach_comes_back(unix_env, terminal, names):
    env = unix_env
    env.ok("pull", env.image)
    names.append("tty-detach")
    t = terminal(["run", "-it", "--name", "tty-detach", env.image, "sh"], via=env)
    t.send(b"echo first-$((40+2))\n")
    t.expect(b"first-42")
    # ctrl-p ctrl-q: the CLI detaches (exit 0, as with Docker); the shell runs on.
    t.send(b"\x10\x11")
    assert t.finish() == 0, t.out
    assert _running(env, "tty-detach")
    # `docker attach` takes the terminal up again: the same shell, its input kept.
    t = terminal(["attach", "tty-detach"], via=env)
    time.sleep(0.5)  # the attach is under way before the typing starts
    t.send(b"echo hi-$((1+1))\n")
    t.expect(b"hi-2")
    # A lone ctrl-p is not the sequence: it reaches the program, in its place.
    t.send(b"od -An -c\n")
    time.sleep(0.5)
    t.send(b"x\x10y\n\x04")
    t.expect(b"x 020   y")
    t.send(b"exit 5\n")
    assert t.finish() == 5, t.out
    assert not _running(env, "tty-detach")


def test_custom_detach_keys(unix_env, terminal, names):
    env = unix_env
    env.ok("pull", env.image)
    names.append("tty-detach-keys")
    t = terminal(["run", "-it", "--detach-keys", "ctrl-a,a", "--name", "tty-detach-keys", env.image, "sh"], via=env)
    t.send(b"echo ready-$((3*3))\n")
    t.expect(b"ready-9")
    # ctrl-p ctrl-q is nothing special now: the program reads both (its terminal's
    # flow control off, so that ctrl-q is not taken for XON); ctrl-a then a detaches.
    t.send(b"stty -ixon; od -An -c\n")
    time.sleep(0.5)
    t.send(b"\x10\x11\n\x04")
    t.expect(b"020 021")
    t.send(b"\x01a")
    assert t.finish() == 0, t.out
    assert _running(env, "tty-detach-keys")
    t = terminal(["attach", "--detach-keys", "ctrl-a,a", "tty-detach-keys"], via=env)
    time.sleep(0.5)
    t.send(b"echo back-$((5+5))\n")
    t.expect(b"back-10")
    # `docker attach` reports the detach as Docker's does ("read escape sequence", 1).
    t.send(b"\x01a")
    assert t.finish() == 1 and b"read escape sequence" in t.out, t.out
    assert _running(env, "tty-detach-keys")
    env.ok("rm", "-f", "tty-detach-keys")


def _hijack(env: Env, path: str) -> tuple[socket.socket, bytes]:
    """A raw attach: the 101 response's head, and the socket carrying the stream."""
    host, port = env.api.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        assert chunk, head
        head += chunk
    return s, head


def _read_until(s: socket.socket, text: bytes, timeout: float = 30) -> bytes:
    got = b""
    deadline = time.time() + timeout
    while text not in got:
        assert time.time() < deadline, f"no {text!r}: got {got!r}"
        chunk = s.recv(65536)
        assert chunk, f"the stream ended without {text!r}: got {got!r}"
        got += chunk
    return got


def test_the_server_watches_for_detach_keys(env, names):
    """An API client gets the detach from the server (the docker CLI also watches on its side)."""
    env.ok("pull", env.image)
    names.append("tty-detach-api")
    env.ok("create", "-it", "--name", "tty-detach-api", env.image, "sh")
    env.ok("start", "tty-detach-api")
    s, head = _hijack(env, "/v1.47/containers/tty-detach-api/attach?stream=1&stdin=1&stdout=1&stderr=1")
    assert head.startswith(b"HTTP/1.1 101"), head
    # A partial sequence then another byte reaches the shell; split over two writes, the
    # whole sequence detaches, is swallowed, and the server closes the stream.
    s.sendall(b"od -An -c\n")
    time.sleep(0.5)
    s.sendall(b"a\x10b\n\x04")
    _read_until(s, b"a 020   b")
    s.sendall(b"echo pre-$((6*7))\n\x10")
    _read_until(s, b"pre-42")
    time.sleep(0.2)
    s.sendall(b"\x11")
    s.settimeout(30)
    while s.recv(65536):
        pass
    s.close()
    assert _running(env, "tty-detach-api")
    # A custom sequence, and what the shell saw: the detach keys never reached it.
    s, head = _hijack(env, "/v1.47/containers/tty-detach-api/attach?stream=1&stdin=1&stdout=1&detachKeys=ctrl-a%2Ca")
    assert head.startswith(b"HTTP/1.1 101"), head
    s.sendall(b"echo again-$((2+3))\n")
    _read_until(s, b"again-5")
    s.sendall(b"\x01a")
    while s.recv(65536):
        pass
    s.close()
    assert _running(env, "tty-detach-api")
    # A bad spec is refused with a message that says what is accepted.
    st, data = env.request("POST", "/v1.47/containers/tty-detach-api/attach?stream=1&stdin=1&detachKeys=ctrl-P")
    assert st == 400 and b"invalid detach keys" in data and b"ctrl-p,ctrl-q" in data, (st, data)
    env.ok("rm", "-f", "tty-detach-api")


def test_exec_it_gives_a_shell_a_terminal_of_the_clients_size(env, terminal, names):
    names.append("exec-it")
    env.ok("run", "-d", "--name", "exec-it", env.image, "sleep", "300")
    t = terminal(["exec", "-it", "exec-it", "sh"], rows=33, cols=101)
    t.expect(b"# ")
    t.send(b"stty size; tty; echo $((6 * 7))\r")
    t.expect(b"33 101")
    t.expect(b"/dev/pts/")
    t.expect(b"42")
    t.resize(40, 120)
    t.send(b"stty size\r")
    t.expect(b"40 120")
    t.send(b"exit 3\r")
    assert t.finish() == 3
    # The container runs on; the shell's process is gone from it.
    ps = env.ok("top", "exec-it")
    assert "sleep" in ps and " sh" not in ps, ps
