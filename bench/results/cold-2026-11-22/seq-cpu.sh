#!/bin/bash
# seq-cpu.sh: 5 GiB of 1 MiB O_DIRECT writes at QD16 on the loop device over the
# server's FUSE file; prints the rate, the server's CPU ticks and the machine's busy ticks.
# L=BINARY P=PARITY ./seq-cpu.sh   (root; uses /var/tmp/prof/p and port 10902)
set -u
L=${L:-/work/main/target/release/lograid}
P=${P:-1}; d=/var/tmp/prof/p; rm -rf $d; mkdir -p $d
$L create --parity $P --size 4G --volume vol0:6G $d/m0.img $d/m1.img $d/m2.img >/dev/null 2>&1
$L serve $d/m0.img $d/m1.img $d/m2.img --listen 127.0.0.1:10902 --fuse $d/files > $d/serve.log 2>&1 &
spid=$!; sleep 1.5
dev=$($L attach --file $d/files/vol0 --state-dir $d/state 2>/dev/null)
c0=$(awk '{print $14+$15}' /proc/$spid/stat)
read -r _ u n s i w x y z _ < /proc/stat; t0=$((u+n+s+x+y+z))
fio --name=w --filename=$dev --rw=write --bs=1M --iodepth=16 --ioengine=libaio --direct=1 --size=5g --end_fsync=1 --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)[\"jobs\"][0]; print(\"write %.0f MB/s\" % (j[\"write\"][\"bw_bytes\"]/1e6))"
c1=$(awk '{print $14+$15}' /proc/$spid/stat)
read -r _ u n s i w x y z _ < /proc/stat; t1=$((u+n+s+x+y+z))
echo "P=$P server CPU $(( (c1-c0) )) ticks for 5 GiB; machine busy $((t1-t0)) ticks"
sleep 6
$L detach $dev --state-dir $d/state 2>/dev/null
kill -TERM $spid; wait $spid
rm -rf $d
