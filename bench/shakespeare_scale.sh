#!/usr/bin/env bash
# Which link-rate scale makes communication, not the two cores, bound a step of the
# shakespeare workload (docs/time-to-accuracy.md): ddp on static and inter-rack, and ds-sync
# on inter-rack, 100 iterations, at each scale in SCALES. Compare each scale's wall ms/iter
# with scale 1's (where the links are far faster than 8 workers computing on 2 cores).
# Writes bench/results/shakespeare-scale-<scale>.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
for scale in ${SCALES:-1 0.1 0.05}; do
  "$dssync" bench compare --scenario static,inter-rack --seeds 100 --task shakespeare --steps 100 --no-stop \
    --optimizer adamw --lr 0.01 --weight-decay 0.1 --rate-scale "$scale" --strategies ddp,ds-sync \
    --json "$out/shakespeare-scale-$scale.json" --markdown "$out/shakespeare-scale-$scale.md"
done
