"""One rank of a collective-oracle job, started by torchrun, mpirun or horovodrun.

Every rank runs the ops a strategy uses, on the backend named by ``--backend``, and checks
each result against the value computed locally from the seeded inputs of all ranks (the
oracle). A mismatch raises, so the launcher exits non-zero; each rank writes what it
checked to ``OUT/rank<r>.json``.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from dssync.launch import from_environ, run_ranks

NUMEL = 1000


def seeded(rank: int) -> torch.Tensor:
    return torch.arange(NUMEL, dtype=torch.float32) * (rank + 1) + rank


def job(comm, out: str, backend: str) -> None:
    n, r = comm.world_size, comm.rank
    assert n == 4, f"this job checks a world of 4 ranks, got {n}"
    pairs_a, pairs_b = [(0, 1), (2, 3)], [(0, 2), (1, 3)]
    comm.register_groups([*pairs_a, *pairs_b, (0, 1, 2, 3)])
    checks = []

    # Disjoint groups at once, as a DS-Sync round: sum, then average.
    for pairs, average in ((pairs_a, False), (pairs_b, True)):
        mine = next(g for g in pairs if r in g)
        t = seeded(r)
        work = comm.allreduce_async_(t, mine, average=average)
        work.wait()
        want = sum(seeded(q) for q in mine) / (len(mine) if average else 1)
        torch.testing.assert_close(t, want)
        checks.append(f"allreduce {'average' if average else 'sum'} on {list(mine)}")

    t = seeded(r)
    comm.allreduce_(t, None, average=True)
    torch.testing.assert_close(t, sum(seeded(q) for q in range(n)) / n)
    checks.append("allreduce average on the world")

    group = (1, 3) if r in (1, 3) else (0, 2)
    t = seeded(r)
    comm.broadcast_(t, src=group[1], group=group)
    torch.testing.assert_close(t, seeded(group[1]))
    checks.append(f"broadcast from {group[1]} on {list(group)}")

    t = seeded(r)
    comm.broadcast_(t, src=2)
    torch.testing.assert_close(t, seeded(2))
    checks.append("broadcast from 2 on the world")

    t = seeded(r)
    comm.reduce_(t, dst=0)
    if r == 0:
        torch.testing.assert_close(t, sum(seeded(q) for q in range(n)))
    checks.append("reduce to 0 on the world")

    recv = torch.empty(NUMEL)
    comm.sendrecv_(seeded(r), (r + 1) % n, recv, (r - 1) % n)
    torch.testing.assert_close(recv, seeded((r - 1) % n))
    checks.append("sendrecv around the ring")

    # Non-blocking point to point, both ways around the ring at once on two tags, the
    # receives posted before the sends and waited in reverse (the probe's pattern).
    right, left = (r + 1) % n, (r - 1) % n
    into = [torch.empty(NUMEL) for _ in range(4)]
    recvs = [comm.irecv(into[0], left, tag=1), comm.irecv(into[1], left, tag=1),
             comm.irecv(into[2], right, tag=2), comm.irecv(into[3][:NUMEL // 2], right, tag=2)]
    sends = [comm.isend(seeded(r), right, tag=1), comm.isend(seeded(r) * 2, right, tag=1),
             comm.isend(seeded(r) + 1, left, tag=2), comm.isend(seeded(r)[: NUMEL // 2], left, tag=2)]
    for w in [*reversed(recvs), *sends]:
        w.wait()
    wants = [seeded(left), seeded(left) * 2, seeded(right) + 1, seeded(right)[: NUMEL // 2]]
    for got, want in zip(into, wants, strict=True):
        torch.testing.assert_close(got[: want.numel()], want)
    checks.append("isend/irecv both ways around the ring")

    got = comm.allgather_object({"rank": r, "text": "x" * r})
    assert got == [{"rank": q, "text": "x" * q} for q in range(n)], got
    checks.append("allgather_object")

    comm.barrier()
    env = from_environ()
    Path(out, f"rank{r}.json").write_text(json.dumps({
        "rank": r, "world_size": n, "backend": backend, "launcher": env.launcher, "checks": checks}))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    run_ranks(job, args.out, args.backend, nproc=None, timeout_s=60, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
