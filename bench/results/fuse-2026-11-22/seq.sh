#!/bin/bash
set -u
L=${L:-/work/main/target/release/lograid}
P=${P:-1}; MODES=${MODES:-"fuse nbd"}; W=/var/tmp/fab; BS=${BS:-1M}
for mode in $MODES; do
  d=$W/p; rm -rf $d; mkdir -p $d/mnt
  $L create --parity $P --size 4G --volume vol0:6G $d/m0.img $d/m1.img $d/m2.img >/dev/null 2>&1
  $L serve $d/m0.img $d/m1.img $d/m2.img --listen 127.0.0.1:10902 --fuse $d/files > $d/serve.log 2>&1 &
  spid=$!; sleep 1.5
  if [ $mode = fuse ]; then dev=$($L attach --file $d/files/vol0 --state-dir $d/state 2>/dev/null)
  else dev=$($L attach --server nbd://127.0.0.1:10902 --export vol0 --state-dir $d/state 2>/dev/null); fi
  c0=$(awk '{print $14+$15}' /proc/$spid/stat)
  fio --name=w --filename=$dev --rw=write --bs=$BS --iodepth=16 --ioengine=libaio --direct=1 --size=3g --end_fsync=1 --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)[\"jobs\"][0]; print(\"write %.0f MB/s\" % (j[\"write\"][\"bw_bytes\"]/1e6), end=\" \")"
  fio --name=r --filename=$dev --rw=read --bs=$BS --iodepth=16 --ioengine=libaio --direct=1 --size=3g --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)[\"jobs\"][0]; print(\"read %.0f MB/s\" % (j[\"read\"][\"bw_bytes\"]/1e6))"
  c1=$(awk '{print $14+$15}' /proc/$spid/stat)
  echo "  $mode bs=$BS server CPU $(( (c1-c0) )) ticks; load $(cut -d' ' -f1 /proc/loadavg)"
  $L detach $dev --state-dir $d/state 2>/dev/null
  kill -TERM $spid; wait $spid; grep -o "unmounted.*" $d/serve.log
done
rm -rf $W/p
