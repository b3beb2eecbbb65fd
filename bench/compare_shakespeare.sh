#!/usr/bin/env bash
# The second workload's comparison (docs/time-to-accuracy.md): shakespeare, seeds 0-4; on
# inter-rack ddp, torch-hier, diloco, local-sgd, asp and ds-sync, each peer at the setting
# bench tune chose from bench/sweep_shakespeare.sh; on static ddp and ds-sync. The links run
# at the scale in bench/shakespeare.env. Run again to go on after an interruption.
# Writes bench/results/compare-shakespeare-{inter-rack,static}.{json,md,png}.
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
test -f bench/shakespeare.env || { echo "bench/shakespeare.env (LR=..., SCALE=...) is written from bench/shakespeare_lr.sh and bench/shakespeare_scale.sh: run those first" >&2; exit 1; }
source bench/shakespeare.env
test -f "$out/tuned-shakespeare.json" || { echo "run bench/sweep_shakespeare.sh first" >&2; exit 1; }
common=(--repeats 5 --task shakespeare --steps 600 --optimizer adamw --lr "$LR" --weight-decay 0.1
        --rate-scale "$SCALE" --tuned "$out/tuned-shakespeare.json" --resume)
"$dssync" bench compare --scenario inter-rack --strategies ddp,torch-hier,diloco,local-sgd,asp,ds-sync "${common[@]}" \
  --json "$out/compare-shakespeare-inter-rack.json" --markdown "$out/compare-shakespeare-inter-rack.md" \
  --plot "$out/compare-shakespeare-inter-rack.png"
"$dssync" bench compare --scenario static --strategies ddp,ds-sync "${common[@]}" \
  --json "$out/compare-shakespeare-static.json" --markdown "$out/compare-shakespeare-static.md" \
  --plot "$out/compare-shakespeare-static.png"
