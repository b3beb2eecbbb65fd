#!/usr/bin/env bash
# `dssync plan` at cluster scale: wall seconds and peak memory (GNU time) for each layout,
# written to bench/results/plan-scale.txt with the commit and every command.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/plan-scale.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sizes() { python3 -c "import random, sys; n, k, lo, hi = map(int, sys.argv[1:]); random.seed(0); \
print(','.join(str(k if lo == hi else random.randint(lo, hi)) for _ in range(n)))" "$@"; }
{
    echo "# dssync plan at scale (commit $(git rev-parse --short HEAD)), $(date -u +%F), $(nproc) cores"
    echo "# case | workers | racks | period | wall s | peak MiB | schedule MiB (v1: every group listed, v2: racks + named groups); the command after each"
} > "$out"
while read -r name racks size lo hi flags; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    if [[ $lo == "$hi" ]]; then
        layout=(--racks "$racks" --workers-per-rack "$size")
        shown="--racks $racks --workers-per-rack $size"
    else
        layout=(--rack-sizes "$(sizes "$racks" "$size" "$lo" "$hi")")
        shown="--rack-sizes <$racks racks of $lo-$hi, random.seed(0)>"
    fi
    # shellcheck disable=SC2086
    /usr/bin/time -f "%e %M" -o "$tmp/time" dssync plan "${layout[@]}" $flags --out "$tmp/s.json" > "$tmp/printed"
    read -r wall kib < "$tmp/time"
    python3 - "$name" "$wall" "$kib" "$tmp/s.json" "$racks" >> "$out" <<'PY'
import json, os, sys
name, wall, kib, path, racks = sys.argv[1:]
s = json.load(open(path))
period = len(s["period"] if s["version"] == 1 else s["rounds"])
print(f"{name} | {s['world_size']} | {racks} | {period} | {float(wall):.2f} | {int(kib) / 1024:.0f} | "
      f"{os.path.getsize(path) / 2**20:.1f}")
PY
    echo "#   dssync plan $shown $flags --out s.json" >> "$out"
done <<'LAYOUTS'
10k-2-racks            2     5000 5000 5000
10k-2-racks-contended  2     5000 5000 5000 --slow-uplinks 0 --slow-nics 1,2,5001
100k-2-racks           2     50000 50000 50000
100k-1000-racks        1000  100  100  100
100k-1000-racks-uneven 1000  100  50   150
100k-1000-contended    1000  100  100  100  --slow-uplinks 0,7,500 --slow-nics 1,2,3,250,99999
100k-single-worker     100000 1   1    1
LAYOUTS
cat "$out"
