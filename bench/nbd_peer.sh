#!/usr/bin/env bash
# lograid's NBD server against nbdkit's memory plugin, the same client driving both: fio's nbd
# engine, 4 KiB random writes then reads at QD32 on one connection. lograid's pool: 3 members
# of SIZE on /dev/shm, written in full first (a drive's blocks exist before they are written;
# tmpfs allocates a page on its first write), P=1, one volume; nbdkit: `memory` of the
# volume's size with its pages allocated and locked up front (`allocator=malloc,mlock=true`).
# The two servers alternate, ROUNDS times. Random writes cover under half the volume, so the
# cleaner does not run; reads are of a GiB written sequentially first. As root; needs fio (with its nbd engine) and nbdkit.
#
#   bench/nbd_peer.sh [--seconds S] [--rounds N] [--member-size SIZE] [--lograid BINARY]
#
# Prints one tab-separated line per run: server, load, IOPS, server CPU µs per request
# (user + system, from /proc). The members are deleted at the end.
set -euo pipefail
seconds=6
rounds=3
member_size=3G
lograid=target/release/lograid
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --member-size) member_size=$2; shift 2 ;;
        --lograid) lograid=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "nbd_peer: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "nbd_peer: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
[ -x "$lograid" ] || { echo "nbd_peer: no lograid binary at $lograid (cargo build --release)" >&2; exit 1; }
work=$(mktemp -d /dev/shm/lograid-nbd-peer.XXXXXX)
server=
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
bytes=$(numfmt --from=iec "$member_size")
for m in m0 m1 m2; do
    dd if=/dev/zero of="$work/$m" bs=1M count=$((bytes >> 20)) status=none
done
# The volume: two data members' worth, less the pool's own room (superblocks, checkpoints,
# the cleaner's reserve): 90% of it.
volume=$((bytes * 2 / 10 * 9 / 1048576 * 1048576))
"$lograid" create --volume "vol0:$volume" "$work/m0" "$work/m1" "$work/m2" >/dev/null

start_server() {
    case $1 in
        lograid)
            "$lograid" serve "$work/m0" "$work/m1" "$work/m2" --listen "127.0.0.1:$port" \
                >"$work/serve.log" 2>&1 &
            server=$!
            uri="nbd://127.0.0.1:$port/vol0"
            ;;
        nbdkit)
            nbdkit -f -i 127.0.0.1 -p "$port" memory "$volume" allocator=malloc,mlock=true \
                >"$work/serve.log" 2>&1 &
            server=$!
            uri="nbd://127.0.0.1:$port"
            ;;
    esac
    for _ in $(seq 100); do
        nbdinfo --size "$uri" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    cat "$work/serve.log" >&2
    return 1
}

stop_server() {
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }

run_load() { # server, load name, fio arguments...
    local name=$1 load=$2
    shift 2
    local before after
    before=$(cpu_ticks)
    fio --name=load --ioengine=nbd --uri="$uri" --size="$volume" --time_based \
        --runtime="$seconds" --iodepth=32 --bs=4k --output-format=json \
        --output="$work/fio.json" "$@" >/dev/null 2>"$work/fio.err" \
        || { cat "$work/fio.err" >&2; exit 1; }
    after=$(cpu_ticks)
    python3 - "$work/fio.json" "$((after - before))" "$(getconf CLK_TCK)" <<'EOF' | {
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
ops = job["write"]["total_ios"] + job["read"]["total_ios"]
iops = job["write"]["iops"] + job["read"]["iops"]
cpu_us = int(sys.argv[2]) / int(sys.argv[3]) * 1e6
print("%d\t%.2f" % (iops, cpu_us / max(ops, 1)))
EOF
        read -r iops cpu
        printf '%s\t%s\t%s\t%s\n' "$name" "$load" "$iops" "$cpu"
    }
}

printf 'server\tload\tIOPS\tserver CPU us/request\n'
for round in $(seq "$rounds"); do
    order=(lograid nbdkit)
    [ $((round % 2)) -eq 0 ] && order=(nbdkit lograid)
    for name in "${order[@]}"; do
        start_server "$name"
        # Random writes over the volume, at most half its size; then its first GiB is
        # written sequentially (not measured) and read at random.
        run_load "$name" "randwrite 4K QD32" --rw=randwrite --number_ios=$((volume / 4096 / 2))
        fio --name=fill --ioengine=nbd --uri="$uri" --size=1g --rw=write --bs=1M --iodepth=8 \
            >/dev/null 2>"$work/fio.err" || { cat "$work/fio.err" >&2; exit 1; }
        run_load "$name" "randread 4K QD32" --rw=randread --size=1g
        stop_server
        if [ "$name" = lograid ]; then
            # A fresh pool for the next round (the same members, still written).
            "$lograid" create --force --volume "vol0:$volume" "$work/m0" "$work/m1" "$work/m2" \
                >/dev/null
        fi
    done
done
