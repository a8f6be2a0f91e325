#!/bin/bash
# QD1 mixed 512 B-64 KiB random writes, 8 s, against: lograid serve (3 x 2 GiB file members, P=1),
# nbdkit memory, and lograid-nbd's in-memory example server. Alternated 3 times.
D=$(mktemp -d /var/tmp/qd1cmp.XXXX); cd $D
L=/work/main/target/release/lograid
$L create --parity 1 --size 2G --volume vol0:3G d0.img d1.img d2.img >/dev/null 2>&1
($L serve d0.img d1.img d2.img --listen 127.0.0.1:10899 > s.out 2> s.err &)
(nbdkit -p 10897 memory 3G &)
(/work/main/target/release/examples/mem_server 127.0.0.1:10898 3072 > /dev/null 2>&1 &)
sleep 2
fio --name=layout --ioengine=nbd --uri=nbd://127.0.0.1:10899/vol0 --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 > /dev/null
run() { fio --name=m --ioengine=nbd --uri=$2 --rw=randwrite --bsrange=512-64k --iodepth=1 --time_based --runtime=8 --end_fsync=1 --size=1G --randrepeat=0 --output-format=json 2>/dev/null | sed -n "/^{/,\$p" | python3 -c "import json,sys;j=json.load(sys.stdin)['jobs'][0]['write'];print('%-22s iops %6.0f p50 %4.0f us p99 %5.0f us'%('$1',j['iops'],j['clat_ns']['percentile']['50.000000']/1000,j['clat_ns']['percentile']['99.000000']/1000))"; }
for i in 1 2 3; do
run lograid nbd://127.0.0.1:10899/vol0
run nbdkit-memory nbd://127.0.0.1:10897/
run lograid-nbd-memory nbd://127.0.0.1:10898/disk0
done
pkill -f "listen 127.0.0.1:10899"; pkill -f "nbdkit -p 10897"; pkill -f "mem_server 127.0.0.1:10898"; sleep 1; cd /; rm -rf $D
