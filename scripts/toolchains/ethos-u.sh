#!/usr/bin/env bash
# Arm Ethos-U toolchain: Vela (the Ethos-U55/U65/U85 compiler) and a PyTorch -> int8 TFLite
# converter that needs no TensorFlow (litert-torch + ai-edge-quantizer), in one virtualenv.
# Called by scripts/npu_toolchain.sh as `ethos-u.sh DEST`; builds DEST/venv only.
#
# Both fit one venv: ethos-u-vela needs only flatbuffers and numpy, and litert-torch's pins
# (torch < 2.15, jax, transformers, ai-edge-litert) clash with nothing of Vela's. They stay out
# of portable-pe's own environment: litert-torch pulls jax, transformers and a newer numpy and
# protobuf. torch is pinned to the CPU wheel portable-pe uses (a range pulls a CUDA build).
# About 2.1 GB; 7 minutes on a 2-core machine.
set -euo pipefail
DEST="$1"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
rm -rf "$DEST/venv"
"$PYTHON" -m venv "$DEST/venv"
PIP="$DEST/venv/bin/pip"
"$PIP" install -q --upgrade "pip<26"
"$PIP" install torch==2.13.0 ethos-u-vela==5.2.0 litert-torch==0.10.0 \
    ai-edge-quantizer==0.10.0 ai-edge-litert==2.3.0 litert-converter==0.5.0
"$DEST/venv/bin/vela" --version
"$DEST/venv/bin/python" -c "import litert_torch, ai_edge_quantizer, ethosu.vela; print('litert-torch', litert_torch.__version__)"
