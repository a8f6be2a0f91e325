# `lograid serve --ublk` in the guest: the pool on the three virtio disks, each volume a kernel
# block device /dev/ublkbN served by the server itself (ublk_drv, io_uring).
#  1. fio with verification on the raw device (many requests in flight), write-zeroes and
#     discard; ext4 on vol0 and xfs on vol1 written with fsync and O_DIRECT, read back after
#     dropping caches and after a clean restart of the server (same /dev/ublkbN), fsck clean;
#     a read-only volume is a read-only device; nothing left in /dev after a clean stop.
#  2. Write-through (the default): the server SIGKILLed during fsync'd writes to both mounted
#     filesystems and started again, three times: the devices are recovered under the same
#     names, the writers only pause, every fsync'd file is intact without unmounting, fsck
#     clean after.
#  3. --ublk-write-cache: the same kill; the devices' I/O fails (their lost cache makes a
#     recovery unsafe), the filesystems are unmounted; after the restart the journals replay,
#     every file fsync'd before the kill is intact, fsck clean.
#  4. Bad states: no permission, a wanted id that another server has, a stop under a mounted
#     filesystem (a warning, no hang, nothing left once it is unmounted).
. "$SHARE/lib.sh"
M0=/mnt/u0 M1=/mnt/u1
mkdir -p $M0 $M1
export RUST_LOG=info

check "modprobe ublk_drv" modprobe ublk_drv
check "create the pool on the virtio disks" $LOGRAID create --parity 1 --volume vol0:256M $DISKS
check "a second volume (xfs needs 300 MiB)" $LOGRAID volume create --size 320M vol1 $DISKS

SERVER=
# serve ARGS...: starts `lograid serve --ublk ARGS` on the disks, waits until it says where
# the devices are, and sets D0, D1 (the devices of vol0 and vol1).
serve() {
    : > $WORK/serve.out
    $LOGRAID serve --ublk --socket $WORK/nbd.sock "$@" $DISKS > $WORK/serve.out 2>> $WORK/serve.log &
    SERVER=$!
    for _ in $(seq 600); do
        if grep -q "^stop with" $WORK/serve.out; then
            D0=$(awk "/volume 'vol0'/ {print \$1}" $WORK/serve.out)
            D1=$(awk "/volume 'vol1'/ {print \$1}" $WORK/serve.out)
            [ -b "$D0" ] && [ -b "$D1" ] && return 0
        fi
        kill -0 $SERVER 2>/dev/null || { tail -5 $WORK/serve.log; return 1; }
        sleep 0.2
    done
    echo "no devices after 120 s"; tail -5 $WORK/serve.log; return 1
}
# stop: SIGTERM, and the server's status.
stop() { kill -TERM $SERVER && wait $SERVER; }
# write_file DIR NAME MIB: random data, fsync'd; its sum in $WORK/NAME.md5 once fsync returned.
write_file() {
    dd if=/dev/urandom of=$1/$2 bs=256k count=$(($3 * 4)) conv=fsync status=none && md5 $1/$2 > $WORK/$2.md5
}
# files_intact DIR NAME...: each file's sum as write_file recorded it, read from the device.
files_intact() {
    dir=$1; shift
    drop_caches
    for f in "$@"; do [ "$(md5 $dir/$f)" = "$(cat $WORK/$f.md5)" ] || { echo "$f differs"; return 1; }; done
}
# writer DIR PREFIX COUNT: COUNT fsync'd 1 MiB files, one after another; stops at the first error.
writer() {
    for i in $(seq $3); do write_file $1 $2$i 1 || return 1; done
}
# written PREFIX COUNT: the names of those files whose fsync returned.
written() {
    for i in $(seq $2); do [ -f $WORK/$1$i.md5 ] && echo $1$i; done
}
mount_both() { mount $D0 $M0 && mount $D1 $M1; }
no_devices_left() {
    for _ in $(seq 50); do
        [ -z "$(ls /dev/ublkb* /dev/ublkc* 2>/dev/null)" ] && return 0
        sleep 0.2
    done
    ls -l /dev/ublk*; return 1
}

# --- 1. Function, clean stop and restart -------------------------------------------------------
check "serve --ublk --read-only-volume vol1" serve --read-only-volume vol1
echo "devices: $D0 $D1"
[ "$(blockdev --getsize64 $D0)" = $((256 << 20)) ] && ok "$D0 is 256 MiB" || fail "$D0 size"
[ "$(blockdev --getro $D1)" = 1 ] && ok "the read-only volume's $D1 is read-only" || fail "$D1 not read-only"
[ "$(blockdev --getss $D0)/$(blockdev --getpbsz $D0)" = 512/4096 ] && ok "512-byte logical, 4 KiB physical blocks" \
    || fail "block sizes $(blockdev --getss $D0)/$(blockdev --getpbsz $D0)"
q=/sys/block/${D0#/dev/}/queue
[ "$(cat $q/max_hw_sectors_kb)/$(cat $q/discard_granularity)/$(cat $q/write_zeroes_max_bytes)" = 1024/4096/1073741824 ] \
    && ok "1 MiB requests, 4 KiB discard granularity, 1 GiB write-zeroes" \
    || fail "limits $(cat $q/max_hw_sectors_kb)/$(cat $q/discard_granularity)/$(cat $q/write_zeroes_max_bytes)"
[ "$(cat $q/write_cache)" = "write through" ] && ok "no volatile write cache (write-through)" || fail "cache: $(cat $q/write_cache)"
check "fio randwrite QD16 with verify on the raw device" \
    fio --name=raw --filename=$D0 --size=24M --bs=64k --rw=randwrite --ioengine=libaio --iodepth=16 \
        --direct=1 --verify=crc32c --verify_fatal=1 --output=$WORK/fio-raw.txt
check "write-zeroes (blkdiscard -z)" blkdiscard -z -o 1M -l 2M $D0
check "zeroed range reads zero" cmp -n $((2 << 20)) <(dd if=$D0 bs=1M skip=1 count=2 iflag=direct status=none) /dev/zero
check "discard (blkdiscard)" blkdiscard -o 4M -l 4M $D0
check "stop (SIGTERM)" stop
check "nothing left in /dev" no_devices_left
OLD0=$D0
check "serve --ublk again (both writable)" serve
[ "$D0" = "$OLD0" ] && ok "vol0 is $D0 again" || fail "vol0 moved from $OLD0 to $D0"
check "mkfs.ext4 on $D0" mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 $D0
check "mkfs.xfs on $D1" mkfs.xfs -q -f $D1
check "mount ext4" mount $D0 $M0
check "mount xfs" mount $D1 $M1
for m in $M0 $M1; do
    check "write with fsync on $m" write_file $m a-${m##*/} 8
    check "write with O_DIRECT on $m (dd)" dd if=/dev/urandom of=$m/d-${m##*/} bs=64k count=64 oflag=direct status=none
    md5 $m/d-${m##*/} > $WORK/d-${m##*/}.md5
    check "fio O_DIRECT writes with fsync and verify on $m" \
        fio --name=fs --directory=$m --size=8M --bs=16k --rw=randwrite --ioengine=psync --direct=1 \
            --fsync=8 --verify=crc32c --verify_fatal=1 --output=$WORK/fio-${m##*/}.txt
done
check "files intact after dropping caches (ext4)" files_intact $M0 a-u0 d-u0
check "files intact after dropping caches (xfs)" files_intact $M1 a-u1 d-u1
check "umount both" umount $M0 $M1
check "fsck.ext4 clean" fsck.ext4 -f -n $D0
check "xfs_repair clean" xfs_repair -n $D1
check "stop (SIGTERM)" stop
check "nothing left in /dev" no_devices_left
check "serve --ublk again" serve
check "mount both again" mount_both
check "files intact after a clean restart (ext4)" files_intact $M0 a-u0 d-u0
check "files intact after a clean restart (xfs)" files_intact $M1 a-u1 d-u1 d-u1

# A second server on another pool beside the first: its own ids, or a clear error for one
# the first has.
OTHER="/var/tmp/o0.img /var/tmp/o1.img /var/tmp/o2.img"
check "a second pool on files" $LOGRAID create --size 128M --volume x:16M $OTHER
$LOGRAID serve --ublk --ublk-id-base 0 --socket $WORK/o.sock $OTHER > $WORK/o.out 2> $WORK/o.err
grep -q "/dev/ublkb0 is taken by another ublk server (pid $SERVER)" $WORK/o.err \
    && ok "--ublk-id-base 0 refused: $(grep -o '/dev/ublkb0 is taken[^;]*' $WORK/o.err)" || fail "id taken: $(tail -3 $WORK/o.err)"
$LOGRAID serve --ublk --ublk-id-base 5 --ublk-queues 1 --ublk-depth 2 --socket $WORK/o.sock $OTHER \
    > $WORK/o.out 2> $WORK/o.err & other=$!
for _ in $(seq 300); do grep -q "^stop with" $WORK/o.out && break; sleep 0.2; done
grep -q "/dev/ublkb5 .*volume 'x'" $WORK/o.out && [ -b /dev/ublkb5 ] && ok "a second server's volume is /dev/ublkb5" \
    || fail "second server: $(cat $WORK/o.out; tail -3 $WORK/o.err)"
check "one queue of depth 2: fio randrw QD8 with verify" \
    fio --name=small --filename=/dev/ublkb5 --size=8M --bs=4k --rw=randrw --ioengine=libaio --iodepth=8 \
        --direct=1 --verify=crc32c --verify_fatal=1 --output=$WORK/fio-small.txt
kill -TERM $other; wait $other
[ $? = 0 ] && ! [ -e /dev/ublkb5 ] && ok "the second server stops cleanly" || fail "the second server's stop"


# --- 2. Write-through: killed under load (three times), recovered under the mounted filesystems
OLD0=$D0 OLD1=$D1
writer $M0 k0- 30 > $WORK/writer0.log 2>&1 & w0=$!
writer $M1 k1- 30 > $WORK/writer1.log 2>&1 & w1=$!
for round in 1 2 3; do
    n=$((round * 7 - 4))
    for _ in $(seq 900); do
        [ -f $WORK/k0-$n.md5 ] && [ -f $WORK/k1-$n.md5 ] && break
        kill -0 $w0 2>/dev/null || kill -0 $w1 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL $SERVER && ok "server SIGKILLed during fsync'd writes to both filesystems (round $round)" \
        || fail "SIGKILL the server (round $round): it was not running"
    wait $SERVER 2>/dev/null
    sleep 1
    [ -b $OLD0 ] && ok "$OLD0 stays while no server runs" || fail "$OLD0 vanished"
    check "server started again" serve
    grep -q "recovered from the previous server" $WORK/serve.out && ok "it says it recovered the devices" \
        || fail "no recovery in: $(cat $WORK/serve.out)"
    [ "$D0 $D1" = "$OLD0 $OLD1" ] && ok "the same devices ($D0 $D1)" || fail "devices moved: $OLD0 $OLD1 -> $D0 $D1"
done
check "the ext4 writer finishes without an error" wait $w0
check "the xfs writer finishes without an error" wait $w1
check "every fsync'd file intact, still mounted (ext4)" files_intact $M0 a-u0 d-u0 $(written k0- 30)
check "every fsync'd file intact, still mounted (xfs)" files_intact $M1 a-u1 d-u1 $(written k1- 30)
[ "$(written k0- 30 | wc -l)" = 30 ] && [ "$(written k1- 30 | wc -l)" = 30 ] && ok "all 30 files written on each" \
    || fail "only $(written k0- 30 | wc -l) and $(written k1- 30 | wc -l) files"
check "umount both" umount $M0 $M1
check "fsck.ext4 clean after the recovery" fsck.ext4 -f -n $D0
check "xfs_repair clean after the recovery" xfs_repair -n $D1
check "stop (SIGTERM)" stop
check "nothing left in /dev" no_devices_left

# --- 3. Write cache: killed under load; I/O fails; journals replay after the restart ----------
check "serve --ublk --ublk-write-cache" serve --ublk-write-cache
[ "$(cat /sys/block/${D0#/dev/}/queue/write_cache)/$(cat /sys/block/${D0#/dev/}/queue/fua)" = "write back/1" ] \
    && ok "a volatile write cache with FUA" || fail "cache: $(cat /sys/block/${D0#/dev/}/queue/write_cache)"
check "mount both" mount_both
check "write before the kill (ext4)" write_file $M0 c-u0 4
check "write before the kill (xfs)" write_file $M1 c-u1 4
writer $M0 w0- 40 > $WORK/writer0.log 2>&1 & w0=$!
writer $M1 w1- 40 > $WORK/writer1.log 2>&1 & w1=$!
for _ in $(seq 600); do [ -f $WORK/w0-2.md5 ] && [ -f $WORK/w1-2.md5 ] && break; sleep 0.2; done
kill -KILL $SERVER && ok "write-cache server SIGKILLed during fsync'd writes" || fail "SIGKILL the write-cache server: it was not running"
wait $SERVER 2>/dev/null
wait $w0 && fail "the ext4 writer saw no error" || ok "the ext4 writer fails (the device is gone)"
wait $w1 && fail "the xfs writer saw no error" || ok "the xfs writer fails (the device is gone)"
umount $M0; umount $M1
check "nothing of ours still mounted" sh -c "! grep -q ublkb /proc/mounts"
check "server started again (write cache)" serve --ublk-write-cache
check "mount ext4 (its journal replays)" mount $D0 $M0
check "mount xfs (its log replays)" mount $D1 $M1
check "files fsync'd before the kill intact (ext4)" files_intact $M0 a-u0 d-u0 c-u0 $(written k0- 30) $(written w0- 40)
check "files fsync'd before the kill intact (xfs)" files_intact $M1 a-u1 d-u1 c-u1 $(written k1- 30) $(written w1- 40)
check "umount both" umount $M0 $M1
check "fsck.ext4 clean after the kill" fsck.ext4 -f -n $D0
check "xfs_repair clean after the kill" xfs_repair -n $D1
check "stop (SIGTERM)" stop
check "nothing left in /dev" no_devices_left

# --- 4. Bad states ----------------------------------------------------------------------------
cp $LOGRAID /tmp/lograid-any && chmod 755 /tmp/lograid-any
setpriv --reuid=65534 --regid=65534 --clear-groups /tmp/lograid-any serve --ublk --socket /tmp/x.sock $DISKS \
    > /dev/null 2> $WORK/nobody.err
grep -q "permission denied" $WORK/nobody.err && ok "not root: $(grep -o 'error: .*' $WORK/nobody.err)" \
    || fail "not root: $(cat $WORK/nobody.err)"
check "serve --ublk" serve
check "mount ext4" mount $D0 $M0
check "write with fsync" write_file $M0 e-u0 2
: > $WORK/serve.log
check "stop (SIGTERM) under the mounted filesystem ends" stop
grep -q "stopping a device with a filesystem mounted on it" $WORK/serve.log && ok "it warns about the mount" \
    || fail "no warning about the mount"
umount $M0
check "nothing left in /dev once unmounted" no_devices_left
finish
