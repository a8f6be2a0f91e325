#!/bin/bash
# A/B: ext4 many-files over lograid P=$P via the built-in FUSE file vs nbdfuse.
set -u
L=${L:-/work/main/target/release/lograid}
P=${P:-1}; N=${N:-150}; REPS=${REPS:-2}; MODES=${MODES:-"fuse nbd"}
W=/var/tmp/fab
old_db=$(cat /proc/sys/vm/dirty_bytes); old_dr=$(cat /proc/sys/vm/dirty_ratio); old_dbr=$(cat /proc/sys/vm/dirty_background_ratio)
echo $((128<<20)) > /proc/sys/vm/dirty_background_bytes; echo $((512<<20)) > /proc/sys/vm/dirty_bytes
for rep in $(seq 1 $REPS); do for mode in $MODES; do
  d=$W/p; rm -rf $d; mkdir -p $d/mnt
  $L create --parity $P --size 4G --volume vol0:6G $d/m0.img $d/m1.img $d/m2.img >/dev/null 2>&1
  $L serve $d/m0.img $d/m1.img $d/m2.img --listen 127.0.0.1:10902 --fuse $d/files > $d/serve.log 2>&1 &
  spid=$!; sleep 1.5
  if [ $mode = fuse ]; then dev=$($L attach --file $d/files/vol0 --state-dir $d/state 2>/dev/null)
  else dev=$($L attach --server nbd://127.0.0.1:10902 --export vol0 --state-dir $d/state 2>/dev/null); fi
  mkfs.ext4 -q ${MKFS_OPTS:--E nodiscard} $dev && mount $dev $d/mnt
  c0=$(awk '{print $14+$15}' /proc/$spid/stat)
  MEMBERS= /work/shared/bench/exp_a_manyfiles.sh lograid-p$P-$mode $d/mnt $N $rep 2>&1 | grep -E "many-files|big-file"
  c1=$(awk '{print $14+$15}' /proc/$spid/stat)
  echo "  $mode rep$rep server CPU $(( (c1-c0) ))  ticks; load $(cut -d' ' -f1 /proc/loadavg)"
  umount $d/mnt; $L detach $dev --state-dir $d/state 2>/dev/null
  kill -TERM $spid; wait $spid; grep -o "unmounted.*" $d/serve.log
done; done
echo $old_dr > /proc/sys/vm/dirty_ratio; echo $old_dbr > /proc/sys/vm/dirty_background_ratio
rm -rf $W/p
