#!/bin/bash
# many-any.sh STACK [WARM=1]: 147 x 14 MiB cp'd into a fresh filesystem on STACK
# (lograid-p1 | lograid-p0 | btrfs-raid5 | bare), timed including sync -f.
# Caches dropped, 8 s of quiet; with WARM=1, 6 GiB written to and deleted from
# tmpfs right before the timed loop (so the page cache gets recently freed memory).
set -eu
L=${L:-/work/main/target/release/lograid}
stack=$1; d=/var/tmp/prof/s; rm -rf $d; mkdir -p $d/mnt
src=/dev/shm/src14; [ -f $src ] || head -c $((14<<20)) /dev/urandom > $src
spid=; devs=; dev=
case $stack in
lograid-p*) P=${stack#lograid-p}
  $L create --parity $P --size 4G --volume vol0:6G $d/m0.img $d/m1.img $d/m2.img >/dev/null
  $L serve $d/m0.img $d/m1.img $d/m2.img --listen 127.0.0.1:10902 --fuse $d/files > $d/serve.log 2>&1 &
  spid=$!; sleep 1.5
  dev=$($L attach --file $d/files/vol0 --state-dir $d/state)
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 $dev; mount $dev $d/mnt;;
btrfs-raid5)
  for i in 0 1 2; do truncate -s 4G $d/m$i.img; devs="$devs $(losetup --direct-io=on -f --show $d/m$i.img)"; done
  mkfs.btrfs -q -f -d raid5 -m raid1 $devs >/dev/null; mount $(echo $devs | cut -d' ' -f1) $d/mnt;;
bare)
  truncate -s 4G $d/m0.img; devs=$(losetup --direct-io=on -f --show $d/m0.img)
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 $devs; mount $devs $d/mnt;;
esac
echo $((512<<20)) > /proc/sys/vm/dirty_bytes; echo $((128<<20)) > /proc/sys/vm/dirty_background_bytes
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 8
[ "${WARM:-0}" = 1 ] && { head -c 6G /dev/zero > /dev/shm/warm; rm /dev/shm/warm; }
s0=$(date +%s.%N)
for i in $(seq 1 147); do cp $src $d/mnt/f$i; done; sync -f $d/mnt/f1
s1=$(date +%s.%N)
python3 -c "print('$stack warm=${WARM:-0}: many files %.0f MB/s' % (147*14*2**20/($s1-$s0)/1e6))"
umount $d/mnt
[ -n "$dev" ] && $L detach $dev --state-dir $d/state >/dev/null
[ -n "$spid" ] && { kill -TERM $spid; while kill -0 $spid 2>/dev/null; do sleep 0.2; done; }
for l in $devs; do losetup -d $l; done
echo 20 > /proc/sys/vm/dirty_ratio; echo 10 > /proc/sys/vm/dirty_background_ratio
rm -rf $d
