#!/usr/bin/env bash
# The headline comparison (docs/time-to-accuracy.md): every strategy on mnist-wide, seeds 0-4,
# on static, inter-rack and inter-rack+nic, each peer at the setting bench tune chose from
# the recorded sweep (bench/sweep_mnist_wide.sh), ds-sync at its defaults.
# About 135 runs of one to three minutes on 2 cores: run again to go on after an
# interruption (--resume keeps the runs already recorded).
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
test -f "$out/tuned-mnist-wide.json" || { echo "run bench/sweep_mnist_wide.sh first" >&2; exit 1; }
"$dssync" bench compare --scenario static,inter-rack,inter-rack+nic --repeats 5 --task mnist-wide --steps 600 \
  --strategies ddp,allreduce,hierarchical,torch-hier,diloco,local-sgd,gossip,asp,ds-sync \
  --tuned "$out/tuned-mnist-wide.json" --resume \
  --json "$out/compare-mnist-wide.json" --markdown "$out/compare-mnist-wide.md" --plot "$out/compare-mnist-wide.png"
