"""``psp``: partial synchronization on the sharded parameter server (PSP-SGD, the weak/partial synchronization paper).

Synchronous SGD on the parameter server waits for every worker's push and for every
server's block. PSP-SGD waits for neither: a shard closes its round once the first
``push_quorum`` (c) workers have pushed gradients computed on its current block (stale
ones are dropped), and a worker goes on once ``pull_fraction`` (b) of the shards have sent
it a newer block, keeping last iteration's values for the rest. ``c = k, b = 1`` is plain
synchronous SGD on the servers; ``c < k, b = 1`` is backup workers. The protocol, and the
choices the paper leaves open (the learning rate by the number aggregated ``d``, blocks,
timeouts, timestamps, delays), are in ``dssync.ps.partial``.

The loop's learning rate is the rate of a full round: a round of ``d`` pushes moves the
shard by ``lr * d / k`` times their mean gradient (the linear scaling rule). Rare, large
delays of the shards' block messages (the paper's fault model) are injected with
``delay_prob`` and ``delay_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssync.ps.partial import PartialServer
from dssync.ps.server import ShardServer
from dssync.strategies.asp import ASPStrategy

__all__ = ["PSPStrategy"]


class PSPStrategy(ASPStrategy):
    name = "psp"
    compared = False
    settled_snapshots = True  # rounds track which workers are in; evaluations leave them as a whole

    @dataclass(frozen=True, kw_only=True)
    class Config(ASPStrategy.Config):
        push_quorum: int = 0
        """c: pushes that close a shard's round (0: every worker, synchronous)."""
        pull_fraction: float = 1.0
        """b: fraction of the shards whose newer block a worker waits for."""
        tau1_s: float = 0.0
        """Extra seconds a shard waits for more pushes after the c-th (the paper's tau1; 0 there)."""
        tau2_s: float = 0.0
        """Extra seconds a worker waits for more blocks after the b-th (tau2; 0 in the paper)."""
        delay_prob: float = 0.0
        """Probability that a shard's block message to a worker is delayed by delay_s."""
        delay_s: float = 0.0
        """Seconds of an injected delay (the paper: 4 s on 0.16 % of 1024 messages an iteration)."""
        seed: int = 0
        """Seed of the delay injection (each shard draws from its own generator)."""

        def __post_init__(self) -> None:
            if self.push_quorum < 0:
                raise ValueError(f"push_quorum must be 0 (every worker) or positive, got {self.push_quorum}")
            if not 0.0 < self.pull_fraction <= 1.0:
                raise ValueError(f"pull_fraction must be in (0, 1], got {self.pull_fraction}")
            if min(self.tau1_s, self.tau2_s, self.delay_s) < 0 or not 0.0 <= self.delay_prob <= 1.0:
                raise ValueError("tau1_s, tau2_s and delay_s must be 0 or more, delay_prob in [0, 1]")

    config: Config

    def _server_lr(self, lr: float) -> float:
        return lr  # the shard divides each round's gradient sum by k itself

    def _make_server(self, settings: dict[str, float]) -> ShardServer:
        c = self.config
        return PartialServer(self.comm, self._flat, push_quorum=c.push_quorum or None,
                             pull_fraction=c.pull_fraction, tau1_s=c.tau1_s, tau2_s=c.tau2_s,
                             delay_prob=c.delay_prob, delay_s=c.delay_s, seed=c.seed, **settings)

    def stats(self) -> dict[str, object]:
        assert self.server is not None, "setup() first"
        return self.server.stats()
