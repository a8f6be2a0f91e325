#!/bin/bash
# many-files phase with a whole-machine profile: P=0|1
set -u
L=${L:-/work/main/target/release/lograid}
P=${P:-1}; d=/var/tmp/prof/p; rm -rf $d; mkdir -p $d/mnt
$L create --parity $P --size 4G --volume vol0:6G $d/m0.img $d/m1.img $d/m2.img >/dev/null 2>&1
$L serve $d/m0.img $d/m1.img $d/m2.img --listen 127.0.0.1:10902 --fuse $d/files > $d/serve.log 2>&1 &
spid=$!; sleep 1.5
dev=$($L attach --file $d/files/vol0 --state-dir $d/state 2>/dev/null)
case ${FS:-ext4} in ext4) mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 $dev;; xfs) mkfs.xfs -q -f $dev;; btrfs) mkfs.btrfs -q -f $dev >/dev/null;; esac; mount $dev $d/mnt
head -c $((14<<20)) /dev/urandom > /dev/shm/src14
ob=$(cat /proc/sys/vm/dirty_bytes); obg=$(cat /proc/sys/vm/dirty_background_bytes); ora=$(cat /proc/sys/vm/dirty_ratio); obr=$(cat /proc/sys/vm/dirty_background_ratio)
echo $((512<<20)) > /proc/sys/vm/dirty_bytes; echo $((128<<20)) > /proc/sys/vm/dirty_background_bytes
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 8
read -r _ u n s i w x y z _ < /proc/stat; t0=$((u+n+s+x+y+z)); c0=$(awk '{print $14+$15}' /proc/$spid/stat)
s0=$(date +%s.%N)
${PERF:-} bash -ec "for i in \$(seq 1 147); do cp /dev/shm/src14 $d/mnt/f\$i; done; sync -f $d/mnt/f1"
s1=$(date +%s.%N)
read -r _ u n s i w x y z _ < /proc/stat; t1=$((u+n+s+x+y+z)); c1=$(awk '{print $14+$15}' /proc/$spid/stat)
python3 -c "print('${FS:-ext4} P=$P many files %.0f MB/s; machine %.2f s/GB server %.2f s/GB' % (147*14*2**20/($s1-$s0)/1e6, ($t1-$t0)/100/(147*14*2**20/1e9), ($c1-$c0)/100/(147*14*2**20/1e9)))"
umount $d/mnt; $L detach $dev --state-dir $d/state >/dev/null 2>&1
kill -TERM $spid; while kill -0 $spid 2>/dev/null; do sleep 0.2; done
echo $ob > /proc/sys/vm/dirty_bytes; echo $obg > /proc/sys/vm/dirty_background_bytes
[ "$ob" = 0 ] && echo $ora > /proc/sys/vm/dirty_ratio; [ "$obg" = 0 ] && echo $obr > /proc/sys/vm/dirty_background_ratio
rm -rf $d
