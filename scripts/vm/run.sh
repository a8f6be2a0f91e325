#!/usr/bin/env bash
# Runs the in-guest tests: the real Linux kernel's block and NFS clients (ublk, nbd-client, the
# NFS client) against lograid, in a Debian guest under qemu. This machine's KVM cannot run a
# stock kernel, so the guest runs under TCG: for function only, never for timing.
#
#   scripts/vm/run.sh [--binary PATH] [--keep] [--tests-dir DIR] [--image base|peers]
#                     [--disks N] [--disk-size SIZE] [--memory MIB] [TEST...]
#
# TEST names a script in scripts/vm/tests/ (or --tests-dir; default: all of them). The guest
# image comes from scripts/vm/image.sh (cached; built on first use). The binary (default target/ci/lograid) and
# the tests reach the guest through a 9p share; the guest gets three blank 1 GiB virtio disks
# (/dev/vdb-vdd) for pool members and reaches the host's loopback at 10.0.2.2, where the tests
# ask this script to run servers for them (see the host-request loop below and guest/lib.sh).
# Prints each test's RESULT lines, and the whole log of a test that failed; exits non-zero if
# any test failed or did not finish. Always stops qemu and the servers it started.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
repo=$(readlink -f "$here/../..")
bin=${CARGO_TARGET_DIR:-$repo/target}/ci/lograid
keep=0 tests_dir=$here/tests variant=base disks=3 disk_size=1G memory_mib=2048
tests=()
while [ $# -gt 0 ]; do
    case $1 in
        --binary) bin=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --tests-dir) tests_dir=$(readlink -f "$2"); shift 2 ;;
        --image) variant=$2; shift 2 ;;
        --disks) disks=$2; shift 2 ;;
        --disk-size) disk_size=$2; shift 2 ;;
        --memory) memory_mib=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        -*) echo "vm: unknown option $1" >&2; exit 2 ;;
        *) tests+=("$1"); shift ;;
    esac
done
[ ${#tests[@]} -gt 0 ] || for t in "$tests_dir"/*.sh; do tests+=("$(basename "$t" .sh)"); done
for t in "${tests[@]}"; do
    [ -f "$tests_dir/$t.sh" ] || { echo "vm: no test $tests_dir/$t.sh" >&2; exit 2; }
done
bin=$(readlink -f "$bin")
[ -x "$bin" ] || { echo "vm: no lograid binary at $bin (build it, or pass --binary)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "vm: run as root (debootstrap, and the image)" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
}
img=$("$here/image.sh" "$variant")
[ -f "$img/done" ] || { echo "vm: image.sh did not name a built image (got: $img)" >&2; exit 1; }

run=$(mktemp -d /var/tmp/lograid-vm.XXXXXX)
share=$run/share host=$run/host
mkdir -p "$share/bin" "$share/tests" "$share/out/ctl" "$host"
qemu_pid=
# Every step runs whatever failed before it (no errexit here: a server that already died must
# not skip the rest). $qemu_pid is `timeout`, which passes SIGTERM on to qemu; qemu's own pid
# (from -pidfile) is killed too, since a SIGKILLed `timeout` would leave qemu running.
cleanup() {
    set +e
    if [ -n "$qemu_pid" ]; then
        kill -TERM "$qemu_pid" 2>/dev/null
        [ -s "$run/qemu.pid" ] && kill -9 "$(cat "$run/qemu.pid")" 2>/dev/null
    fi
    for p in "$host"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done
    wait 2>/dev/null
    if [ $keep = 1 ]; then echo "vm: kept $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cp "$bin" "$share/bin/lograid"
cp "$here/guest/init.sh" "$here/guest/lib.sh" "$share/"
for t in "${tests[@]}"; do cp "$tests_dir/$t.sh" "$share/tests/"; done
printf '%s\n' "${tests[@]}" > "$share/tests.list"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat > "$share/env" <<ENV
NBD_PORT=$(free_port)
NFS_PORT=$(free_port)
ENV
disk_args=()
for i in $(seq "$disks"); do
    truncate -s "$disk_size" "$run/disk$i.img"
    disk_args+=(-drive "file=$run/disk$i.img,format=raw,if=virtio,cache=unsafe")
done
echo "DISK_COUNT=$disks" >> "$share/env"
echo "TEST_TIMEOUT=${LOGRAID_VM_TEST_TIMEOUT:-900}" >> "$share/env"   # seconds, per test
cd "$host"   # where host requests run

# Host requests: a test writes out/ctl/N.req (one line: a command below) and waits for N.done,
# which holds the command's output and, on its last line, its exit status.
#   lograid ARGS...       run the binary on the host, in the host work directory
#   serve NAME PORT ARGS  start `lograid serve ARGS` there and wait until PORT accepts
#   kill NAME             SIGKILL that server (a power cut for its clients)
#   stop NAME             SIGTERM it and wait (2 minutes at most, then SIGKILL and status
#                         124); the status is the server's
serve_on_host() {
    local name=$1 port=$2; shift 2
    RUST_LOG=info "$bin" serve "$@" >> "$host/$name.log" 2>&1 &
    echo $! > "$host/$name.pid"
    for _ in $(seq 100); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null && return 0
        kill -0 "$(cat "$host/$name.pid")" 2>/dev/null || { tail -5 "$host/$name.log"; return 1; }
        sleep 0.2
    done
    echo "server $name not accepting on $port"; return 1
}
# running PID: the process exists and has not exited (a child that exited stays a zombie
# until it is waited for, and `kill -0` still finds it).
running() { [ -e "/proc/$1" ] && ! grep -qE '^[0-9]+ \(.*\) Z ' "/proc/$1/stat" 2>/dev/null; }
end_server() {
    local pid; pid=$(cat "$host/$1.pid") || return 1
    kill "$2" "$pid" || return 1
    rm -f "$host/$1.pid"
    # Bounded: a server that hangs on SIGTERM fails its test instead of hanging this loop
    # (which the qemu timeout cannot end).
    for _ in $(seq 600); do
        running "$pid" || { wait "$pid"; return; }
        sleep 0.2
    done
    echo "server $1 (pid $pid) still running 120 s after $2: killed"
    kill -9 "$pid"; wait "$pid"
    return 124
}
host_request() {
    local cmd rc=0
    read -r -a cmd < "$1"
    echo "vm: host request: ${cmd[*]}"
    case ${cmd[0]} in
        lograid) "$bin" "${cmd[@]:1}" > "$1.out" 2>&1 || rc=$? ;;
        serve) serve_on_host "${cmd[@]:1}" > "$1.out" 2>&1 || rc=$? ;;
        kill) end_server "${cmd[1]}" -KILL > "$1.out" 2>&1 || true ;;
        stop) end_server "${cmd[1]}" -TERM > "$1.out" 2>&1 || rc=$? ;;
        *) echo "unknown host request ${cmd[0]}" > "$1.out"; rc=2 ;;
    esac
    { cat "$1.out"; echo "$rc"; } > "${1%.req}.done.tmp"
    mv "${1%.req}.done.tmp" "${1%.req}.done"
    rm -f "$1" "$1.out"
}

t0=$(date +%s)
echo "vm: booting the guest (kernel $(cat "$img/kernel"); TCG) for: ${tests[*]}"
timeout "${LOGRAID_VM_TIMEOUT:-1800}" qemu-system-x86_64 -accel tcg,thread=multi,tb-size=512 -cpu max \
    -smp 2 -m "$memory_mib" -nographic -no-reboot \
    -kernel "$img/vmlinuz" -initrd "$img/initrd.img" \
    -append "console=ttyS0 root=/dev/vda rw init=/sbin/lograid-vm-init panic=-1 loglevel=4 modprobe.blacklist=floppy" \
    -drive "file=$img/root.img,format=raw,if=virtio,snapshot=on" \
    "${disk_args[@]}" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
    -virtfs "local,path=$share,mount_tag=share,security_model=none,id=s0" \
    -pidfile "$run/qemu.pid" \
    < /dev/null > "$run/console.log" 2>&1 &
qemu_pid=$!
while kill -0 "$qemu_pid" 2>/dev/null; do
    for req in "$share"/out/ctl/*.req; do [ -f "$req" ] && host_request "$req"; done
    sleep 0.3
done
wait "$qemu_pid" || echo "vm: qemu exited with status $? (timeout: ${LOGRAID_VM_TIMEOUT:-1800} s)"
qemu_pid=

# A test passes only with status 0, at least one `RESULT ok` line and no `RESULT FAIL` line: a
# script that exits 0 after a failure, or that checked nothing, does not pass.
failed=0
for t in "${tests[@]}"; do
    log=$share/out/$t.log
    rc=$(cat "$share/out/$t.rc" 2>/dev/null || echo "none")
    oks=0 fails=0
    if [ -f "$log" ]; then
        grep -E '^RESULT' "$log" | sed "s/^/vm: $t: /" || true
        oks=$(grep -c '^RESULT ok' "$log" || true)
        fails=$(grep -c '^RESULT FAIL' "$log" || true)
    fi
    secs=$(cat "$share/out/$t.seconds" 2>/dev/null || echo "?")
    if [ "$rc" = 0 ] && [ "$oks" -gt 0 ] && [ "$fails" = 0 ]; then
        echo "vm: PASS $t ($oks checks, $secs s in the guest)"
    else
        failed=1
        echo "vm: FAIL $t (status $rc, $oks ok and $fails FAIL results, $secs s); its log:"
        sed 's/^/    /' "$log" 2>/dev/null || echo "    (no log)"
        for s in "$host"/*.log; do [ -f "$s" ] && { echo "  host server log $(basename "$s"):"; tail -30 "$s" | sed 's/^/    /'; }; done
    fi
done
if [ $failed = 1 ] || [ ! -f "$share/out/done" ]; then
    echo "vm: the guest console's last lines:"; tail -30 "$run/console.log" | sed 's/^/    /'
    failed=1
fi
echo "vm: $( [ $failed = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - t0 )) s"
exit $failed
