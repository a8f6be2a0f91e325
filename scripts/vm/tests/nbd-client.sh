# The Linux kernel's NBD client (nbd-client, /dev/nbd0) against `lograid serve` on the host,
# over the guest's network: ext4 made, written with fsync, checked; the client disconnected and
# connected again (one connection, then four with -C 4); the server SIGKILLed under a connected
# client during fsync'd writes and started again: nothing acknowledged is lost.
. "$SHARE/lib.sh"
P=$NBD_PORT
host lograid create --size 1G --parity 1 --volume vol0:512M nbd-m0 nbd-m1 nbd-m2 || fail "create the pool on the host"
SERVE="serve nbd $P nbd-m0 nbd-m1 nbd-m2 --listen 127.0.0.1:$P"
host $SERVE || fail "start the server"
modprobe nbd
mkdir -p /mnt/fs

# connect ARGS...: nbd-client for vol0 on /dev/nbd0, waiting until the device has its size.
connect() {
    nbd-client "$HOST" "$P" /dev/nbd0 -N vol0 "$@" || return 1
    for _ in $(seq 50); do [ "$(blockdev --getsize64 /dev/nbd0)" -gt 0 ] 2>/dev/null && return 0; sleep 0.2; done
    return 1
}
# write_file NAME MIB: random data, fsync'd; remembers its sum in $WORK/NAME.md5.
write_file() {
    dd if=/dev/urandom of=/mnt/fs/$1 bs=1M count=$2 conv=fsync status=none && md5 /mnt/fs/$1 > $WORK/$1.md5
}
# files_intact NAME...: each file's sum matches what write_file recorded, read from the device.
files_intact() {
    drop_caches
    for f in "$@"; do [ "$(md5 /mnt/fs/$f)" = "$(cat $WORK/$f.md5)" ] || { echo "$f differs"; return 1; }; done
}

check "connect (one connection)" connect
[ "$(blockdev --getsize64 /dev/nbd0)" = $((512 << 20)) ] && ok "/dev/nbd0 is 512 MiB" || fail "/dev/nbd0 size"
check "mkfs.ext4" mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/nbd0
check "mount" mount /dev/nbd0 /mnt/fs
check "write with fsync" write_file a 16
check "write with O_DIRECT" dd if=/dev/urandom of=/mnt/fs/d bs=1M count=8 oflag=direct status=none
md5 /mnt/fs/d > $WORK/d.md5
check "umount" umount /mnt/fs
check "disconnect" nbd-client -d /dev/nbd0
sleep 1

check "connect again with four connections (-C 4)" connect -C 4
check "fsck.ext4 clean after reconnecting" fsck.ext4 -f -n /dev/nbd0
check "mount" mount /dev/nbd0 /mnt/fs
check "files intact after reconnecting" files_intact a d
check "write over four connections" write_file b 16
check "umount" umount /mnt/fs
check "disconnect" nbd-client -d /dev/nbd0
sleep 1

# Killed under load and restarted under a connected client. The kernel fails the I/O issued
# while the server is down and shuts the filesystem down: nbd-client 3.24 (Debian 12) sets no
# dead-connection timeout, the only thing that would hold that I/O until a reconnect (ublk's
# user recovery and an NFS hard mount do hold it; see their tests). What lograid must keep is
# every write acknowledged before the kill: after a reconnect, the journal replays, every
# fsync'd file is intact and fsck is clean. (-timeout: without it the I/O in flight at the kill
# waits forever.)
check "connect with -timeout 10" connect -timeout 10
check "mount" mount /dev/nbd0 /mnt/fs
check "write before the kill" write_file c 8
(for i in $(seq 40); do dd if=/dev/urandom of=/mnt/fs/load$i bs=1M count=1 conv=fsync status=none || break; done) &
writer=$!
sleep 3
host kill nbd && ok "server SIGKILLed under a connected client, during fsync'd writes" || fail "SIGKILL the server"
wait $writer
umount /mnt/fs
nbd-client -d /dev/nbd0 > /dev/null 2>&1
sleep 1
host $SERVE && ok "server started again" || fail "start the server again"
check "connect again" connect
check "mount (the journal replays)" mount /dev/nbd0 /mnt/fs
check "files fsync'd before the kill intact" files_intact a b c d
check "write after the restart" write_file f 8
check "files intact after the restart" files_intact a b c d f
check "umount" umount /mnt/fs
check "fsck.ext4 clean after the restart" fsck.ext4 -f -n /dev/nbd0
check "disconnect" nbd-client -d /dev/nbd0
host stop nbd && ok "server stopped cleanly" || fail "server stop"
finish
