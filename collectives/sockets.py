"""Point-to-point messages over TCP between the ranks of a world, for a collective library
that has none (Horovod: collectives over process sets only).

Each rank listens on the address of the interface the library itself uses
(``HOROVOD_GLOO_IFACE``, else ``GLOO_SOCKET_IFNAME``; loopback when neither is set and every
rank is on this host), the addresses are exchanged once with the library's own allgather,
and a rank opens one connection to each peer it sends to, the first time it does. A message
is a frame (tag, length, bytes). A receive reads from its sender's connection in the
waiting thread itself (one reader per connection at a time; a frame for another receive is
filed under its sender and tag on the way), so a message costs no hand-off between threads,
and the ``k``-th receive posted for a (sender, tag) takes the ``k``-th message that arrived
for it, so messages between two ranks on one tag arrive in order, as with
``torch.distributed`` or MPI. Sends to one peer go out in the order they were posted, from
a thread of their own, so ``isend`` does not block. Every wait has the timeout and names
both ranks and the tag; a peer whose connection closed is named as such.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from dssync.errors import BackendUnavailableError, CommunicationError

__all__ = ["SocketMesh", "interface_address"]

_FRAME = struct.Struct("!iQ")  # tag, payload bytes
_HELLO = struct.Struct("!i")  # the connecting rank


def interface_address(ifname: str) -> str:
    """The first IPv4 address of ``ifname`` (``ip -j addr show dev IFNAME``)."""
    try:
        proc = subprocess.run(["ip", "-j", "addr", "show", "dev", ifname],
                              capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        raise BackendUnavailableError(
            "finding this rank's address needs the ip program; install iproute2"
        ) from None
    try:
        for link in json.loads(proc.stdout or "[]"):
            for info in link.get("addr_info", []):
                if info.get("family") == "inet":
                    return str(info["local"])
    except (json.JSONDecodeError, AttributeError, KeyError):
        pass
    raise CommunicationError(
        f"no IPv4 address on interface {ifname!r} (GLOO_SOCKET_IFNAME); set it to the interface "
        f"the ranks talk over: {(proc.stderr.strip().splitlines() or ['no address'])[0]}"
    )


def _address(ifname: str | None, hosts_differ: bool) -> str:
    if ifname:
        return interface_address(ifname)
    if hosts_differ:
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False when the peer closed first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


class _Send:
    def __init__(self, future: Future, describe: str, timeout_s: float) -> None:
        self._future, self._describe, self._timeout_s = future, describe, timeout_s

    def wait(self) -> None:
        try:
            self._future.result(timeout=self._timeout_s)
        except FutureTimeout:
            raise CommunicationError(f"{self._describe} timed out") from None
        except OSError as exc:
            raise CommunicationError(f"{self._describe} failed: {exc}") from None


class _Recv:
    def __init__(self, mesh: SocketMesh, key: tuple[int, int], index: int, tensor: torch.Tensor,
                 describe: str) -> None:
        self._mesh, self._key, self._index, self._tensor, self._describe = mesh, key, index, tensor, describe

    def wait(self) -> None:
        data = self._mesh.next_message(self._key, self._index, self._describe)
        flat = self._tensor.view(-1).view(torch.uint8)
        if len(data) > flat.numel():
            raise CommunicationError(f"{self._describe}: a message of {len(data)} bytes does not fit "
                                     f"the {flat.numel()}-byte buffer posted for it")
        if data:
            flat[: len(data)].copy_(torch.frombuffer(data, dtype=torch.uint8))


class SocketMesh:
    """TCP point-to-point between the ranks; built collectively (every rank constructs one,
    with the library's allgather), used by ``isend``/``irecv``."""

    def __init__(self, rank: int, world_size: int, allgather_object: Callable[[Any], list[Any]],
                 timeout_s: float, ifname: str | None = None) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        ifname = ifname if ifname is not None else (os.environ.get("HOROVOD_GLOO_IFACE")
                                                    or os.environ.get("GLOO_SOCKET_IFNAME"))
        hosts = allgather_object(socket.gethostname())
        addr = _address(ifname, len(set(hosts)) > 1)
        self._listener = socket.create_server((addr, 0), backlog=max(8, world_size))
        self.peers: list[tuple[str, int]] = allgather_object((addr, self._listener.getsockname()[1]))
        self.cond = threading.Condition()
        self.inbox: dict[tuple[int, int], dict[int, bytearray]] = defaultdict(dict)
        self._arrived: dict[tuple[int, int], int] = defaultdict(int)
        self._posted: dict[tuple[int, int], int] = defaultdict(int)
        self._in: dict[int, socket.socket] = {}  # sender -> its connection to this rank
        self._in_lock: dict[int, threading.Lock] = {}  # one reader at a time per connection
        self._out: dict[int, tuple[socket.socket, ThreadPoolExecutor]] = {}
        self._out_lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"dssync-p2p-accept-{rank}").start()

    # -- receiving -----------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = bytearray(_HELLO.size)
            if not _recv_exact(sock, memoryview(hello)):
                continue
            (src,) = _HELLO.unpack(hello)
            with self.cond:
                self._in[src] = sock
                self._in_lock.setdefault(src, threading.Lock())
                self.cond.notify_all()

    def next_message(self, key: tuple[int, int], index: int, describe: str) -> bytearray:
        """The ``index``-th message from ``key`` = (sender, tag): read from the sender's
        connection in the calling thread (messages for other receives are filed on the way),
        so a message costs no hand-off between threads."""
        src = key[0]
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            if not self.cond.wait_for(lambda: src in self._in or index in self.inbox[key],
                                      timeout=self.timeout_s):
                raise CommunicationError(f"{describe}: timed out (no connection from rank {src})")
            if index in self.inbox[key]:
                return self.inbox[key].pop(index)
            sock, lock = self._in[src], self._in_lock[src]
        head = bytearray(_FRAME.size)
        while True:
            with self.cond:
                if index in self.inbox[key]:
                    return self.inbox[key].pop(index)
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise CommunicationError(f"{describe}: timed out")
            try:
                with self.cond:  # filed by another reader while this one waited for the lock
                    if index in self.inbox[key]:
                        return self.inbox[key].pop(index)
                sock.settimeout(max(1e-3, deadline - time.monotonic()))
                closed = f"{describe}: the connection closed before the message came"
                try:
                    whole = _recv_exact(sock, memoryview(head))
                    if whole:
                        tag, size = _FRAME.unpack(head)
                        data = bytearray(size)
                        whole = _recv_exact(sock, memoryview(data))
                except TimeoutError:
                    raise CommunicationError(f"{describe}: timed out") from None
                except OSError as exc:
                    raise CommunicationError(f"{closed} ({exc})") from None
                if not whole:
                    raise CommunicationError(closed)
                with self.cond:
                    got = (src, tag)
                    self.inbox[got][self._arrived[got]] = data
                    self._arrived[got] += 1
                    self.cond.notify_all()
            finally:
                lock.release()

    def irecv(self, tensor: torch.Tensor, src: int, tag: int, describe: str) -> _Recv:
        with self.cond:
            key = (src, tag)
            index = self._posted[key]
            self._posted[key] += 1
        return _Recv(self, key, index, tensor, describe)

    # -- sending -------------------------------------------------------------------------
    def _connection(self, dst: int, describe: str) -> tuple[socket.socket, ThreadPoolExecutor]:
        with self._out_lock:
            if dst not in self._out:
                try:
                    sock = socket.create_connection(self.peers[dst], timeout=self.timeout_s)
                except OSError as exc:
                    raise CommunicationError(f"{describe}: could not connect to {self.peers[dst]}: {exc}") from None
                sock.settimeout(self.timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(_HELLO.pack(self.rank))
                self._out[dst] = (sock, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dssync-p2p-{dst}"))
            return self._out[dst]

    def isend(self, tensor: torch.Tensor, dst: int, tag: int, describe: str) -> _Send:
        sock, sender = self._connection(dst, describe)
        data = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy()

        def send() -> None:
            sock.sendall(_FRAME.pack(tag, data.nbytes))
            sock.sendall(data)

        return _Send(sender.submit(send), describe, self.timeout_s)

    def close(self) -> None:
        self._listener.close()
        with self.cond:
            for sock in self._in.values():
                sock.close()
            self._in.clear()
        with self._out_lock:
            for sock, sender in self._out.values():
                sender.shutdown(wait=False)
                sock.close()
            self._out.clear()
