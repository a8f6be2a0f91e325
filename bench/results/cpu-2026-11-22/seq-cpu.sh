#!/bin/bash
D=$(mktemp -d /var/tmp/prof.XXXX); cd $D
L=${LBIN:-/work/main/target/release/lograid}
for i in 0 1 2; do truncate -s 4G m$i; done
$L create --parity ${P:-1} m0 m1 m2 >/dev/null 2>&1
$L volume create --size 8G vol0 m0 m1 m2 >/dev/null 2>&1
$L serve --socket $D/s.sock m0 m1 m2 > s.log 2>&1 &
SP=$!
sleep 1.5
cpu0=$(awk '{print $14+$15}' /proc/$SP/stat)
t0=$(date +%s.%N)
if [ -n "$PERF" ]; then perf record -F 499 --call-graph dwarf,16384 -p $SP -o /tmp/perf.data -- sleep 3 > /dev/null 2>&1 & PP=$!; fi
fio --name=seq --ioengine=nbd --uri="nbd+unix:///vol0?socket=$D/s.sock" --rw=write --bs=${BS:-128k} --iodepth=16 --size=4g --end_fsync=1 --output-format=json 2>/dev/null | sed -n "/^{/,\$p" | python3 -c "import json,sys;j=json.load(sys.stdin)['jobs'][0]['write'];print('bw MB/s %.0f'%(j['bw_bytes']/1e6))"
t1=$(date +%s.%N)
cpu1=$(awk '{print $14+$15}' /proc/$SP/stat)
echo "server CPU s/GB: $(python3 -c "print(round(($cpu1-$cpu0)/100/4.295,3))")  elapsed $(python3 -c "print(round($t1-$t0,1))") s"
[ -n "$PERF" ] && wait $PP
kill -TERM $SP; wait $SP; cd /; rm -rf $D
