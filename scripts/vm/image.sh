#!/usr/bin/env bash
# Builds the test guest's image from Debian packages and caches it outside the work tree:
# Debian bookworm (minbase) with the bookworm-backports kernel (6.12: ublk_drv, nbd, md, the
# NFS client and 9p are modules there) and the tools the in-guest tests use. The image is
# rebuilt only when this file changes (its hash names the cache entry); older entries are removed.
# One build at a time (a lock in the cache); an entry is built aside and renamed into place
# complete, so a half-built or interrupted image is never used.
#
#   scripts/vm/image.sh [base|peers]   prints the cache entry's directory (root.img, vmlinuz, initrd.img)
#
# Variants: `base` (the default; what the tests use) and `peers`, which adds the kernel RAID
# peers the benchmarks compare against (OpenZFS from DKMS, mdadm, btrfs-progs). As root; needs
# debootstrap (installed if missing). The base image takes about 1.5 minutes on 2 cores; peers
# about 20 (most of it building ZFS).
# Environment: LOGRAID_VM_CACHE (default /var/cache/lograid-vm), DEBIAN_MIRROR.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
cache=${LOGRAID_VM_CACHE:-/var/cache/lograid-vm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
variant=${1:-base}
case $variant in
    base) extra= ;;
    peers) extra="linux-headers-amd64 zfs-dkms zfsutils-linux mdadm btrfs-progs" ;;
    *) echo "vm image: unknown variant $variant (base, peers)" >&2; exit 2 ;;
esac
key=$variant-$(sha256sum "$here/image.sh" | cut -c1-16)
entry=$cache/$key
if [ -f "$entry/done" ]; then echo "$entry"; exit 0; fi

log() { echo "vm image: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
mkdir -p "$cache"
exec 9> "$cache/.lock"
flock 9
if [ -f "$entry/done" ]; then echo "$entry"; exit 0; fi   # built while we waited
command -v debootstrap >/dev/null || {
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
# Under the lock nothing else builds: a build.* left here was interrupted (--one-file-system:
# never into a /dev or /sys still bound inside it).
find "$cache" -mindepth 1 -maxdepth 1 -name "build.*" -exec rm -rf --one-file-system {} + 2>/dev/null || true
find "$cache" -mindepth 1 -maxdepth 1 -name "$variant-*" -not -name "$key" -exec rm -rf {} +
rm -rf "$entry"
work=$(mktemp -d "$cache/build.XXXXXX")
root=$work/rootfs
built=$work/entry
mkdir -p "$built"
cleanup() {
    set +e
    for d in dev/pts dev sys proc; do
        mountpoint -q "$root/$d" 2>/dev/null && { umount "$root/$d" || umount -l "$root/$d"; }
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

t0=$(date +%s)
log "debootstrap bookworm (about 4 minutes)"
debootstrap --variant=minbase \
    --include=kmod,udev,netbase,iproute2,procps,psmisc,util-linux,e2fsprogs,xfsprogs,initramfs-tools,nbd-client,nfs-common,fio \
    bookworm "$root" "$mirror" > "$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }

log "the bookworm-backports kernel${extra:+ and $extra}"
echo "deb $mirror bookworm main contrib" > "$root/etc/apt/sources.list"
echo "deb $mirror bookworm-backports main contrib" >> "$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf"
for d in proc sys dev dev/pts; do mount --bind "/$d" "$root/$d"; done
chroot "$root" sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends -t bookworm-backports linux-image-amd64 '"$extra"' && apt-get clean' \
    > "$work/kernel.log" 2>&1 || { tail -20 "$work/kernel.log" >&2; exit 1; }
for d in dev/pts dev sys proc; do umount "$root/$d"; done

# PID 1: mounts the share the host passes (9p tag "share") and runs its init.sh; the tests
# and the lograid binary live there, so changing them does not rebuild this image.
cat > "$root/sbin/lograid-vm-init" <<'INIT'
#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
modprobe 9pnet_virtio; modprobe 9p
mkdir -p /mnt/share
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 share /mnt/share && [ -x /mnt/share/init.sh ]; then
    exec /mnt/share/init.sh
fi
echo "lograid-vm-init: no share with init.sh; powering off"
echo o > /proc/sysrq-trigger
INIT
chmod 755 "$root/sbin/lograid-vm-init"
echo "/dev/vda / ext4 rw 0 1" > "$root/etc/fstab"
echo lograid-vm > "$root/etc/hostname"
kv=$(ls "$root"/boot/vmlinuz-* | sed 's|.*/vmlinuz-||' | sort -V | tail -1)
case $kv in 6.1[0-9]*|6.[2-9][0-9]*) ;; *) log "expected the 6.12 backports kernel, got $kv"; exit 1 ;; esac
cp "$root/boot/vmlinuz-$kv" "$built/vmlinuz"
cp "$root/boot/initrd.img-$kv" "$built/initrd.img"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
mkfs.ext4 -q -F -L lograid-vm -d "$root" "$built/root.img" 3G >&2   # stdout is the answer
echo "$kv" > "$built/kernel"
touch "$built/done"
mv "$built" "$entry"
log "built in $(( $(date +%s) - t0 )) s: kernel $kv, $entry"
echo "$entry"
