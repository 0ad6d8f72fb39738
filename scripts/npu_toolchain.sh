#!/usr/bin/env bash
# Set up an NPU vendor toolchain in its own cached virtualenv, so its pins never touch ours.
#
#   bash scripts/npu_toolchain.sh NAME [--force]     # idempotent: a ready toolchain is kept
#   bash scripts/npu_toolchain.sh --list
#
# NAME is a script in scripts/toolchains/NAME.sh. It is called as
#   scripts/toolchains/NAME.sh DEST
# and must build DEST/venv (a virtualenv with the vendor's tools) and nothing outside DEST.
# When it succeeds this script writes DEST/ready, which portable-pe looks for
# (portable_pe/npu/toolchain.py). DEST is ${PORTABLE_PE_TOOLCHAIN_DIR:-~/.cache/portable-pe/toolchains}/NAME.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BASE="${PORTABLE_PE_TOOLCHAIN_DIR:-$HOME/.cache/portable-pe/toolchains}"
available() { for f in "$HERE"/toolchains/*.sh; do [[ -e $f ]] && basename "$f" .sh; done; }

case "${1:-}" in
    ""|-h|--help) sed -n '2,11p' "$0"; echo "toolchains: $(available | tr '\n' ' ')"; exit 0 ;;
    --list) available; exit 0 ;;
esac
NAME="$1"; shift
FORCE=0
for a in "$@"; do
    case "$a" in
        --force) FORCE=1 ;;
        *) echo "npu_toolchain: unknown argument: $a" >&2; exit 2 ;;
    esac
done
SETUP="$HERE/toolchains/$NAME.sh"
if [[ ! -f $SETUP ]]; then
    echo "npu_toolchain: unknown toolchain '$NAME'; available: $(available | tr '\n' ' ')" >&2
    exit 2
fi
DEST="$BASE/$NAME"
# the stamp holds the setup script's digest: editing a pin in it redoes the setup
STAMP="$(sha256sum "$SETUP" | cut -d' ' -f1)"
if [[ $FORCE == 0 && -f $DEST/ready && "$(cat "$DEST/ready")" == "$STAMP" ]]; then
    echo "[npu_toolchain] $NAME is ready: $DEST/venv"
    exit 0
fi
rm -f "$DEST/ready"
mkdir -p "$DEST"
T0=$(date +%s)
echo "[npu_toolchain] setting up $NAME in $DEST (log: $DEST/setup.log)"
if ! bash "$SETUP" "$DEST" > "$DEST/setup.log" 2>&1; then
    echo "[npu_toolchain] ERROR: $NAME setup failed; last lines of $DEST/setup.log:" >&2
    tail -n 25 "$DEST/setup.log" >&2
    exit 1
fi
printf '%s' "$STAMP" > "$DEST/ready"
echo "[npu_toolchain] $NAME ready in $(( $(date +%s) - T0 )) s: $DEST/venv"
