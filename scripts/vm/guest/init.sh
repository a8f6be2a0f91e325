#!/bin/sh
# The guest's init (PID 1, started by the image's /sbin/lograid-vm-init from the 9p share at
# /mnt/share): sets up the guest, runs each test named in tests.list with its output in
# out/NAME.log and its status in out/NAME.rc, then powers the guest off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
hostname lograid-vm
modprobe virtio_net; ip link set lo up
for n in /sys/class/net/*; do
    i=${n##*/}; [ "$i" = lo ] && continue
    ip link set "$i" up; ip addr add 10.0.2.15/24 dev "$i"
done
ip route add default via 10.0.2.2
echo "vm guest: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s"
S=/mnt/share
. $S/env
disks=$(echo b c d e f g h i j k l m n o p | cut -d' ' -f1-$DISK_COUNT | sed 's|\([a-p]\)|/dev/vd\1|g')
for t in $(cat $S/tests.list); do
    start=$(cut -d. -f1 /proc/uptime)
    echo "vm guest: test $t"
    mkdir -p /tmp/work-$t
    (cd /tmp/work-$t && WORK=/tmp/work-$t LOGRAID=$S/bin/lograid DISKS="$disks" \
        SHARE=$S timeout $TEST_TIMEOUT bash $S/tests/$t.sh) > $S/out/$t.log 2>&1
    echo $? > $S/out/$t.rc
    echo $(( $(cut -d. -f1 /proc/uptime) - start )) > $S/out/$t.seconds
    echo "vm guest: test $t: status $(cat $S/out/$t.rc)"
done
touch $S/out/done
sync
echo "vm guest: powering off"
echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger
sleep 60
