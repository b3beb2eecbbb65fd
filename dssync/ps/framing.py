"""The parameter server's wire: one TCP connection per (worker, shard) pair, a fixed binary
header and the raw float32 bytes, written from and read into the tensors' own memory; the
job secret that admits a job's own workers and refuses strangers; the shards' bounds.

Shared by the server (``dssync.ps.server``), partial synchronization
(``dssync.ps.partial``) and SpecSync's scheduler (``dssync.ps.speculation``)."""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import os
import secrets
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from dssync.collectives import Communicator
from dssync.errors import CommunicationError

__all__ = ["HEADER", "Op", "accept_each", "connect", "job_secret", "local_address", "recv_exact", "recv_header",
           "refuse", "shard_bounds"]

#: Every message's header: op, worker, clock, version, payload bytes; the payload follows.
HEADER = struct.Struct("!BHqqQ")


class Op(enum.IntEnum):
    """The first byte of every message between the parameter servers and their workers."""

    PUSHPULL = 1
    """A gradient in; the shard's parameters back (``REPLY``), or ``FAIL``."""
    PULL = 2
    """The shard's parameters back, no gradient."""
    REPLY = 3
    """The server's answer: the shard's parameters and their version."""
    STOP = 4
    """The worker is done with this shard."""
    FAIL = 5
    """The server's error text, instead of a reply."""
    IDLE = 6
    """Partial synchronization: the worker leaves the rounds for a while (a collective elsewhere)."""
    ACTIVE = 7
    """Partial synchronization: the worker is back in the rounds."""


def shard_bounds(numel: int, shards: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``shards`` contiguous, near-equal shards of ``numel``."""
    cuts = np.linspace(0, numel, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``ConnectionError`` if the peer closes first."""
    while view.nbytes:
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionError("connection closed")
        view = view[got:]


def recv_header(sock: socket.socket) -> tuple[int, int, int, int, int]:
    """The next ``HEADER``: op, worker, clock, version, payload bytes."""
    buf = bytearray(HEADER.size)
    recv_exact(sock, memoryview(buf))
    return HEADER.unpack(buf)


def local_address() -> str:
    """This host's address on the path to the job's master (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


#: Seconds a new connection has to prove it belongs to the job before it is dropped.
HANDSHAKE_S = 10.0
_NONCE = 16


def job_secret(comm: Communicator) -> bytes:
    """32 random bytes of rank 0's, shared over the job's own rendezvous (collective): what a
    connection to one of the job's servers must prove it holds (``accept_each``)."""
    return comm.allgather_object(secrets.token_bytes(32))[0]


def _proof(secret: bytes, nonce: bytes, worker: int) -> bytes:
    return hmac.new(secret, b"dssync-job" + nonce + struct.pack("!H", worker), hashlib.sha256).digest()


def _admit(conn: socket.socket, secret: bytes, count: int) -> int | str | None:
    """The server's half of the handshake: a fresh nonce out, ``(worker, HMAC(secret, nonce,
    worker))`` back within ``HANDSHAKE_S``. Returns the worker, or why the peer was refused,
    or ``None`` when it closed the connection before sending a byte: a worker whose process
    died while it connected, which its own side and its peers report (a second line here
    would only blur that error), and which moved nothing."""
    nonce = secrets.token_bytes(_NONCE)
    buf = bytearray(2 + 32)
    try:
        conn.settimeout(HANDSHAKE_S)
        conn.sendall(nonce)
        if conn.recv_into(memoryview(buf)[:1]) == 0:
            return None
    except ConnectionError:  # reset (or the nonce refused) before a byte came back
        return None
    except OSError as exc:
        return f"no credentials ({exc or 'timed out'})"
    try:
        recv_exact(conn, memoryview(buf)[1:])
    except OSError as exc:  # ConnectionError included: it closed partway
        return f"no credentials ({exc or 'timed out'})"
    (worker,) = struct.unpack("!H", buf[:2])
    if not hmac.compare_digest(bytes(buf[2:]), _proof(secret, nonce, worker)):
        return "wrong credentials"
    if worker >= count:
        return f"worker {worker} out of range 0..{count - 1}"
    conn.sendall(b"\x01")
    conn.settimeout(None)
    return worker


def refuse(conn: socket.socket, who: str, why: str) -> None:
    """Close a connection that is not the job's (or broke its framing) and say so on stderr."""
    peer = "a peer"
    with contextlib.suppress(OSError):
        host, port = conn.getpeername()[:2]
        peer = f"{host}:{port}"
    print(f"dssync: {who}: dropped a connection from {peer}: {why}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        conn.close()


def accept_each(listener: socket.socket, count: int, serve: Callable[[socket.socket], None], name: str,
                threads: list[threading.Thread], *, secret: bytes) -> None:
    """Accept connections on ``listener`` until ``count`` of them have proven they hold the
    job's ``secret`` (a challenge and an HMAC, before any byte of a model moves), each served by
    ``serve`` from a daemon thread of its own added to ``threads``; then close the listener.
    A connection that fails the handshake is dropped and logged (one closed before it sent a
    byte only dropped: ``_admit``), and takes no worker's place.
    Stops early when the listener times out or is closed."""
    admitted = 0
    lock = threading.Lock()
    full = threading.Event()

    def handle(conn: socket.socket) -> None:
        nonlocal admitted
        worker = _admit(conn, secret, count)
        if worker is None:
            with contextlib.suppress(OSError):
                conn.close()
            return
        if isinstance(worker, str):
            refuse(conn, name, worker)
            return
        with lock:
            admitted += 1
            if admitted == count:
                full.set()
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept below
        try:
            serve(conn)
        except (ConnectionError, OSError):
            pass  # the peer vanished mid-frame (its process died): its own side, or its peers, report it
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    while not full.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = threading.Thread(target=handle, args=(conn,), name=name, daemon=True)
        t.start()
        threads.append(t)
    listener.close()


def connect(addr: tuple[str, int], timeout_s: float, what: str, *, secret: bytes, worker: int) -> socket.socket:
    """A TCP_NODELAY connection to ``addr`` that has proven it is ``worker`` of the job that holds
    ``secret`` (``accept_each``), retried while the peer is not listening yet; after
    ``timeout_s`` a ``CommunicationError`` names ``what`` could not be reached."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection(addr, timeout=timeout_s)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CommunicationError(f"{what} at {addr[0]}:{addr[1]}: {exc}") from None
            time.sleep(0.05)
    try:
        nonce = bytearray(_NONCE)
        recv_exact(sock, memoryview(nonce))
        sock.sendall(struct.pack("!H", worker) + _proof(secret, bytes(nonce), worker))
        ack = bytearray(1)
        recv_exact(sock, memoryview(ack))
    except (OSError, ConnectionError) as exc:
        sock.close()
        raise CommunicationError(f"{what} at {addr[0]}:{addr[1]}: the handshake failed ({exc}); is it this "
                                 "job's server?") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
