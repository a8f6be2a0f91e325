#!/bin/bash
# QD1 ceiling probe: same mixed 512-64k QD1 fio job against nbdkit memory and against lograid P=1 (fresh pool, laid out)
set -uo pipefail
R=/work/main/bench/results/issue3-2026-11-22; L=/work/main/target/release/lograid; W=/var/tmp/i3; URI=nbd://127.0.0.1:10899/vol0
job() { fio --name=$1 --ioengine=nbd --uri=$2 --size=2g --rw=randwrite --bsrange=$3 --iodepth=1 --time_based --runtime=10 --randrepeat=0 --end_fsync=1 --output-format=json > $R/P-$1.json 2>&1
  echo "[$(date +%T)] PROBE $1: $(/work/shared/bench/fio_sum.py $R/P-$1.json | awk '{print $4" IOPS "$5" MB/s"}') load $(cut -d' ' -f1-3 /proc/loadavg) $(python3 -c 'import json,sys;t=open(sys.argv[1]).read();j=json.loads(t[t.index("{"):])["jobs"][0];p=j["write"]["clat_ns"]["percentile"];print("p50_us=%.0f p99_us=%.0f"%(p["50.000000"]/1e3,p["99.000000"]/1e3))' $R/P-$1.json)"; }
nbdkit -f --ip-addr=127.0.0.1 --port=10899 memory 12G & np=$!; sleep 1
job memory-mixed-qd1 nbd://127.0.0.1:10899 512-64k; job memory-4k-qd1 nbd://127.0.0.1:10899 4k-4k
kill $np; wait $np
rm -f $W/m?.img; $L create --parity 1 --size 8G --volume vol0:12G $W/m0.img $W/m1.img $W/m2.img >/dev/null 2>&1
$L serve $W/m0.img $W/m1.img $W/m2.img --listen 127.0.0.1:10899 >>$R/serve-probe.log 2>&1 & sp=$!; sleep 1
fio --name=layout --ioengine=nbd --uri=$URI --size=2g --rw=write --bs=1M --iodepth=8 --end_fsync=1 >/dev/null
job lograid-p1-mixed-qd1 $URI 512-64k; job lograid-p1-4k-qd1 $URI 4k-4k; job lograid-p1-4k-aligned-mixed-qd1 $URI 4k-64k
kill -TERM $sp; wait $sp; rm -f $W/m?.img
