"""``dssync demo``: the main job on the embedded default.

Eight local ranks on a logical two-rack topology (racks of four) train the handwritten
digits task with ``allreduce`` (BSP) and with ``ds-sync``; the command prints a table of
accuracy, communication time per iteration and wall time, and plots test accuracy against
step for both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dssync._jsonfile import write_json
from dssync.strategies import AllreduceStrategy, DSSyncStrategy
from dssync.topology import Topology
from dssync.training.loop import TrainConfig, train

__all__ = ["add_parser", "run"]

STRATEGIES = (AllreduceStrategy.name, DSSyncStrategy.name)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train allreduce and ds-sync side by side on 8 local ranks")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="dssync-demo", help="where the plot and JSON go")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    topology = Topology.even(args.nproc, 2 if args.nproc > 1 else 1)
    console.print(f"dssync demo: {args.nproc} ranks, racks {[len(r) for r in topology.racks()]}, "
                  f"task digits, {args.steps} steps")
    records = []
    for name in STRATEGIES:
        cfg = TrainConfig(strategy=name, task="digits", steps=args.steps, seed=args.seed,
                          topology=topology, progress=True)
        records.append(train(cfg, nproc=args.nproc))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "demo.json", records)
    plot = out / "demo.png"
    plot_curves(records, plot)

    table = Table(title="allreduce (BSP) vs ds-sync, handwritten digits")
    for col in ("strategy", "test accuracy", "best accuracy", "comm ms/iter", "wall s"):
        table.add_column(col, justify="right" if col != "strategy" else "left")
    for r in records:
        table.add_row(r["strategy"], f"{100 * r['final_accuracy']:.2f} %",
                      f"{100 * r['best_accuracy']:.2f} %", f"{r['comm_ms_per_iter']:.3f}",
                      f"{r['wall_s']:.1f}")
    console.print(table)
    console.print(f"plot: {plot}   records: {out / 'demo.json'}")
    return 0


def plot_curves(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0), dpi=110, sharey=True)
    for r in records:
        acc = [100 * c["accuracy"] for c in r["curve"]]
        label = f"{r['strategy']} ({r['comm_ms_per_iter']:.2f} ms comm/iter)"
        axes[0].plot([c["step"] for c in r["curve"]], acc, marker="o", markersize=3, label=label)
        axes[1].plot([c["wall_s"] for c in r["curve"]], acc, marker="o", markersize=3, label=label)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training time (s, evaluation excluded)")
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle(f"{records[0]['task']}, {records[0]['world_size']} ranks: the model each strategy "
                 "hands back")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
