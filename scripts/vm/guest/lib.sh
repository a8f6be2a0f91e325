# Sourced by every in-guest test (scripts/vm/tests/*.sh): results, host requests, waiting.
# The environment: LOGRAID (the binary), DISKS (three blank virtio disks), WORK (a scratch
# directory), SHARE (the 9p share), and from $SHARE/env the host ports NBD_PORT, NFS_PORT.
# The host's loopback is 10.0.2.2 from the guest.
set -u
. "$SHARE/env"
HOST=10.0.2.2
FAILED=0

ok() { echo "RESULT ok $*"; }
fail() { echo "RESULT FAIL $*"; FAILED=1; }
# check MSG CMD...: runs CMD, ok MSG if it succeeds, fail MSG (with its status) if not.
check() {
    msg=$1; shift
    if "$@"; then ok "$msg"; else fail "$msg (status $?)"; fi
}
# The test's exit status: non-zero if anything failed.
finish() { [ "$FAILED" = 0 ]; exit $?; }

# host CMD ARGS...: asks run.sh to run a host request (see run.sh) and waits for it (5 min at
# most); prints its output and returns its status.
host() {
    id=$(basename "$WORK")-$(cat /proc/sys/kernel/random/uuid)   # unique, in subshells too
    ctl=$SHARE/out/ctl
    echo "$*" > "$ctl/$id.tmp" && mv "$ctl/$id.tmp" "$ctl/$id.req"
    for _ in $(seq 1500); do
        if [ -f "$ctl/$id.done" ]; then
            rc=$(tail -n 1 "$ctl/$id.done")
            head -n -1 "$ctl/$id.done"
            rm -f "$ctl/$id.done"
            return "$rc"
        fi
        sleep 0.2
    done
    echo "host request '$*' got no answer"; return 124
}

# md5 FILE: the file's MD5 sum alone.
md5() { md5sum "$1" | cut -d' ' -f1; }
# drop_caches: the next reads come from the device, not the page cache.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Copies file $1 to $2 (then syncs) in the background while the host's server $3 is SIGKILLed
# and started again with host request $4...; each step is a RESULT line.
copy_across_kill() {
    local src=$1 dst=$2 server=$3 copy
    shift 3
    (cp "$src" "$dst" && sync) &
    copy=$!
    sleep 2
    host kill "$server" && ok "server SIGKILLed during a copy" || fail "SIGKILL the server"
    sleep 2
    host "$@" && ok "server started again" || fail "start the server again"
    wait $copy && ok "the copy across the restart finished" || fail "the copy across the restart"
}
