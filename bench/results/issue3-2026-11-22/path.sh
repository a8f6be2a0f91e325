#!/bin/bash
# path probe: 1 MiB seq write QD16 2 GiB O_DIRECT on the attached /dev/loopN (lograid P=1, then nbdkit memory); RMW probe
set -uo pipefail
R=/work/main/bench/results/issue3-2026-11-22; L=/work/main/target/release/lograid; W=/var/tmp/i3
rm -f $W/m?.img; $L create --parity 1 --size 8G --volume vol0:12G $W/m0.img $W/m1.img $W/m2.img >/dev/null 2>&1
$L serve $W/m0.img $W/m1.img $W/m2.img --listen 127.0.0.1:10899 >>$R/serve-path.log 2>&1 & sp=$!; sleep 1
dev=$($L attach --server nbd://127.0.0.1:10899 --export vol0 2>>$R/attach.log)
fio --name=loopseq --filename=$dev --size=2g --rw=write --bs=1M --iodepth=16 --ioengine=libaio --direct=1 --end_fsync=1 --output-format=json > $R/L-lograid-p1-loop-seqwrite.json 2>&1
echo "PATH lograid-p1 via loop: $(/work/shared/bench/fio_sum.py $R/L-lograid-p1-loop-seqwrite.json | awk '{print $5" MB/s"}') load $(cut -d' ' -f1 /proc/loadavg)"
$L detach $dev >/dev/null 2>&1
# RMW probe: 20000 random 512 B writes at QD1 on the (now 2 GiB-written) volume; member reads from status
kill -TERM $sp; wait $sp
r0=$($L status --json $W/m0.img $W/m1.img $W/m2.img 2>/dev/null | python3 -c 'import json,sys;d=json.load(sys.stdin);print(sum(m["counters"]["bytes_read"] for m in d["members"]), sum(m["counters"]["reads"] for m in d["members"]))')
$L serve $W/m0.img $W/m1.img $W/m2.img --listen 127.0.0.1:10899 >>$R/serve-path.log 2>&1 & sp=$!; sleep 1
fio --name=rmw --ioengine=nbd --uri=nbd://127.0.0.1:10899/vol0 --size=2g --rw=randwrite --bs=512 --iodepth=1 --number_ios=20000 --randrepeat=0 --output-format=json > $R/P-lograid-p1-512B-qd1-rmw.json 2>&1
kill -TERM $sp; wait $sp
r1=$($L status --json $W/m0.img $W/m1.img $W/m2.img 2>/dev/null | python3 -c 'import json,sys;d=json.load(sys.stdin);print(sum(m["counters"]["bytes_read"] for m in d["members"]), sum(m["counters"]["reads"] for m in d["members"]))')
echo "RMW 20000 x 512B writes QD1: $(/work/shared/bench/fio_sum.py $R/P-lograid-p1-512B-qd1-rmw.json | awk '{print $4" IOPS"}'); member bytes_read/reads before: $r0 after: $r1"
rm -f $W/m?.img
nbdkit -f --ip-addr=127.0.0.1 --port=10899 memory 12G & np=$!; sleep 1; mkdir -p $W/fmnt
nbdfuse $W/fmnt/nbd nbd://127.0.0.1:10899 & fp=$!; for i in $(seq 50); do [ -s $W/fmnt/nbd ] && break; sleep 0.1; done
dev=$(losetup -f --show --direct-io=on $W/fmnt/nbd)
fio --name=loopseq --filename=$dev --size=2g --rw=write --bs=1M --iodepth=16 --ioengine=libaio --direct=1 --end_fsync=1 --output-format=json > $R/L-memory-loop-seqwrite.json 2>&1
echo "PATH nbdkit-memory via loop: $(/work/shared/bench/fio_sum.py $R/L-memory-loop-seqwrite.json | awk '{print $5" MB/s"}') load $(cut -d' ' -f1 /proc/loadavg)"
fio --name=nbdseq --ioengine=nbd --uri=nbd://127.0.0.1:10899 --size=2g --rw=write --bs=1M --iodepth=16 --end_fsync=1 --output-format=json > $R/S-memory-nbd-seqwrite.json 2>&1
echo "PATH nbdkit-memory fio nbd engine: $(/work/shared/bench/fio_sum.py $R/S-memory-nbd-seqwrite.json | awk '{print $5" MB/s"}')"
losetup -d $dev; fusermount3 -u $W/fmnt; wait $fp; kill $np; wait $np
