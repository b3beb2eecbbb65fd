#!/usr/bin/env bash
# The peers' tuning sweep on mnist-wide (docs/time-to-accuracy.md): every setting of every
# peer beside ddp, on seeds 100 and 101 (never reported), on static and inter-rack, with the
# headline comparison's run length; then bench tune picks each peer's setting.
# Writes bench/results/sweep-mnist-wide.{json,md} and bench/results/tuned-mnist-wide.{json,md}.
# About 150 runs of a minute each on 2 cores: run again to go on after an interruption
# (--resume keeps the runs already recorded).
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
strategies=ddp
for p in 2 4 8; do strategies+=",local-sgd:period=$p"; done
for pair in 1:2 1:4 1:8 2:8; do strategies+=",torch-hier:rack_period=${pair%:*}:world_period=${pair#*:}"; done
for p in 1 2 4; do strategies+=",gossip:period=$p"; done
strategies+=",asp:scale_lr=true,asp:scale_lr=false"
for inner in "" ":--optimizer=adamw:--lr=0.001:--weight-decay=0.1"; do
  for h in 4 8 16 32; do
    for outer in 0.7:0.9 1.0:0.0 0.4:0.9; do
      strategies+=",diloco:inner_steps=$h:outer_lr=${outer%:*}:outer_momentum=${outer#*:}$inner"
    done
  done
done
"$dssync" bench compare --scenario static,inter-rack --seeds 100,101 --task mnist-wide --steps 600 \
  --strategies "$strategies" --json "$out/sweep-mnist-wide.json" --markdown "$out/sweep-mnist-wide.md" --resume
"$dssync" bench tune "$out/sweep-mnist-wide.json" --json "$out/tuned-mnist-wide.json" \
  --markdown "$out/tuned-mnist-wide.md"
