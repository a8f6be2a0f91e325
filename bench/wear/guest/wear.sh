# The in-guest half of bench/wear/wear_run.py: builds one storage stack on the guest's blank
# virtio disks, runs the wear workloads on it and appends one JSON line per measured phase to
# $SHARE/out/wear/results.jsonl. wear_run.py turns it into a test script for scripts/vm/run.sh by
# putting a header of WEAR_* settings in front of this file:
#
#   WEAR_STACK      zfs-raidz1..3, md-raid5, md-raid6, md-raid5-journal, md-raid6-journal,
#                   btrfs-raid5, btrfs-raid6, lograid-p1..3
#   WEAR_MEMBERS    member disks: the first WEAR_MEMBERS of $DISKS; the next one is the md
#                   write journal (and is counted for every stack: it stays idle for the others)
#   WEAR_FILLS      volume fill levels for the random phase, e.g. "0.5 0.75"
#   WEAR_RANDOM_FACTOR   the random phase writes this many times the filled bytes
#   WEAR_RANDOM_MAX_SECONDS   ... or stops after this long (fio runtime), whichever comes first
#   WEAR_FILE_RANDOM_MAX_SECONDS   the same cap for random writes into a file in a ZFS dataset
#                   (128 KiB records), measured at the first fill only (0: skip)
#   WEAR_FILES      many-files: how many 14 MiB files (0: skip the workload)
#   WEAR_ZFS_TXG_TIMEOUT   zfs_txg_timeout, seconds (0: ZFS's default, 5)
#   WEAR_ZVOL_FRACTION     a zvol's size as a fraction of the largest the pool can reserve
#   WEAR_QUIET, WEAR_QUIET_MAX   a phase ends when the counted disks took no write for
#                   WEAR_QUIET seconds (waited for at most WEAR_QUIET_MAX)
#
# What is measured: sectors written (field 7 of /sys/block/vdX/stat, times 512) summed over
# every member disk and the journal disk, from just before a phase's first user write to the
# end of the quiet period after its final flush/sync. Discards are counted by the kernel
# apart (field 14) and are recorded but never added to the writes. Times under TCG are not
# performance figures; they are recorded only to plan the run.
. "$SHARE/lib.sh"
set -o pipefail
OUT=$SHARE/out/wear
mkdir -p "$OUT/fio"
MEMBERS=$(echo $DISKS | cut -d' ' -f1-"$WEAR_MEMBERS")
JOURNAL=$(echo $DISKS | cut -d' ' -f$((WEAR_MEMBERS + 1)))
[ -n "$JOURNAL" ] || { fail "need $((WEAR_MEMBERS + 1)) disks (members and a journal disk)"; finish; }
COUNTED="$MEMBERS $JOURNAL"
FIRST=${MEMBERS%% *}
MNT=/mnt/wear
FILE_BYTES=$((14 << 20))
mkdir -p $MNT
log() { echo "wear: $(date -u +%H:%M:%S) $*"; }

# ---- the disks' counters --------------------------------------------------------------------
# Byte counts leave awk through "%.0f": the guest's mawk prints "%d" as at most 2^31 - 1.

# snap FILE: "disk sectors_written sectors_read sectors_discarded" for every counted disk.
snap() {
    for d in $COUNTED; do
        n=${d#/dev/}
        awk -v n="$n" '{print n, $7, $3, $14}' /sys/block/$n/stat
    done > "$1"
}
written_sectors() { for d in $COUNTED; do awk '{print $7}' /sys/block/${d#/dev/}/stat; done | awk '{s += $1} END {printf "%.0f\n", s}'; }

# quiesce: waits until the counted disks take no write for WEAR_QUIET seconds (at most
# WEAR_QUIET_MAX); prints the seconds waited.
quiesce() {
    local last now still=0 t=0
    last=$(written_sectors)
    while [ $still -lt "$WEAR_QUIET" ] && [ $t -lt "$WEAR_QUIET_MAX" ]; do
        sleep 1; t=$((t + 1))
        now=$(written_sectors)
        if [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; last=$now; fi
    done
    echo $t
}

# ---- fio ------------------------------------------------------------------------------------

# fio_written FILE: the bytes fio's JSON report FILE says were written.
fio_written() { awk '/"write" : \{/ {w = 1} w && /"io_bytes"/ {gsub(/[^0-9]/, ""); print; exit}' "$1"; }

# fill TARGET BYTES TAG: sequential 1 MiB writes from offset 0, then a flush.
fill() {
    fio --name=fill --filename="$1" --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=16 \
        --size="$2" --fallocate=none --end_fsync=1 --output-format=json --output="$OUT/fio/$3-fill.json"
}

# random TARGET USED_BYTES AMOUNT TAG: random 4 KiB writes (uniform, with repeats) over the
# first USED_BYTES, AMOUNT bytes in all (or RANDOM_CAP, default WEAR_RANDOM_MAX_SECONDS,
# seconds), then a flush.
random_writes() {
    fio --name=rand --filename="$1" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=32 \
        --size="$2" --io_size="$3" --norandommap --randrepeat=0 --fallocate=none --end_fsync=1 \
        --runtime="${RANDOM_CAP:-$WEAR_RANDOM_MAX_SECONDS}" --output-format=json --output="$OUT/fio/$4.json"
}

# ---- one measured phase -----------------------------------------------------------------------

# record WORKLOAD FILL VOLUME_BYTES USED_BYTES USER_BYTES BEFORE AFTER SECONDS QUIET EXTRA
# appends the phase's JSON line (EXTRA: more "key": value pairs, or empty).
record() {
    local per_disk totals
    per_disk=$(paste -d' ' "$6" "$7" | awk '{printf "%s\"%s\": {\"written\": %.0f, \"read\": %.0f, \"discarded\": %.0f}", \
        (NR > 1 ? ", " : ""), $1, ($6 - $2) * 512, ($7 - $3) * 512, ($8 - $4) * 512}')
    totals=$(paste -d' ' "$6" "$7" | awk '{w += $6 - $2; r += $7 - $3; d += $8 - $4} \
        END {printf "\"member_bytes\": %.0f, \"member_read_bytes\": %.0f, \"member_discard_bytes\": %.0f", w * 512, r * 512, d * 512}')
    line="{\"stack\": \"$WEAR_STACK\", \"variant\": \"$VARIANT\", \"workload\": \"$1\", \"fill\": $2, \
\"volume_bytes\": $3, \"used_bytes\": $4, \"user_bytes\": $5, $totals, \"disks\": {$per_disk}, \
\"guest_seconds\": $8, \"quiet_wait_seconds\": $9, \"setup\": \"$SETUP\"${10:+, ${10}}}"
    echo "$line" >> "$OUT/results.jsonl"
    log "RESULT $WEAR_STACK $VARIANT $1 fill=$2 user=$5 member=$(echo "$totals" | awk -F'[:,]' '{print $2}') ($8 s)"
}

# measure_random FILL: fills VOLUME_BYTES x FILL of $TARGET, then the random phase; records it.
measure_random() {
    local fill_frac=$1 used amount tag t0 seconds q extra
    used=$(awk -v v="$VOLUME_BYTES" -v f="$fill_frac" 'BEGIN {printf "%.0f", int(v * f / 1048576) * 1048576}')
    amount=$(awk -v u="$used" -v k="$WEAR_RANDOM_FACTOR" 'BEGIN {printf "%.0f", int(u * k / 4096) * 4096}')
    tag=$WEAR_STACK-$VARIANT-random-$fill_frac
    log "fill $TARGET to $used of $VOLUME_BYTES bytes"
    fill "$TARGET" "$used" "$tag" || { fail "$tag: fill"; return 1; }
    stack_sync
    q=$(quiesce)
    log "fill settled after $q s; random 4 KiB writes: $amount bytes over $used"
    stack_probe_before
    snap $WORK/before
    t0=$(date +%s)
    random_writes "$TARGET" "$used" "$amount" "$tag" || { fail "$tag: random writes"; return 1; }
    stack_sync
    q=$(quiesce)
    snap $WORK/after
    seconds=$(( $(date +%s) - t0 ))
    extra=$(stack_probe_after)
    record random-4k "$fill_frac" "$VOLUME_BYTES" "$used" "$(fio_written "$OUT/fio/$tag.json")" \
        $WORK/before $WORK/after "$seconds" "$q" \
        "\"target_bytes\": $amount, \"cap_seconds\": ${RANDOM_CAP:-$WEAR_RANDOM_MAX_SECONDS}${extra:+, $extra}"
    ok "$tag"
}

# measure_files DIR: WEAR_FILES files of 14 MiB (random bytes) copied into DIR, then sync.
measure_files() {
    local dir=$1 t0 seconds q extra i
    [ -f /tmp/wear-src ] || head -c $FILE_BYTES /dev/urandom > /tmp/wear-src
    mkdir -p "$dir"
    stack_sync
    quiesce > /dev/null
    stack_probe_before
    snap $WORK/before
    t0=$(date +%s)
    for i in $(seq "$WEAR_FILES"); do cp /tmp/wear-src "$dir/f$i" || { fail "many-files: cp $i"; return 1; }; done
    sync
    stack_sync
    q=$(quiesce)
    snap $WORK/after
    seconds=$(( $(date +%s) - t0 ))
    extra=$(stack_probe_after)
    record many-files 0 "$VOLUME_BYTES" 0 $((WEAR_FILES * FILE_BYTES)) $WORK/before $WORK/after "$seconds" "$q" \
        "\"files\": $WEAR_FILES${extra:+, $extra}"
    ok "$WEAR_STACK many-files"
}

# wipe: zeroes every counted disk (each stack starts on blank disks, as a fresh pool would).
wipe() {
    for d in $COUNTED; do
        dd if=/dev/zero of=$d bs=4M oflag=direct status=none 2>/dev/null
        blockdev --rereadpt $d 2>/dev/null
    done
    return 0
}

# ---- the stacks -------------------------------------------------------------------------------
# Each kind gives stack_up MODE (MODE: block = a block device or file in $TARGET of
# $VOLUME_BYTES for the random phase; fs = a filesystem mounted at $MNT), stack_down,
# stack_sync (push everything written to the disks), and stack_probe_before/_after (the
# latter prints extra JSON pairs about the phase, e.g. ZFS transaction groups).

stack_sync() { sync; }
stack_probe_before() { :; }
stack_probe_after() { :; }

mkfs_ext4_mount() {
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$1" && mount "$1" $MNT
}

# md, btrfs and lograid: the random phase at every fill (as variant $1), then many-files (as
# variant $2), each on a fresh stack. (ZFS has its own: zvols of two block sizes, a dataset.)
random_then_files() {
    VARIANT=$1
    for f in $WEAR_FILLS; do
        wipe
        stack_up block || { fail "$WEAR_STACK $VARIANT: create"; stack_down 2> /dev/null; continue; }
        log "setup: $SETUP"
        measure_random "$f"
        stack_down
    done
    [ "$WEAR_FILES" -gt 0 ] || return 0
    VARIANT=$2
    wipe
    stack_up fs || { fail "$WEAR_STACK $VARIANT: create"; stack_down 2> /dev/null; return; }
    log "setup: $SETUP"
    measure_files $MNT/many
    stack_down
}

case $WEAR_STACK in
zfs-raidz*)
    LAYOUT=${WEAR_STACK#zfs-}
    start_udevd() {
        /lib/systemd/systemd-udevd --daemon && udevadm trigger && udevadm settle --timeout=120
    }
    stack_up() {   # $1: block (VARIANT zvol-default or zvol-4k) or fs (VARIANT dataset)
        zpool create -f -o ashift=12 -m $MNT tank "$LAYOUT" $MEMBERS || return 1
        if [ "$1" = fs ]; then
            zfs create tank/files || return 1
            VOLUME_BYTES=$(zfs get -Hp -o value available tank)
            SETUP="zpool create -o ashift=12 tank $LAYOUT ($WEAR_MEMBERS whole disks; $TXG_NOTE); zfs create tank/files (recordsize $(zfs get -H -o value recordsize tank/files), compression $(zfs get -H -o value compression tank/files))"
            return 0
        fi
        local b= size avail ref vs
        [ "$VARIANT" = zvol-4k ] && b="-b 4K"
        # WEAR_ZVOL_FRACTION of the largest zvol the pool can reserve: ZFS sizes a zvol's
        # refreservation for its volblocksize on this raidz layout (padding included), so
        # scale a small one up.
        zfs create -V 64M $b tank/vol || return 1
        avail=$(zfs get -Hp -o value available tank)
        ref=$(zfs get -Hp -o value refreservation tank/vol)
        vs=$(zfs get -Hp -o value volsize tank/vol)
        zfs destroy tank/vol
        size=$(awk -v a="$avail" -v r="$ref" -v v="$vs" -v f="$WEAR_ZVOL_FRACTION" \
            'BEGIN {printf "%.0f", int((a + r) * f * v / r / 1048576) * 1048576}')
        zfs create -V "$size" $b tank/vol || return 1
        udevadm settle --timeout=60
        for _ in $(seq 50); do [ -e /dev/zvol/tank/vol ] && break; sleep 0.2; done
        TARGET=$(readlink -f /dev/zvol/tank/vol)
        VOLUME_BYTES=$size
        SETUP="zpool create -o ashift=12 tank $LAYOUT ($WEAR_MEMBERS whole disks; $TXG_NOTE); zfs create -V $size${b:+ $b} tank/vol (volblocksize $(zfs get -Hp -o value volblocksize tank/vol), compression $(zfs get -H -o value compression tank/vol), refreservation $(zfs get -Hp -o value refreservation tank/vol))"
    }
    stack_down() { zpool destroy tank; }
    stack_sync() { sync; zpool sync tank; }
    txg() { tail -n 1 /proc/spl/kstat/zfs/tank/txgs | awk '{print $1}'; }
    # Transaction groups in the phase, the pool's fill and fragmentation (percent), and the
    # space ZFS counts as available to the written dataset when the phase starts.
    # dmu_tx counters: dmu_tx_quota counts transactions sent back to wait for the next txg
    # because the space they might need (a worst-case estimate) is more than is available.
    dmu_tx() { awk -v k="$1" '$1 == k {v = $3} END {printf "%.0f\n", v}' /proc/spl/kstat/zfs/dmu_tx 2>/dev/null || echo 0; }
    stack_probe_before() {
        QUOTA0=$(dmu_tx dmu_tx_quota); THROTTLE0=$(dmu_tx dmu_tx_dirty_throttle)
        TXG0=$(txg)
        CAP0=$(zpool list -Hp -o capacity tank)
        DS=tank/vol; [ "$VARIANT" = dataset ] && DS=tank/files
        AVAIL0=$(zfs get -Hp -o value available $DS)
    }
    stack_probe_after() {
        echo "\"txgs\": $(( $(txg) - TXG0 )), \"pool_capacity_before\": $CAP0, \"pool_capacity_after\": $(zpool list -Hp -o capacity tank), \"pool_fragmentation_after\": $(zpool list -Hp -o fragmentation tank | tr -d '%-' | sed 's/^$/0/'), \"available_before\": $AVAIL0, \"dmu_tx_quota\": $(( $(dmu_tx dmu_tx_quota) - QUOTA0 )), \"dmu_tx_dirty_throttle\": $(( $(dmu_tx dmu_tx_dirty_throttle) - THROTTLE0 ))"
    }
    modprobe zfs || { fail "modprobe zfs"; finish; }
    [ "$WEAR_ZFS_TXG_TIMEOUT" -gt 0 ] && echo "$WEAR_ZFS_TXG_TIMEOUT" > /sys/module/zfs/parameters/zfs_txg_timeout
    TXG_NOTE="zfs_txg_timeout $(cat /sys/module/zfs/parameters/zfs_txg_timeout) s"
    wipe   # before udevd looks at the disks (it would assemble an md array it finds on them)
    trap 'udevadm control --exit 2>/dev/null' EXIT
    start_udevd || { fail "udevd (zpool needs it for whole disks)"; finish; }
    run_all() {
        for VARIANT in zvol-default zvol-4k; do
            for f in $WEAR_FILLS; do
                wipe; stack_up block || { fail "$WEAR_STACK $VARIANT: create"; continue; }
                log "setup: $SETUP"
                measure_random "$f"
                stack_down
            done
        done
        VARIANT=dataset
        if [ "$WEAR_FILE_RANDOM_MAX_SECONDS" -gt 0 ]; then
            wipe
            if stack_up fs; then
                log "setup: $SETUP"
                TARGET=$MNT/files/volume
                RANDOM_CAP=$WEAR_FILE_RANDOM_MAX_SECONDS measure_random "${WEAR_FILLS%% *}"
                stack_down
            else
                fail "$WEAR_STACK dataset: create"
            fi
        fi
        if [ "$WEAR_FILES" -gt 0 ]; then
            wipe; stack_up fs || { fail "$WEAR_STACK dataset: create"; return; }
            log "setup: $SETUP"
            measure_files $MNT/files/many
            stack_down
        fi
    }
    ;;
md-raid*)
    LEVEL=${WEAR_STACK#md-raid}; LEVEL=${LEVEL%%-*}
    case $WEAR_STACK in *-journal) WITH_JOURNAL=1 ;; *) WITH_JOURNAL=0 ;; esac
    stack_up() {
        local extra
        if [ $WITH_JOURNAL = 1 ]; then extra="--write-journal $JOURNAL"; else extra="--bitmap=internal"; fi
        mdadm --create /dev/md0 --run --quiet --level="$LEVEL" --raid-devices="$WEAR_MEMBERS" --assume-clean \
            --metadata=1.2 $extra $MEMBERS < /dev/null || return 1
        for _ in $(seq 50); do [ -b /dev/md0 ] && [ "$(blockdev --getsize64 /dev/md0)" -gt 0 ] && break; sleep 0.2; done
        SETUP="mdadm --create --level=$LEVEL --raid-devices=$WEAR_MEMBERS --assume-clean $extra (chunk $(cat /sys/block/md0/md/chunk_size) B$( [ $WITH_JOURNAL = 1 ] && echo ", journal mode $(sed 's/.*\[\(.*\)\].*/\1/' /sys/block/md0/md/journal_mode 2>/dev/null)"))"
        if [ "$1" = fs ]; then
            mkfs_ext4_mount /dev/md0 || return 1
            SETUP="$SETUP; mkfs.ext4 -E lazy_itable_init=0,lazy_journal_init=0"
            VOLUME_BYTES=$(df -B1 --output=avail $MNT | tail -1)
        else
            TARGET=/dev/md0
            VOLUME_BYTES=$(blockdev --getsize64 /dev/md0)
        fi
    }
    stack_down() { mountpoint -q $MNT && umount $MNT; mdadm --stop /dev/md0 > /dev/null; }
    export MDADM_NO_UDEV=1   # udevd does not run: mdadm makes /dev/md0 itself
    modprobe raid456 || { fail "modprobe raid456"; finish; }
    run_all() { random_then_files block ext4; }
    ;;
btrfs-raid*)
    DPROFILE=${WEAR_STACK#btrfs-}
    case $DPROFILE in raid5) MPROFILE=raid1 ;; raid6) MPROFILE=raid1c3 ;; esac
    stack_up() {
        mkfs.btrfs -f -q -d "$DPROFILE" -m "$MPROFILE" $MEMBERS > /dev/null || return 1
        btrfs device scan > /dev/null 2>&1
        mount "$FIRST" $MNT || return 1
        # Free (estimated): unallocated space over the data profile's ratio (statvfs counts parity).
        VOLUME_BYTES=$(btrfs filesystem usage -b $MNT | awk '/Free \(estimated\)/ {print $3; exit}')
        TARGET=$MNT/volume
        SETUP="mkfs.btrfs -d $DPROFILE -m $MPROFILE; mount ($(awk -v m=$MNT '$2 == m {print $4}' /proc/mounts))"
    }
    stack_down() { umount $MNT; }
    stack_sync() { sync; btrfs filesystem sync $MNT; }
    run_all() { random_then_files file fs; }
    ;;
lograid-p*)
    PARITY=${WEAR_STACK#lograid-p}
    PORT=10809
    export LOGRAID_RUN_DIR=$WORK/run
    SERVER=
    json_number() { grep -o "\"$1\": *[0-9]*" $2 2>/dev/null | head -1 | grep -o '[0-9]*$'; }
    status_number() { json_number "$1" "$LOGRAID_RUN_DIR/pool-*.json"; }
    stack_up() {
        local usable
        $LOGRAID create --parity "$PARITY" $MEMBERS > $WORK/create.log 2>&1 || { cat $WORK/create.log; return 1; }
        $LOGRAID status --json $MEMBERS > $WORK/status.json || return 1
        VOLUME_BYTES=$(( $(json_number usable_bytes $WORK/status.json) / 1048576 * 1048576 ))
        $LOGRAID volume create --size "$VOLUME_BYTES" vol0 $MEMBERS > /dev/null || return 1
        rm -rf $LOGRAID_RUN_DIR; mkdir -p $LOGRAID_RUN_DIR
        $LOGRAID serve --listen 127.0.0.1:$PORT $MEMBERS > $WORK/serve.log 2>&1 &
        SERVER=$!
        for _ in $(seq 150); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.2; done
        modprobe nbd
        nbd-client 127.0.0.1 $PORT /dev/nbd0 -N vol0 > /dev/null || return 1
        for _ in $(seq 50); do [ "$(blockdev --getsize64 /dev/nbd0)" -gt 0 ] 2>/dev/null && break; sleep 0.2; done
        SETUP="lograid create --parity $PARITY ($WEAR_MEMBERS disks, chunk $(json_number chunk_bytes $WORK/status.json) B, segment $(json_number segment_bytes_per_member $WORK/status.json) B per member); volume of $VOLUME_BYTES B (the usable size); serve; nbd-client"
        if [ "$1" = fs ]; then
            mkfs_ext4_mount /dev/nbd0 || return 1
            SETUP="$SETUP; mkfs.ext4 -E lazy_itable_init=0,lazy_journal_init=0"
        else
            TARGET=/dev/nbd0
        fi
    }
    stack_down() {
        mountpoint -q $MNT && umount $MNT
        nbd-client -d /dev/nbd0 > /dev/null 2>&1
        [ -n "$SERVER" ] && { kill -TERM $SERVER; wait $SERVER; }
        SERVER=
        tail -3 $WORK/serve.log
    }
    stack_sync() { sync; blockdev --flushbufs /dev/nbd0 2>/dev/null; sync; }
    stack_probe_before() {
        sleep 1.5   # the server publishes its status once a second
        REL0=$(status_number relocated_bytes); ENG0=$(status_number member_bytes_written)
    }
    stack_probe_after() {
        sleep 1.5
        echo "\"engine_relocated_bytes\": $(( $(status_number relocated_bytes) - REL0 )), \"engine_member_bytes\": $(( $(status_number member_bytes_written) - ENG0 ))"
    }
    run_all() { random_then_files nbd ext4; }
    ;;
*) fail "unknown stack $WEAR_STACK"; finish ;;
esac

log "$WEAR_STACK on $MEMBERS (journal disk $JOURNAL; all counted), fills $WEAR_FILLS, random x$WEAR_RANDOM_FACTOR, $WEAR_FILES files"
run_all
wipe   # leave blank disks to the next stack
finish
