#!/usr/bin/env bash
# The prober on the three named scenarios, static, inter-rack and inter-rack+nic (8 workers), RUNS runs each (default 2): writes
# bench/results/probe-scenarios.txt, one line a run, each from a fresh cluster. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-2}
out=bench/results/probe-scenarios.txt
name=pscn
tmp=$(mktemp -d)
trap 'dssync emulate down --name "$name" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
{
    echo "# dssync probe on the three named scenarios, 8 workers, $runs runs each; commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
    echo "# command: RUNS=$runs bash bench/probe_scenarios.sh"
    echo "# per run: dssync emulate up --scenario S; dssync emulate run -- dssync probe --out topology.json; dssync emulate down"
    echo "# scenario run probe_seconds racks slow_uplinks slow_nics confident phase_seconds"
} > "$out"
for scenario in static inter-rack inter-rack+nic; do
    for run in $(seq 0 $((runs - 1))); do
        dssync emulate up --scenario "$scenario" --name "$name" >/dev/null
        dssync emulate run --name "$name" --timeout 180 -- dssync probe --out "$tmp/topology.json" >/dev/null 2>&1
        dssync emulate down --name "$name" >/dev/null
        python3 - "$scenario" "$run" "$tmp/topology.json" >> "$out" <<'PY'
import json, sys
scenario, run, path = sys.argv[1:]
t = json.load(open(path))
c = t["contention"]
print(scenario, run, t["probe"]["seconds"], [w["rack"] for w in t["workers"]], [u["rack"] for u in c["uplinks"]],
      [n["rank"] for n in c["nics"]], t["confidence"]["confident"], t["confidence"]["phase_seconds"])
PY
    done
done
cat "$out"
