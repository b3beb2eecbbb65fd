#!/usr/bin/env bash
# The shakespeare workload's learning rate, chosen for ddp (the loop's AdamW, shared by every
# strategy that uses the loop's optimizer) as its users would: a sweep on seeds 100 and 101
# (never reported), 600 iterations, warm-up and cosine decay, on static. ddp's steps do not
# depend on the network, so its accuracy is the same on every scenario and rate scale.
# Writes bench/results/shakespeare-lr.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
strategies=""
for lr in ${LRS:-0.003 0.01 0.02 0.04 0.08}; do strategies+="${strategies:+,}ddp:--lr=$lr"; done
"$dssync" bench compare --scenario static --seeds 100,101 --task shakespeare --steps 600 --no-stop \
  --optimizer adamw --weight-decay 0.1 --strategies "$strategies" --resume \
  --json "$out/shakespeare-lr.json" --markdown "$out/shakespeare-lr.md"
