"""``ssp``: stale-synchronous parallel, ``asp`` with a bound on staleness.

The parameter server and the shard rule are ``asp``'s (gradients applied at once); what SSP
adds is the bound: a worker at clock ``c`` goes on only when every worker has pushed
iteration ``c - staleness`` (the shard holds its answer back until then).
"""

from __future__ import annotations

from dataclasses import dataclass

from dssync.strategies.asp import ASPStrategy
from dssync.strategies.base import StrategyContext

__all__ = ["SSPStrategy"]


class SSPStrategy(ASPStrategy):
    name = "ssp"
    compared = False

    @dataclass(frozen=True, kw_only=True)
    class Config(ASPStrategy.Config):
        staleness: int = 3
        """A worker at clock c waits until every worker has pushed iteration c - staleness."""

        def __post_init__(self) -> None:
            if self.staleness < 0:
                raise ValueError(f"staleness must be 0 or more, got {self.staleness}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self.staleness = self.config.staleness
