# `lograid attach --nfs` / `detach` with the Linux kernel's NFS client: the server on the host,
# the attach in the guest (mount -t nfs under the state directory, a direct-I/O loop device on
# the volume's file, a record), ext4 on the device across a server restart, a second attach
# refused, detach undoing both, the data there on a new attach, and at the server's SIGTERM
# with --nfs-drain, the detach still served before the server stops.
. "$SHARE/lib.sh"
P=$NFS_PORT
ST=$WORK/state
host lograid create --size 1G --parity 1 --volume vol0:512M am0 am1 am2 || fail "create the pool on the host"
SERVE="serve anfs $P am0 am1 am2 --listen 127.0.0.1:0 --nfs 127.0.0.1:$P --nfs-drain 120"
host $SERVE || fail "start the server"
modprobe nfs; modprobe nfsv3; modprobe loop
mkdir -p /mnt/fs
dev=$($LOGRAID attach --nfs $HOST:$P --export vol0 --state-dir $ST) && ok "attach --nfs: $dev" || fail "attach --nfs"
$LOGRAID attach --list --state-dir $ST | grep -q "^$dev	nfs://$HOST:$P/vol0	" && ok "attach --list shows it" || fail "attach --list"
[ "$(cat /sys/block/$(basename $dev)/loop/dio)" = 1 ] && ok "direct I/O" || fail "no direct I/O"
[ "$(losetup -n -O BACK-FILE $dev)" = "$ST/nfs-$P-1/vol0" ] && ok "on the volume's file" || fail "backing file $(losetup -n -O BACK-FILE $dev)"
check "mkfs.ext4" mkfs.ext4 -q -F "$dev"
check "mount ext4" mount "$dev" /mnt/fs
dd if=/dev/urandom of=$WORK/src bs=1M count=32 status=none
S=$(md5 $WORK/src)
copy_across_kill $WORK/src /mnt/fs/c anfs $SERVE
$LOGRAID attach --nfs $HOST:$P --export vol0 --state-dir $ST > /dev/null 2>&1 && fail "a second attach" || ok "a second attach of vol0 refused"
check "umount ext4" umount /mnt/fs
check "detach" $LOGRAID detach "$dev" --state-dir $ST
[ -z "$($LOGRAID attach --list --state-dir $ST)" ] && ok "no record left" || fail "a record left"
grep -q " $ST/" /proc/self/mountinfo && fail "an NFS mount left" || ok "the export unmounted"
losetup -n -O BACK-FILE "$dev" 2>/dev/null | grep -q vol0 && fail "loop device left" || ok "loop device detached"
dev=$($LOGRAID attach --nfs $HOST:$P --state-dir $ST) && ok "attach again (the only volume): $dev" || fail "attach again"
check "fsck.ext4 clean" fsck.ext4 -f -n "$dev"
mount "$dev" /mnt/fs && [ "$(md5 /mnt/fs/c)" = "$S" ] && ok "the file copied across the restart intact" || fail "the copied file"
umount /mnt/fs
# Shutdown: SIGTERM to the server while attached; the detach is still served (the drain).
(host stop anfs > $WORK/stop.out 2>&1; echo $? > $WORK/stop.rc) &
stopper=$!
sleep 3
check "detach while the server drains" $LOGRAID detach "$dev" --state-dir $ST
wait $stopper
[ "$(cat $WORK/stop.rc)" = 0 ] && ok "server stopped cleanly after the detach" || fail "server stop: $(cat $WORK/stop.out)"
finish
