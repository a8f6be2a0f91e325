#!/usr/bin/env bash
# Installs what the tests need (Debian packages, as root) and runs every test.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
for tool_pkg in nbdinfo:libnbd-bin nbdfuse:libnbd-bin nbdkit:nbdkit fio:fio fusermount3:fuse3 \
    mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs mkfs.ext4:e2fsprogs losetup:mount qemu-img:qemu-utils \
    openssl:openssl nbdsh:python3-libnbd nfs-ls:libnfs-utils nfs-cat:libnfs-utils cc:gcc; do
    tool=${tool_pkg%%:*}; pkg=${tool_pkg##*:}
    command -v "$tool" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
# The metrics test parses the exposition with the Prometheus Python client (Debian's package,
# for /usr/bin/python3).
/usr/bin/python3 -c 'import prometheus_client.parser' >/dev/null 2>&1 || need_pkgs+=(python3-prometheus-client)
# The NFS export test compiles a small libnfs client (crates/lograid-cli/tests/nfs/nfs_probe.c).
[ -f /usr/include/nfsc/libnfs-raw.h ] || need_pkgs+=(libnfs-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test-all: missing tools (${need_pkgs[*]}); run as root to install them" >&2
        exit 1
    fi
    echo "test-all: installing ${need_pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

export CARGO_TERM_COLOR=never
# Lints: clippy's defaults, and no `unwrap` in runtime code (Cargo.toml).
cargo clippy --workspace --all-targets --profile ci -- -D warnings
# macOS: the workspace type-checked and the binary linked for aarch64 and
# x86_64 (installs its toolchain; about 13 minutes on 2 cores the first time,
# seconds when nothing changed; docs/MACOS.md).
./scripts/check-macos.sh
# Every test, built with debug assertions and overflow checks on (the `ci`
# profile: release speed otherwise), with the engine's invariant checks
# after every flush, checkpoint, cleaning pass and recovery.
export LOGRAID_CHECK_INVARIANTS=1
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --cargo-profile ci --no-fail-fast
    # The engine's own code under shuttle's thread scheduler: a build of its
    # own, since the `shuttle` feature puts every lock and thread on it.
    cargo nextest run -p lograid --cargo-profile ci --features shuttle --test schedules
else
    cargo test --workspace --profile ci --no-fail-fast
    cargo test -p lograid --profile ci --features shuttle --test schedules
fi

# The benchmark scripts' own tests (report, ratios, argument errors; no root work).
python3 -m unittest discover -s bench -p 'test_*.py'

# The real Linux kernel's clients (the NFS client, nbd-client; ublk) against the binary, in a
# Debian guest (kernel 6.12) under qemu with TCG: installs qemu and builds the cached guest
# image the first time (about 1.5 minutes), then a few minutes (scripts/vm/run.sh).
cargo build --profile ci -p lograid-cli
./scripts/vm/run.sh --binary "${CARGO_TARGET_DIR:-target}/ci/lograid"
