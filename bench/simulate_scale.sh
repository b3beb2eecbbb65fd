#!/usr/bin/env bash
# `dssync simulate` at 16,384 workers (512 racks of 32), 1000 iterations, every strategy:
# the table and its wall seconds and peak memory (GNU time, CLI start included), written to
# bench/results/simulate-16384.txt with the commit and the command; the records beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/simulate-16384.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# dssync simulate at 16,384 workers (commit $(git rev-parse --short HEAD)), $(date -u +%F), $(nproc) cores" > "$out"
for contended in 0 0.25; do
    args=(--racks 512 --workers-per-rack 32 --iterations 1000 --contended-uplinks "$contended")
    json=bench/results/simulate-16384-contended-$contended.json
    COLUMNS=120 /usr/bin/time -f "%e %M" -o "$tmp/time" dssync simulate "${args[@]}" --json "$json" > "$tmp/table"
    read -r wall kib < "$tmp/time"
    {
        echo "# dssync simulate ${args[*]} --json $json"
        echo "# wall $wall s, peak $((kib / 1024)) MiB"
        cat "$tmp/table"
    } >> "$out"
done
