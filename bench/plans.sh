#!/usr/bin/env bash
# The planner on layouts a user asks about: writes bench/results/plans/*.json (the schedules)
# and bench/results/plans.txt (what `dssync plan` printed, with each command).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/plans.txt
# provenance first: the commit, the command, the date and the cores of every schedule below
echo "# \`bash bench/plans.sh\` at commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores (the schedules: plans/*.json)" > "$out"
echo >> "$out"
while read -r name args; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    echo "\$ dssync plan $args --out bench/results/plans/$name.json" >> "$out"
    # shellcheck disable=SC2086
    dssync plan $args --out "bench/results/plans/$name.json" >> "$out"
    # each schedule carries its own provenance too (schedule files keep keys they do not read)
    # shellcheck disable=SC2086
    python3 -c 'import json, sys
from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp, provenance
path = sys.argv[1]
write_json(path, stamp(json.load(open(path)), provenance(sys.argv[2:])))' \
        "bench/results/plans/$name.json" plan $args --out "bench/results/plans/$name.json"
    echo >> "$out"
done <<'LAYOUTS'
static-4-4-4           --rack-sizes 4,4,4
uplink0-4-4-4          --rack-sizes 4,4,4 --slow-uplinks 0
uplink1-4-4-4          --rack-sizes 4,4,4 --slow-uplinks 1
uplink2-4-4-4          --rack-sizes 4,4,4 --slow-uplinks 2
static-3-3-3           --rack-sizes 3,3,3
uplink0-3-3-3          --rack-sizes 3,3,3 --slow-uplinks 0
nics01-3-3             --rack-sizes 3,3 --slow-nics 0,1
nics123-4-4            --rack-sizes 4,4 --slow-nics 1,2,3
four-rack              --rack-sizes 3,2,3,4 --slow-uplinks 2 --slow-nics 9
adjusted-uplink0-4-4-4 --rack-sizes 4,4,4 --slow-uplinks 0 --plan adjusted
adjusted-uplink0-3-3-3 --rack-sizes 3,3,3 --slow-uplinks 0 --plan adjusted
adjusted-nics01-3-3    --rack-sizes 3,3 --slow-nics 0,1 --plan adjusted
adjusted-nics123-4-4   --rack-sizes 4,4 --slow-nics 1,2,3 --plan adjusted
static-7-8-9-11        --rack-sizes 7,8,9,11
LAYOUTS
cat "$out"
