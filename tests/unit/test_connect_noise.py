"""While a process group connects, gloo's retry lines on file descriptor 2 are held back and
everything else written there comes through, in order, also when the connect fails."""

from __future__ import annotations

import os

import pytest

from dssync.collectives.torch_dist import connect_noise_held

# As gloo and torch write them (the path and rank details vary by build and job).
RETRY = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/debug_logger.cc:9] ERROR failed to "
         "connect, willRetry=1, retry=1, retryLimit=3, rank=1, size=4, local=[127.0.0.1]:19179, "
         "remote=[127.0.0.1]:20918$1, error=SO_ERROR: Connection refused\n")
FULL_MESH = ("[E1130 11:51:28.882107335 ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with "
             "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer\n")
OTHER = "[W1130 11:51:28.1 socket.cpp:755] [c10d] The client socket has failed to connect\n"


def test_the_retry_lines_are_held_back_and_the_rest_comes_through(capfd):
    with connect_noise_held():
        os.write(2, (RETRY + OTHER + FULL_MESH).encode())
        os.write(2, b"a last line without its newline")
    assert capfd.readouterr().err == OTHER + "a last line without its newline"


def test_a_failed_connect_still_gives_back_stderr_and_its_error(capfd):
    with pytest.raises(RuntimeError, match="connectFullMesh"), connect_noise_held():
        os.write(2, (RETRY + OTHER).encode())
        raise RuntimeError("Gloo connectFullMesh failed")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == OTHER + "after\n"


def test_nothing_written_writes_nothing(capfd):
    with connect_noise_held():
        pass
    assert capfd.readouterr().err == ""
