#!/usr/bin/env bash
# The README's test command, and all that CI runs (.ci/run calls this file): install
# portable-pe with its pinned test dependencies, set up everything the tests use (the
# aarch64 cross compiler and emulated board, Rockchip's RKNN-Toolkit2, Arm's Vela; each
# step cached, so a second run only checks them), then the default suite (under 15 minutes),
# the integration tests (vendors' compilers, the board, transformers' models, tuning) and
# the tuning run through an RPC tracker on two emulated boards.
#
#   bash scripts/test.sh                 # everything, as CI does
#   bash scripts/test.sh tests/test_cli.py -k parity    # set up, then only these tests
#
# Python 3.11 and root (or sudo, for apt-get) on Debian/Ubuntu x86_64; package registries only.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[test]'
bash scripts/board_setup.sh
bash scripts/npu_toolchain.sh rknn
bash scripts/npu_toolchain.sh ethos-u
python -m pytest "$@"
if [[ $# == 0 ]]; then
    # the tests that drive the vendors' compilers, the board, transformers' models and tuning
    # (pyproject.toml's `integration` marker): after the default run, which stays under 15 minutes
    # (-m replaces pyproject's selection: the deselected sets stay deselected by naming them)
    python -m pytest -m 'integration and not slow and not rknn_full and not hf_full'
    # -s: the tune, compile and deploy logs go to the output. Skips, with its reason, without the board.
    python -m pytest -m tracker -s tests/test_tracker_board.py
fi
