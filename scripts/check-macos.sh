#!/usr/bin/env bash
# Type-checks the workspace for macOS and links the `lograid` binary for it,
# on Linux, for aarch64-apple-darwin and x86_64-apple-darwin: every target
# (libraries, binaries, tests, examples, benches) of every crate, with
# warnings denied. Exits non-zero on any error or warning.
#
# How: Debian's rustc-web, cargo-web and rust-web-src (a recent compiler with
# the standard library's source) build the standard library for the Apple
# targets (-Zbuild-std, allowed on a stable compiler by RUSTC_BOOTSTRAP=1:
# for this check only; a Mac builds with its own toolchain); zig, through
# cargo-zigbuild (both from PyPI, pinned, in a venv), brings the Darwin
# headers for the C parts (ring) and links the Mach-O executables.
#
# Installs what it needs (as root): those Debian packages and python3-venv;
# the venv goes to ${XDG_CACHE_HOME:-$HOME/.cache}/lograid-macos. Builds in a
# target directory of its own (LOGRAID_MACOS_TARGET_DIR, by default
# ${CARGO_TARGET_DIR:-./target} with "-macos" appended), so it never waits on
# or invalidates the host's build.
#
# lograid-fuse is Linux-only: its library and its tests are empty elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(aarch64-apple-darwin x86_64-apple-darwin)
ziglang_version=0.17.1
cargo_zigbuild_version=0.24.0
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lograid-macos
venv=$cache/venv
target_dir=${LOGRAID_MACOS_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}-macos}

say() { echo "check-macos: $*" >&2; }

# Debian's compiler, cargo and standard library source; venv for PyPI's tools.
need_pkgs=()
[ -x /usr/bin/rustc ] || need_pkgs+=(rustc-web)
[ -x /usr/bin/cargo ] || need_pkgs+=(cargo-web)
[ -f /usr/lib/rustlib/src/rust/library/std/Cargo.toml ] || need_pkgs+=(rust-web-src)
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        say "missing Debian packages (${need_pkgs[*]}); run as root to install them"
        exit 1
    fi
    say "installing ${need_pkgs[*]}"
    # Waits for another apt or dpkg run to end instead of failing.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        "${need_pkgs[@]}" >/dev/null
fi

# zig and cargo-zigbuild, pinned, in a venv outside the work tree.
if ! "$venv/bin/python" -m pip show ziglang 2>/dev/null | grep -qx "Version: $ziglang_version" ||
    ! "$venv/bin/cargo-zigbuild" --version 2>/dev/null | grep -q " $cargo_zigbuild_version\$"; then
    say "installing ziglang $ziglang_version and cargo-zigbuild $cargo_zigbuild_version into $venv"
    rm -rf "$venv"
    mkdir -p "$cache"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "ziglang==$ziglang_version" "cargo-zigbuild==$cargo_zigbuild_version"
fi

# Debian's toolchain, and only it (rustup's would otherwise come first).
export PATH="$venv/bin:/usr/bin:/bin"
export RUSTC=/usr/bin/rustc
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR=$target_dir
export CARGO_TERM_COLOR=never
# Warnings of the workspace's crates are errors (-Zwarnings; not the
# standard library's or dependencies').
export CARGO_BUILD_WARNINGS=deny
unset RUSTUP_TOOLCHAIN RUSTDOC CARGO RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER RUSTFLAGS
say "$(rustc --version), $(cargo --version), zig $(python -m ziglang version)"

# The binary is linked to prove it links, not to be run: no optimisation and
# no debug information, which halves the time. rustc's warning at the link
# that `xcrun` is missing is expected: zig brings what the link needs.
flags=(--locked -Zbuild-std=std,panic_abort -Zwarnings
    --config 'profile.dev.package."*".opt-level=0' --config profile.dev.debug=0)
declare -A cpu_type=([aarch64-apple-darwin]=0c000001 [x86_64-apple-darwin]=07000001)
for target in "${targets[@]}"; do
    started=$SECONDS
    say "$target: check --workspace --all-targets"
    cargo-zigbuild check --workspace --all-targets "${flags[@]}" --target "$target"
    say "$target: link the lograid binary"
    cargo-zigbuild zigbuild -p lograid-cli --bin lograid "${flags[@]}" --target "$target"
    binary=$target_dir/$target/debug/lograid
    # A 64-bit Mach-O executable (magic cf fa ed fe) for the target's CPU.
    magic=$(od -An -tx1 -N4 "$binary" | tr -d ' \n')
    cpu=$(od -An -tx1 -j4 -N4 "$binary" | tr -d ' \n')
    if [ "$magic" != cffaedfe ] || [ "$cpu" != "${cpu_type[$target]}" ]; then
        say "$target: $binary is not a 64-bit Mach-O executable for $target (magic $magic, cpu $cpu)"
        exit 1
    fi
    say "$target: ok in $((SECONDS - started)) s ($binary, $(stat -c %s "$binary") bytes)"
done
