# The NFS export through the Linux kernel's NFS client: `lograid serve --nfs` on the host, the
# export mounted in the guest over the network, its volume file on a direct-I/O loop device,
# ext4 on that. The server is SIGKILLed while a copy is in flight and started again on the same
# port: the hard mount resends what was not committed, and fsck and every file's sum are clean.
. "$SHARE/lib.sh"
P=$NFS_PORT
host lograid create --size 1G --parity 1 --volume vol0:512M nfs-m0 nfs-m1 nfs-m2 || fail "create the pool on the host"
SERVE="serve nfs $P nfs-m0 nfs-m1 nfs-m2 --listen 127.0.0.1:0 --nfs 127.0.0.1:$P"
host $SERVE || fail "start the server"
modprobe nfs; modprobe nfsv3; modprobe loop
mkdir -p /mnt/nfs /mnt/fs
check "mount the export" mount -t nfs -o vers=3,proto=tcp,port=$P,mountport=$P,mountproto=tcp,nolock,hard \
    $HOST:/ /mnt/nfs
size=$(stat -c %s /mnt/nfs/vol0)
[ "$size" = $((512 << 20)) ] && ok "vol0 is 512 MiB" || fail "vol0 is $size bytes"
dev=$(losetup --find --show --direct-io=on /mnt/nfs/vol0) && ok "loop device $dev" || fail "losetup"
check "mkfs.ext4" mkfs.ext4 -q -F "$dev"
check "mount ext4" mount "$dev" /mnt/fs
check "write a (24 MiB, fsync)" dd if=/dev/urandom of=/mnt/fs/a bs=1M count=24 conv=fsync status=none
A=$(md5 /mnt/fs/a)
dd if=/dev/urandom of=$WORK/src bs=1M count=48 status=none
S=$(md5 $WORK/src)
copy_across_kill $WORK/src /mnt/fs/c nfs $SERVE
check "write b (8 MiB, fsync)" dd if=/dev/urandom of=/mnt/fs/b bs=1M count=8 conv=fsync status=none
B=$(md5 /mnt/fs/b)
# The studies' many 14 MB files (as a photo library's), through the same path.
head -c 14M /dev/urandom > $WORK/photo
P14=$(md5 $WORK/photo)
mkdir -p /mnt/fs/photos
for i in $(seq 12); do cp $WORK/photo /mnt/fs/photos/$i.jpg; done
sync && ok "12 files of 14 MB written and synced" || fail "sync the 14 MB files"
check "umount ext4" umount /mnt/fs
check "fsck.ext4 clean" fsck.ext4 -f -n "$dev"
drop_caches
mount "$dev" /mnt/fs
[ "$(md5 /mnt/fs/a)" = "$A" ] && [ "$(md5 /mnt/fs/b)" = "$B" ] && ok "files before and after the restart intact" ||
    fail "files before and after the restart"
[ "$(md5 /mnt/fs/c)" = "$S" ] && ok "the file copied across the restart intact" || fail "the file copied across the restart"
bad=0; for i in $(seq 12); do [ "$(md5 /mnt/fs/photos/$i.jpg)" = "$P14" ] || bad=$((bad + 1)); done
[ $bad = 0 ] && ok "the 14 MB files intact" || fail "$bad of the 14 MB files differ"
umount /mnt/fs; losetup -d "$dev"
check "umount the export" umount /mnt/nfs
host stop nfs && ok "server stopped cleanly" || fail "server stop"
finish
