#!/bin/bash
set -u
# needs /dev/shm/src14 (14 MiB of random bytes); made here if missing
[ -f /dev/shm/src14 ] || head -c $((14<<20)) /dev/urandom > /dev/shm/src14
d=/var/tmp/prof/b; rm -rf $d; mkdir -p $d/mnt
devs=""
for i in 0 1 2; do truncate -s 4G $d/m$i.img; devs="$devs $(losetup --direct-io=on -f --show $d/m$i.img)"; done
mkfs.btrfs -q -f -d raid5 -m raid1 $devs >/dev/null 2>&1 && mount ${devs%% *} $d/mnt 2>/dev/null || mount $(echo $devs | cut -d' ' -f1) $d/mnt
echo $((512<<20)) > /proc/sys/vm/dirty_bytes; echo $((128<<20)) > /proc/sys/vm/dirty_background_bytes
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 8
read -r _ u n s i w x y z _ < /proc/stat; t0=$((u+n+s+x+y+z))
s0=$(date +%s.%N)
${PERF:-} bash -ec "for i in \$(seq 1 147); do cp /dev/shm/src14 $d/mnt/f\$i; done; sync -f $d/mnt/f1"
s1=$(date +%s.%N)
read -r _ u n s i w x y z _ < /proc/stat; t1=$((u+n+s+x+y+z))
python3 -c "print('btrfs raid5 many files %.0f MB/s; machine %.2f s/GB' % (147*14*2**20/($s1-$s0)/1e6, ($t1-$t0)/100/(147*14*2**20/1e9)))"
umount $d/mnt; for l in $devs; do losetup -d $l; done
echo 20 > /proc/sys/vm/dirty_ratio; echo 10 > /proc/sys/vm/dirty_background_ratio
rm -rf $d
