#!/usr/bin/env bash
# Re-measure every record that bench/README.md's protocol sections cite, beside the headline
# comparison: ds-sync's ensembles, SpecSync and PSP, Sync-Switch. Each command is the one its
# section shows; each record carries its provenance.
# ONLY=name1,name2 runs a subset (names: ensemble specsync-psp psp sync-switch
# sync-switch-episodes specsync). About an hour and a half on 2 cores in all.
set -euo pipefail
cd "$(dirname "$0")/.."
dssync=${DSSYNC:-.venv/bin/dssync}
r=bench/results
want() { [[ -z "${ONLY:-}" || ",$ONLY," == *",$1,"* ]]; }
if want ensemble; then
  "$dssync" bench ensemble --task mnist-wide --json $r/ensemble-mnist-wide.json --markdown $r/ensemble-mnist-wide.md
  "$dssync" bench ensemble --task digits --steps 300 --lr 0.05 --lr-schedule constant --warmup-steps 0 \
    --json $r/ensemble-digits.json --markdown $r/ensemble-digits.md
fi
if want specsync-psp; then
  "$dssync" bench compare --scenario inter-rack --task mnist-wide --steps 300 --eval-every 12 --repeats 3 \
    --cpu 1:0.1 --reference asp --no-stop \
    --strategies "asp,specsync,psp:push_quorum=7:pull_fraction=0.875,psp:push_quorum=7:pull_fraction=0.875:delay_prob=0.026:delay_s=0.035,psp:delay_prob=0.026:delay_s=0.035" \
    --json $r/specsync-psp.json --markdown $r/specsync-psp.md --plot $r/specsync-psp.png
fi
if want psp; then
  "$dssync" bench compare --scenario static --task digits --steps 60 --eval-every 20 --repeats 1 \
    --reference "psp:delay_prob=0.026:delay_s=4" --no-stop \
    --strategies "psp:delay_prob=0.026:delay_s=4,psp:push_quorum=7:pull_fraction=0.875:delay_prob=0.026:delay_s=4,psp:push_quorum=5:pull_fraction=0.75:delay_prob=0.026:delay_s=4" \
    --json $r/psp.json --markdown $r/psp.md
fi
if want sync-switch; then
  "$dssync" tune sync-switch --task digits --steps 150 --nproc 8 --settings 3 --out $r/sync-switch-policy.json
  "$dssync" bench compare --scenario static --task digits --steps 150 --eval-every 10 --repeats 1 --cpu 0:0.1 1:0.1 \
    --reference allreduce --no-stop --strategies "allreduce,asp,sync-switch:switch_at=$(.venv/bin/python -c "import json; print(json.load(open('$r/sync-switch-policy.json'))['switch_at'])"),sync-switch:switch_at=1" \
    --json $r/sync-switch.json --markdown $r/sync-switch.md
fi
if want sync-switch-episodes; then
  # forked workers (emulate run's DSSYNC_EMULATE_FORK=1), as the record was measured: the
  # episodes are timed from launch, so how fast the workers start moves them in training
  DSSYNC_EMULATE_FORK=1 "$dssync" bench compare --scenario static --task mnist --steps 400 --eval-every 20 --repeats 3 \
    --reference allreduce --no-stop --episode 2:cpu=0.1@20+20 --episode 5:cpu=0.1@20+20 \
    --strategies "allreduce,asp,sync-switch:switch_at=0.5,sync-switch:switch_at=0.5:policy=greedy,sync-switch:switch_at=0.5:policy=elastic" \
    --json $r/sync-switch-episodes.json --markdown $r/sync-switch-episodes.md --plot $r/sync-switch-episodes.png
fi
if want specsync; then
  for v in "120 1:0.1 0.02 0.5 specsync" "150 1:0.1 0.05 0.4 specsync-lr0.05" "150 1:0.2 0.02 0.4 specsync-lr0.02-cpu0.2"; do
    read -r steps cpu lr loss name <<< "$v"
    "$dssync" bench compare --scenario static --task mnist-cnn --steps "$steps" --eval-every 10 --repeats 3 --cpu "$cpu" \
      --lr "$lr" --reference asp --no-stop --strategies asp,specsync --target-loss "$loss" \
      --json "$r/$name.json" --markdown "$r/$name.md" --plot "$r/$name.png"
  done
fi
