#!/usr/bin/env bash
# A manual check, not part of test-all.sh: the Linux kernel's NFS client on `lograid serve --nfs`,
# in a Debian guest under qemu (TCG: this machine's KVM cannot run a stock kernel), reaching the
# server on the host's loopback through qemu's user network (10.0.2.2). In the guest: mount the
# export, a loop device with direct I/O on /vol0, mkfs.ext4, write; the host SIGKILLs the server
# while a 96 MiB copy is in flight and starts it again on the same port; the guest writes on,
# syncs, unmounts, runs fsck.ext4 -f -n and checks every file's MD5. Prints the RESULT lines.
#
#   scripts/vm-nfs-check.sh [LOGRAID_BINARY]     (root; about 5 min the first time: debootstrap)
# Work directory: $VM_DIR (default /var/tmp/lograid-nfs-vm); the guest's root is built once.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/lograid}")
VM=${VM_DIR:-/var/tmp/lograid-nfs-vm}
PORT=20499
mkdir -p "$VM"; cd "$VM"
command -v qemu-system-x86_64 >/dev/null && command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86 debootstrap >/dev/null
if [ ! -x rootfs/sbin/mount.nfs ]; then
    rm -rf rootfs
    debootstrap --variant=minbase --include=kmod,udev,nfs-common,e2fsprogs,iproute2,procps,util-linux,initramfs-tools,busybox,linux-image-amd64 \
        bookworm rootfs http://deb.debian.org/debian > debootstrap.log
    cp /etc/protocols /etc/services rootfs/etc/   # mount.nfs needs them (netbase is not in minbase)
fi
cat > rootfs/sbin/h-vminit <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys 2>/dev/null; mount -t devtmpfs dev /dev 2>/dev/null
mount -o remount,rw /
for m in virtio_net nfs nfsv3 loop ext4; do modprobe $m 2>/dev/null; done
ip link set lo up
for n in /sys/class/net/*; do i=$(basename $n); [ "$i" = lo ] && continue; ip link set $i up; ip addr add 10.0.2.15/24 dev $i; done
ip route add default via 10.0.2.2
sh /root/nfs-test.sh > /dev/ttyS0 2>&1
echo "=== guest done"; sync; echo o > /proc/sysrq-trigger
EOF
cat > rootfs/root/nfs-test.sh <<EOF
#!/bin/sh
P=$PORT
EOF
cat >> rootfs/root/nfs-test.sh <<'EOF'
mkdir -p /mnt/nfs /mnt/fs
mount -t nfs -o vers=3,proto=tcp,port=$P,mountport=$P,mountproto=tcp,nolock,hard 10.0.2.2:/ /mnt/nfs && echo "RESULT mount ok"
stat -c 'RESULT vol0: %s bytes, %A' /mnt/nfs/vol0
dev=$(losetup --find --show --direct-io=on /mnt/nfs/vol0) && echo "RESULT loop $dev"
mkfs.ext4 -q -F $dev && mount $dev /mnt/fs && echo "RESULT ext4 mounted"
dd if=/dev/urandom of=/mnt/fs/a bs=1M count=48 status=none; sync
A=$(md5sum < /mnt/fs/a)
dd if=/dev/urandom of=/root/src bs=1M count=96 status=none
S=$(md5sum < /root/src)
echo "RESULT copy starts $(date +%s)"
(cp /root/src /mnt/fs/c; sync; echo "RESULT copy synced $(date +%s)") &
sleep 2
echo "KILL-NOW $(date +%s)"
wait
dd if=/dev/urandom of=/mnt/fs/b bs=1M count=16 status=none; sync
B=$(md5sum < /mnt/fs/b)
umount /mnt/fs && echo "RESULT umount ok"
fsck.ext4 -f -n $dev > /dev/null 2>&1; echo "RESULT fsck rc=$?"
mount $dev /mnt/fs
[ "$(md5sum < /mnt/fs/a)" = "$A" ] && [ "$(md5sum < /mnt/fs/b)" = "$B" ] && echo "RESULT files before and after ok" || echo "RESULT files before and after FAIL"
[ "$(md5sum < /mnt/fs/c)" = "$S" ] && echo "RESULT copy across the kill ok" || echo "RESULT copy across the kill FAIL"
umount /mnt/fs; losetup -d $dev; umount /mnt/nfs && echo "RESULT nfs umount ok"
EOF
chmod +x rootfs/sbin/h-vminit rootfs/root/nfs-test.sh
rm -f root.img; mkfs.ext4 -q -F -L vmroot -d rootfs root.img 3G
rm -rf pool; mkdir pool
"$BIN" create --size 1G --parity 1 --volume vol0:512M pool/m0.img pool/m1.img pool/m2.img > create.log
serve() {
    RUST_LOG=info "$BIN" serve pool/m0.img pool/m1.img pool/m2.img --listen 127.0.0.1:0 --nfs 127.0.0.1:$PORT >> serve.log 2>&1 &
    echo $! > serve.pid
}
: > serve.log; serve; sleep 2
KV=$(ls rootfs/boot/vmlinuz-* | sed 's|.*/vmlinuz-||' | sort -V | tail -1)
timeout 1800 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 2048 -nographic -no-reboot \
    -kernel rootfs/boot/vmlinuz-$KV -initrd rootfs/boot/initrd.img-$KV \
    -append "console=ttyS0 root=/dev/vda rw init=/sbin/h-vminit panic=-1 loglevel=5" \
    -drive file=root.img,format=raw,if=virtio,cache=unsafe \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0 < /dev/null > console.log 2>&1 &
QEMU=$!
killed=0
while kill -0 $QEMU 2>/dev/null; do
    if [ $killed = 0 ] && grep -q "^KILL-NOW" console.log; then
        kill -9 "$(cat serve.pid)"; echo "host: server SIGKILLed at $(date +%s)"
        sleep 3; serve; echo "host: server started again at $(date +%s)"
        killed=1
    fi
    sleep 1
done
grep -E "^RESULT|^KILL-NOW|nfs: server" console.log || true
kill -TERM "$(cat serve.pid)"; wait "$(cat serve.pid)" 2>/dev/null || true
grep -E "NFS server stopped|closed cleanly" serve.log || true
