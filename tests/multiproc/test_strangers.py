"""Strangers on a job server's port (``dssync.ps.framing.accept_each``, which the parameter-server
shards, the partial-sync shards and the SpecSync scheduler all listen through): real stranger
processes connect first, with nothing, garbage, an HTTP request, a forged worker header, or a
wrong secret; the job's own workers still all get in, and no stranger gets a byte but the
challenge nonce or takes a worker's place."""

import socket
import struct
import subprocess
import sys
import threading

import pytest

from dssync.errors import CommunicationError
from dssync.ps.framing import HEADER, Op, accept_each, connect

SECRET = bytes(range(32))

STRANGER = r"""
import socket, sys
kind, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=20)
print("connected", flush=True)
payload = {
    "silent": b"",
    "garbage": bytes(range(256)) * 4,
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "header": bytes.fromhex(sys.argv[3]),
}[kind]
if payload:
    s.sendall(payload)
got = b""
s.settimeout(20)
try:
    while chunk := s.recv(65536):
        got += chunk
except OSError:
    pass
print(len(got))
"""


def _server(count):
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    listener.settimeout(60)
    served, threads = [], []

    def serve(conn):
        with conn:
            buf = conn.recv(HEADER.size)
            served.append(HEADER.unpack(buf)[1])
            conn.sendall(b"model bytes")

    accept = threading.Thread(target=accept_each, args=(listener, count, serve, "test server", threads),
                              kwargs={"secret": SECRET}, daemon=True)
    accept.start()
    return listener.getsockname()[1], served, accept


def _pull_as_worker_0(port):
    """Worker 0 of the job gets in and is served."""
    sock = connect(("127.0.0.1", port), 5, "worker 0", secret=SECRET, worker=0)
    sock.sendall(HEADER.pack(Op.PULL, 0, 0, 0, 0))
    assert sock.recv(64) == b"model bytes"
    sock.close()


@pytest.mark.parametrize("kind", ["silent", "garbage", "http", "header"])
def test_a_stranger_that_connects_first_gets_nothing_and_takes_no_place(kind, capfd):
    port, served, accept = _server(count=2)
    forged = HEADER.pack(Op.PULL, 0, 0, 0, 0).hex()
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER, kind, str(port), forged],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stranger.stdout.readline().strip() == "connected"  # first in the queue
    workers = [connect(("127.0.0.1", port), 20, f"worker {w}", secret=SECRET, worker=w) for w in (0, 1)]
    for w, sock in enumerate(workers):
        sock.sendall(HEADER.pack(Op.PULL, w, 0, 0, 0))
        assert sock.recv(64) == b"model bytes"
        sock.close()
    accept.join(timeout=30)
    assert not accept.is_alive()  # both workers in: the listener is closed
    assert sorted(served) == [0, 1]
    # Read the rest through the same buffered stream: the readline above may already hold the
    # stranger's last line (on a busy host it can print both before that readline runs), and
    # communicate() reads the raw pipe, past that buffer.
    stranger.wait(timeout=60)
    out, err = stranger.stdout.read(), stranger.stderr.read()
    received = int(out or -1), err
    assert received[0] == 16, received  # the challenge nonce, then the connection is closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)  # no listener left
    assert "test server: dropped a connection from 127.0.0.1:" in capfd.readouterr().err


def test_a_wrong_secret_or_worker_out_of_range_is_refused_and_the_job_goes_on(capfd):
    port, served, accept = _server(count=1)
    with pytest.raises(CommunicationError, match="handshake failed"):
        connect(("127.0.0.1", port), 5, "an impostor", secret=b"x" * 32, worker=0)
    with pytest.raises(CommunicationError, match="handshake failed"):
        connect(("127.0.0.1", port), 5, "worker 7", secret=SECRET, worker=7)
    _pull_as_worker_0(port)
    accept.join(timeout=30)
    assert served == [0]
    err = capfd.readouterr().err
    assert "wrong credentials" in err and "worker 7 out of range 0..0" in err


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_peer_gone_before_a_word_is_dropped_without_a_line(how, capfd):
    # A worker killed while it connects: its own side and its peers report the death; the
    # server drops the connection quietly and still admits the job's workers.
    port, served, accept = _server(count=1)
    gone = socket.create_connection(("127.0.0.1", port), timeout=5)
    if how == "reset":  # an abortive close, as the kernel does for a killed process with unread data
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()
    _pull_as_worker_0(port)
    accept.join(timeout=30)
    assert served == [0]
    assert "dropped a connection" not in capfd.readouterr().err
