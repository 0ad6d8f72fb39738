# Source me:  . scripts/board_env.sh   (after `bash scripts/board_setup.sh`)
# Exports the emulated aarch64 board's paths and defines `board_python ARGS...`,
# which runs the board's python3.11 under qemu-aarch64 with the aarch64 site on PYTHONPATH.
# Set TVM_USE_RUNTIME_LIB=1 for a runtime-only tvm (faster import; no tvm.relax, use
# tvm.runtime.vm.VirtualMachine). The emulated CPU is qemu's `max` (scripts/board_server.py:
# DEFAULT_BOARD_CPU) unless PORTABLE_PE_BOARD_CPU names another.
export PORTABLE_PE_BOARD_DIR="${PORTABLE_PE_BOARD_DIR:-$HOME/.cache/portable-pe/board}"
export PORTABLE_PE_BOARD_ROOTFS="$PORTABLE_PE_BOARD_DIR/rootfs"
export PORTABLE_PE_BOARD_SITE="$PORTABLE_PE_BOARD_DIR/site"
board_python() {
    env -u PYTHONHOME PYTHONPATH="$PORTABLE_PE_BOARD_SITE" PYTHONNOUSERSITE=1 \
        qemu-aarch64 -cpu "${PORTABLE_PE_BOARD_CPU:-max}" -L "$PORTABLE_PE_BOARD_ROOTFS" "$PORTABLE_PE_BOARD_ROOTFS/usr/bin/python3.11" "$@"
}
