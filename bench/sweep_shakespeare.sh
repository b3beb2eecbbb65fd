#!/usr/bin/env bash
# The peers' tuning sweep on the shakespeare workload (docs/time-to-accuracy.md): seeds 100
# and 101 (never reported), on inter-rack (the scenario where the peers are compared on this
# workload), at the headline's run length, link scale and learning rate; then bench tune.
# The loop's optimizer is AdamW (DiLoCo's inner optimizer); asp's parameter servers step with
# momentum SGD, so its sweep also covers SGD's learning rate.
# Writes bench/results/sweep-shakespeare.{json,md} and bench/results/tuned-shakespeare.{json,md};
# run again to go on after an interruption (--resume keeps the runs already recorded).
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
out=bench/results
test -f bench/shakespeare.env || { echo "bench/shakespeare.env (LR=..., SCALE=...) is written from bench/shakespeare_lr.sh and bench/shakespeare_scale.sh: run those first" >&2; exit 1; }
source bench/shakespeare.env   # LR, SCALE: chosen by bench/shakespeare_lr.sh and bench/shakespeare_scale.sh
strategies=ddp
for p in 2 4 8; do strategies+=",local-sgd:period=$p"; done
for pair in 1:4 1:8 2:8; do strategies+=",torch-hier:rack_period=${pair%:*}:world_period=${pair#*:}"; done
for h in 4 8 16 32; do
  for outer in 0.7:0.9 1.0:0.0 0.4:0.9; do
    strategies+=",diloco:inner_steps=$h:outer_lr=${outer%:*}:outer_momentum=${outer#*:}"
  done
done
for lr in 0.03 0.1 0.3; do strategies+=",asp:scale_lr=true:--optimizer=sgd:--lr=$lr:--weight-decay=0"; done
strategies+=",asp:scale_lr=false:--optimizer=sgd:--lr=0.03:--weight-decay=0"
"$dssync" bench compare --scenario inter-rack --seeds 100,101 --task shakespeare --steps 600 \
  --optimizer adamw --lr "$LR" --weight-decay 0.1 --rate-scale "$SCALE" \
  --strategies "$strategies" --json "$out/sweep-shakespeare.json" --markdown "$out/sweep-shakespeare.md" --resume
"$dssync" bench tune "$out/sweep-shakespeare.json" --json "$out/tuned-shakespeare.json" \
  --markdown "$out/tuned-shakespeare.md"
