#!/usr/bin/env bash
# The NBD server's resident memory under client load: for each load, a fresh `lograid serve`
# on one pool (3 sparse 4 GiB file members, P=1, one 7 GiB volume), fio's nbd engine for
# SECONDS, then the server's peak (VmHWM) and current (VmRSS) resident memory, its CPU seconds
# per GB moved and the rate. Several binaries alternate load by load (old and new builds side
# by side). In the mixed loads the first server of each load is the slower, whichever build
# it is: the pool ages from load to load, and the first cleans most of what the 4 KiB random
# writes before left half dead (the last column shows it). To compare builds by speed, run
# again with their order swapped. As root or not; needs fio with its nbd engine (Debian: fio,
# libnbd0).
#
#   bench/nbd_memory.sh [--seconds S] [--dir DIR] NAME=BINARY [NAME=BINARY ...]
#
# Prints one tab-separated line per load and binary: name, load, MB/s, CPU s/GB, VmHWM MiB,
# VmRSS MiB, the engine's own memory at the end of the load (map/row buffers/all, MiB), and
# the documented bound for the load with whether VmHWM stayed within it, and the segments the
# cleaner emptied while the server ran with the MiB it has moved since the pool was made. The bound
# (docs/BENCHMARKS.md, the NBD server's memory): the server's resident memory once the pool is
# open and before the load (code, threads, the map), plus per connection its request buffers
# (64 MiB in flight, in buffers of up to twice that when request sizes are not powers of two,
# and 32 MiB kept idle), plus the engine's row buffers (64 rows in flight, and past that one
# sealed by a writer, two by a flush and three in the cleaner's queue; 32 kept; 3 open: 105
# rows of (members - parity) x chunk), plus a parity buffer (parity x chunk)
# for each of the 66 threads that may write rows (64 request threads, 2 row writers), plus
# 128 KiB of scratch buffers (a degraded read's columns) for each of up to 80 threads that may
# rebuild a block (the request threads and the engine's background work), plus one
# checkpoint's encoding (13 bytes per stored block).
# The members are deleted at the end.
set -euo pipefail
seconds=12
dir=
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--seconds S] [--dir DIR] NAME=BINARY ..." >&2; exit 2; }
command -v fio >/dev/null || { echo "nbd_memory: fio is missing (apt-get install fio)" >&2; exit 1; }
work=$(mktemp -d "${dir:-/var/tmp}/lograid-nbd-memory.XXXXXX")
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
first=${1#*=}
"$first" create --size 4G --volume vol0:7G "$work/m0" "$work/m1" "$work/m2" >/dev/null

loads=(
    "write 1M QD32|--rw=write --bs=1M --iodepth=32"
    "write 32M QD8|--rw=write --bs=32M --iodepth=8"
    "write 32M QD32|--rw=write --bs=32M --iodepth=32"
    "randwrite 4K QD64 x2|--rw=randwrite --bs=4k --iodepth=64 --numjobs=2"
    "randread 1M QD32|--rw=randread --bs=1M --iodepth=32"
    "randrw 32M QD8 x2|--rw=randrw --bs=32M --iodepth=8 --numjobs=2"
    "randrw 1M-32M QD16 x4|--rw=randrw --bsrange=1M-32M --iodepth=16 --numjobs=4"
)
printf 'binary\tload\tMB/s\tCPU s/GB\tVmHWM MiB\tVmRSS MiB\tengine MiB map/rows/all\tbound MiB\twithin\tcleaned segments/relocated MiB in all\n'
for load in "${loads[@]}"; do
    name=${load%%|*}
    args=${load#*|}
    for pair in "$@"; do
        label=${pair%%=*}
        binary=${pair#*=}
        "$binary" serve "$work/m0" "$work/m1" "$work/m2" --listen "127.0.0.1:$port" \
            >"$work/serve.log" 2>&1 &
        server=$!
        for _ in $(seq 50); do
            grep -q 'vol0' "$work/serve.log" 2>/dev/null && break
            sleep 0.2
        done
        idle=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$server/status")
        connections=1
        [[ $name =~ x([0-9]+)$ ]] && connections=${BASH_REMATCH[1]}
        per_connection=96
        [[ $args == *bsrange* ]] && per_connection=160
        # shellcheck disable=SC2086
        fio --name=load --ioengine=nbd --uri="nbd://127.0.0.1:$port/vol0" --size=6G \
            --time_based --runtime="$seconds" --output-format=json --output="$work/fio.json" \
            $args >/dev/null 2>"$work/fio.err" || { cat "$work/fio.err" >&2; exit 1; }
        read -r ticks < <(awk '{print $14 + $15}' "/proc/$server/stat")
        # The engine's own memory by kind at the end of the load, from the status the server
        # publishes (builds without it print -).
        engine=$("$binary" status --json "$work/m0" "$work/m1" "$work/m2" 2>/dev/null \
            | python3 -c 'import json, sys
m = json.load(sys.stdin).get("memory")
rows = m and m["open_row_bytes"] + m["in_flight_row_bytes"] + m["kept_row_bytes"]
print("%d/%d/%d" % (m["map_bytes"] >> 20, rows >> 20, m["total_bytes"] >> 20) if m else "-")' \
            2>/dev/null || echo -)
        # Segments the cleaner emptied while this server ran, and the bytes it has moved since
        # the pool was made (the difference from the line before is this server's).
        cleaned=$("$binary" status --json "$work/m0" "$work/m1" "$work/m2" 2>/dev/null \
            | python3 -c 'import json, sys
c = json.load(sys.stdin)["cleaner"]
print("%d/%d" % (c["segments_cleaned"], c["relocated_bytes"] >> 20))' 2>/dev/null || echo -)
        hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$server/status")
        bound=$("$binary" status --json "$work/m0" "$work/m1" "$work/m2" 2>/dev/null \
            | python3 -c 'import json, sys
s = json.load(sys.stdin)
rows = 105 * (s["members_total"] - s["parity"]) * s["chunk_bytes"]
parity = 66 * s["parity"] * s["chunk_bytes"]
scratch = 80 * (128 << 10)
checkpoint = 13 * s["stored_bytes"] // 4096
print((rows + parity + scratch + checkpoint >> 20) + int(sys.argv[1]) + int(sys.argv[3]) * int(sys.argv[2]))' \
                "$idle" "$connections" "$per_connection" \
            2>/dev/null || echo 0)
        within=no
        [ "$hwm" -le "$bound" ] && within=yes
        rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$server/status")
        kill "$server"
        wait "$server" 2>/dev/null || true
        server=
        python3 - "$work/fio.json" "$ticks" "$(getconf CLK_TCK)" "$seconds" <<'EOF' | {
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
moved = sum(j["write"]["io_bytes"] + j["read"]["io_bytes"] for j in jobs)
cpu = int(sys.argv[2]) / int(sys.argv[3])
print("%d\t%.2f" % (moved / int(sys.argv[4]) / 1e6, cpu / (moved / 1e9)))
EOF
            read -r rate cpu
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$name" "$rate" "$cpu" \
                "$hwm" "$rss" "$engine" "$bound" "$within" "$cleaned"
        }
    done
done
