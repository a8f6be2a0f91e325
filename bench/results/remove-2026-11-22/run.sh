#!/usr/bin/env bash
# Rebuild into free space (`lograid remove`) against the rebuild in place
# (`lograid replace`) after the same member is lost, on the same pool:
# 4 members of 2 GiB, P=1, 2 GiB written. Members are files in /var/tmp.
set -euo pipefail
L=${LOGRAID:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/lograid}
D=/var/tmp/lograid-remove-bench
rm -rf "$D"; mkdir -p "$D/pool"; cd "$D/pool"
"$L" create --parity 1 --size 2G --volume v:4G d0.img d1.img d2.img d3.img >/dev/null
"$L" serve --listen 127.0.0.1:10991 d0.img d1.img d2.img d3.img >/dev/null 2>&1 &
pid=$!; sleep 2
qemu-io -f raw -c "write -P 0x55 0 1G" -c "write -P 0x56 1G 1G" nbd://127.0.0.1:10991/v | grep -c wrote
kill -TERM $pid; wait $pid || true
mkdir ../copy; cp --sparse=always d*.img ../copy/
echo "== remove (rebuild into the free space of the other 3)"
rm d2.img
"$L" remove . 2 2>&1 | grep -E "done|error"
echo "== replace in place (rebuild onto a new drive)"
rm -f d*.img; cp --sparse=always ../copy/d*.img .; rm d2.img
"$L" replace . 2 n2.img 2>&1 | grep -E "done|error"
cd /; rm -rf "$D"
