#!/usr/bin/env bash
# Build the emulated aarch64 "edge board" used by portable-pe.
#
#   bash scripts/board_setup.sh            # idempotent; every finished step is skipped
#   PORTABLE_PE_BOARD_DIR=/some/dir bash scripts/board_setup.sh
#   bash scripts/board_setup.sh --force    # redo the rootfs/wheel/smoke steps
#
# Steps (each one leaves a stamp file in $BOARD_DIR/stamps/):
#   1. host tools   apt-get install gcc/g++-aarch64-linux-gnu qemu-user debootstrap
#   2. rootfs       debootstrap --foreign arm64 bookworm minbase (+python3.11, libstdc++6),
#                   then dpkg -x every downloaded .deb into the rootfs (no chroot/binfmt needed)
#   3. site         aarch64 cp311 wheels (pinned below) installed with pip --target
#   4. smoke        import tvm (runtime only) inside qemu-aarch64
#
# Layout:  $BOARD_DIR/rootfs  $BOARD_DIR/site  $BOARD_DIR/stamps  $BOARD_DIR/logs
set -euo pipefail

BOARD_DIR="${PORTABLE_PE_BOARD_DIR:-$HOME/.cache/portable-pe/board}"
ROOTFS="$BOARD_DIR/rootfs"
SITE="$BOARD_DIR/site"
STAMPS="$BOARD_DIR/stamps"
LOGS="$BOARD_DIR/logs"

SUITE="bookworm"
APT_PACKAGES=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user debootstrap)
ROOTFS_INCLUDE="python3.11,libstdc++6"

# Pinned aarch64 wheels (all have cp311/abi3/py3 wheels for manylinux aarch64).
WHEELS=(
    "apache-tvm==0.27.0.post1"
    "apache-tvm-ffi==0.1.14.post0"   # 0.1.15.post2 segfaults MetaSchedule (see shared/STACK.md)
    "numpy==2.4.6"
    "ml_dtypes==0.6.0"
    "typing_extensions==4.15.0"
    "psutil==7.2.2"
    "cloudpickle==3.1.3"
    "tornado==6.6.1"
)
PIP_PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_27_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64)

FORCE=0
for a in "$@"; do
    case "$a" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "board_setup: unknown argument: $a" >&2; exit 2 ;;
    esac
done

mkdir -p "$STAMPS" "$LOGS"
T0=$(date +%s)

log()  { printf '[board_setup %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die()  { printf '[board_setup] ERROR: %s\n' "$*" >&2; exit 1; }
# stamp name content: a step is done when its stamp exists and holds the same content
# (content = the step's pinned inputs, so changing a pin redoes the step).
is_done()   { [[ $FORCE == 0 && -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
mark_done() { printf '%s' "$2" > "$STAMPS/$1"; }
tail_log()  { echo "---- last lines of $1 ----" >&2; tail -n 25 "$1" >&2 || true; }

as_root() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }

# The Debian mirror this machine's apt already uses (deb822 'URIs:' or one-line 'deb URL').
debian_mirror() {
    if [[ -n "${PORTABLE_PE_DEBIAN_MIRROR:-}" ]]; then echo "$PORTABLE_PE_DEBIAN_MIRROR"; return; fi
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -Eo '(URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+' \
        | grep -Eo 'https?://[^[:space:]]+' | grep -E '/debian/?$' | head -n1 || true)
    echo "${m:-http://deb.debian.org/debian}"
}

# ---------------------------------------------------------------- 1. host tools
step_apt() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [[ ${#missing[@]} == 0 ]]; then
        log "1/4 host tools: already installed (${APT_PACKAGES[*]})"
    else
        log "1/4 host tools: apt-get install ${missing[*]} (log: $LOGS/apt.log)"
        export DEBIAN_FRONTEND=noninteractive
        if [[ ! -f "$STAMPS/apt-update" ]]; then
            as_root apt-get update -q >"$LOGS/apt.log" 2>&1 || { tail_log "$LOGS/apt.log"; die "apt-get update failed"; }
            : > "$STAMPS/apt-update"
        fi
        if ! as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOGS/apt.log" 2>&1; then
            # a stale package list is the usual cause: refresh once and retry
            as_root apt-get update -q >>"$LOGS/apt.log" 2>&1 || true
            as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOGS/apt.log" 2>&1 \
                || { tail_log "$LOGS/apt.log"; die "apt-get install failed for: ${missing[*]}"; }
        fi
    fi
    for b in qemu-aarch64 aarch64-linux-gnu-g++ aarch64-linux-gnu-gcc debootstrap; do
        command -v "$b" >/dev/null || [[ -x "/usr/sbin/$b" ]] || die "'$b' not found after installing ${APT_PACKAGES[*]}"
    done
    mark_done host-tools "${APT_PACKAGES[*]}"
}

# ---------------------------------------------------------------- 2. rootfs
step_rootfs() {
    local mirror key
    mirror=$(debian_mirror)
    key="$SUITE arm64 minbase $ROOTFS_INCLUDE"
    if is_done rootfs "$key" && [[ -x "$ROOTFS/usr/bin/python3.11" ]]; then
        log "2/4 rootfs: cached ($ROOTFS)"
        return
    fi
    log "2/4 rootfs: debootstrap --foreign $SUITE arm64 from $mirror (log: $LOGS/debootstrap.log)"
    rm -f "$STAMPS/rootfs" "$STAMPS/smoke"
    local tmp="$BOARD_DIR/rootfs.partial"
    rm -rf "$tmp"
    local dbs=debootstrap
    command -v debootstrap >/dev/null || dbs=/usr/sbin/debootstrap
    if ! as_root "$dbs" --arch=arm64 --variant=minbase --foreign --include="$ROOTFS_INCLUDE" \
            "$SUITE" "$tmp" "$mirror" >"$LOGS/debootstrap.log" 2>&1; then
        tail_log "$LOGS/debootstrap.log"
        die "debootstrap failed (mirror $mirror; set PORTABLE_PE_DEBIAN_MIRROR to override)"
    fi
    local debs=("$tmp"/var/cache/apt/archives/*.deb)
    [[ -e "${debs[0]}" ]] || die "debootstrap downloaded no .deb into $tmp/var/cache/apt/archives"
    log "2/4 rootfs: unpacking ${#debs[@]} .debs with dpkg -x"
    for d in "${debs[@]}"; do
        dpkg -x "$d" "$tmp" 2>>"$LOGS/debootstrap.log" || die "dpkg -x failed for $(basename "$d")"
    done
    [[ -x "$tmp/usr/bin/python3.11" ]] || die "python3.11 missing from the unpacked rootfs"
    [[ -e "$tmp/lib/ld-linux-aarch64.so.1" || -e "$tmp/usr/lib/ld-linux-aarch64.so.1" ]] \
        || die "aarch64 dynamic loader missing from the unpacked rootfs"
    rm -f "$tmp"/var/cache/apt/archives/*.deb   # ~40 MB we no longer need
    rm -rf "$ROOTFS"
    mv "$tmp" "$ROOTFS"
    mark_done rootfs "$key"
}

# ---------------------------------------------------------------- 3. aarch64 wheels
step_site() {
    local key="${WHEELS[*]}"
    if is_done site "$key" && [[ -d "$SITE/tvm" ]]; then
        log "3/4 site: cached ($SITE)"
        return
    fi
    log "3/4 site: pip install --target (aarch64 cp311): ${WHEELS[*]} (log: $LOGS/pip.log)"
    rm -f "$STAMPS/site" "$STAMPS/smoke"
    local tmp="$BOARD_DIR/site.partial" plat=()
    rm -rf "$tmp"
    for p in "${PIP_PLATFORMS[@]}"; do plat+=(--platform "$p"); done
    if ! python3 -m pip install --disable-pip-version-check --no-warn-script-location -q \
            --target "$tmp" --only-binary=:all: "${plat[@]}" \
            --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
            "${WHEELS[@]}" >"$LOGS/pip.log" 2>&1; then
        tail_log "$LOGS/pip.log"
        local bad
        bad=$(grep -Eo 'No matching distribution found for [^ ]+|Could not find a version that satisfies the requirement [^ ]+' \
              "$LOGS/pip.log" | head -n3 | tr '\n' ';' || true)
        die "pip could not install the aarch64 wheels. ${bad:-see $LOGS/pip.log}"
    fi
    for m in tvm tvm_ffi numpy; do
        [[ -d "$tmp/$m" ]] || die "package '$m' missing from $tmp after pip install"
    done
    if command -v file >/dev/null && [[ -f "$tmp/tvm/libtvm_runtime.so" ]]; then
        file -L "$tmp/tvm/libtvm_runtime.so" | grep -q aarch64 \
            || die "tvm/libtvm_runtime.so in $tmp is not an aarch64 library"
    fi
    rm -rf "$SITE"
    mv "$tmp" "$SITE"
    mark_done site "$key"
}

# ---------------------------------------------------------------- 4. smoke test
step_smoke() {
    local key
    key="$(cat "$STAMPS/rootfs" 2>/dev/null) | $(cat "$STAMPS/site" 2>/dev/null)"
    if is_done smoke "$key"; then
        log "4/4 smoke: cached"
        return
    fi
    log "4/4 smoke: import tvm (runtime) + numpy inside qemu-aarch64"
    local out
    if ! out=$(env -u PYTHONHOME PYTHONPATH="$SITE" TVM_USE_RUNTIME_LIB=1 \
            qemu-aarch64 -L "$ROOTFS" "$ROOTFS/usr/bin/python3.11" -c \
            'import platform, numpy, tvm; print(platform.machine(), "numpy", numpy.__version__, "tvm", tvm.__version__)' 2>&1); then
        echo "$out" | tail -n 25 >&2
        die "smoke test failed: python3.11 + tvm do not start under qemu-aarch64"
    fi
    echo "    board says: $(echo "$out" | tail -n1)"
    echo "$out" | tail -n1 | grep -q '^aarch64 ' || die "smoke test: unexpected output: $out"
    mark_done smoke "$key"
}

step_apt
step_rootfs
step_site
step_smoke

cat > "$BOARD_DIR/board.env" <<EOF
PORTABLE_PE_BOARD_DIR=$BOARD_DIR
PORTABLE_PE_BOARD_ROOTFS=$ROOTFS
PORTABLE_PE_BOARD_SITE=$SITE
EOF
log "board ready: rootfs=$ROOTFS site=$SITE"
