"""Infer racks and classify contention from measured latency and bandwidth matrices.

Pure functions on plain arrays (numpy, scipy; no torch), so they are tested exhaustively on
synthetic matrices. ``dssync probe`` feeds them what it measured; the planner consumes
their result through ``topology.json`` (the two contention kinds are
the paper's Fig. 5, a slow rack uplink, and Fig. 6, a slow end-host NIC).

This module is the public entry point and holds no code of its own: ``matrices`` has the
shared matrix helpers and thresholds, ``racks`` fits racks (``fit_racks``, ``infer_racks``),
``placement`` has ``RackFit`` and places the blind ranks, and ``contention`` classifies
contention (``classify_contention``). Every name is importable from here as before.
"""

from __future__ import annotations

from dssync.topology.contention import (  # noqa: F401 (re-exported)
    _nic_estimates,
    classify_contention,
    fan_clears,
    nic_suspects,
    slow_keys,
)
from dssync.topology.matrices import (  # noqa: F401 (re-exported)
    CONFIDENT_MARGIN,
    CROSS_RATIO,
    DEFAULT_RACK_GAP,
    DEFAULT_SLOW_RATIO,
    DELAY_RATIO,
    FAN_RATIO,
    SHARP_RATIO,
    WAIT_RATIO,
    _bandwidth_cost,
    _loaded,
    _nearest,
    _ratio_to_nearest,
    _slow_ends,
    _square,
    clear_latency,
    queued_ranks,
    renumber_racks,
)
from dssync.topology.placement import (  # noqa: F401 (re-exported)
    RackFit,
    _place_by_latency,
    _rule_out,
    _rule_out_by_queue,
    filled,
    held,
    place_behind_standing_queue,
    place_blind,
)
from dssync.topology.racks import (  # noqa: F401 (re-exported)
    MERGE_SEARCH_GROUPS,
    _cluster,
    _evidenced,
    _far_apart,
    _fewest_racks,
    _labels,
    _margins,
    _merge_groups_by_host,
    _merge_unseparated,
    _separated,
    _with_profile,
    blind_ranks,
    fit_racks,
    infer_racks,
)

__all__ = ["DEFAULT_SLOW_RATIO", "RackFit", "blind_ranks", "classify_contention", "clear_latency", "fan_clears",
           "filled", "fit_racks", "held", "infer_racks", "nic_suspects", "place_behind_standing_queue", "place_blind", "renumber_racks", "slow_keys"]
