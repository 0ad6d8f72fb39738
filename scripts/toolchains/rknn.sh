#!/usr/bin/env bash
# Rockchip RKNN-Toolkit2 (the RKNN compiler and its x86 simulator) in its own virtualenv.
# Called by scripts/npu_toolchain.sh as: scripts/toolchains/rknn.sh DEST  (about 5 minutes)
#
# The wheel's pins clash with ours (numpy<=1.26.4, onnx<=1.18, protobuf<=4.25.4, torch<=2.4,
# opencv-python), so it is installed with --no-deps and what it imports is installed by
# hand, every version pinned: it imports torch at import time (our CPU torch 2.13 serves;
# pip warns that 2.4 is its cap, which is harmless here) and pkg_resources (setuptools < 80).
set -euo pipefail
DEST="$1"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
rm -rf "$DEST/venv"
"$PY" -m venv "$DEST/venv"
PIP=("$DEST/venv/bin/python" -m pip install --no-input --disable-pip-version-check)
"${PIP[@]}" --no-deps rknn-toolkit2==2.5.0 torch==2.13.0
"${PIP[@]}" numpy==1.26.4 onnx==1.18.0 onnxruntime==1.19.2 protobuf==4.25.4 \
    scipy==1.17.1 ruamel.yaml==0.19.1 tqdm==4.70.1 opencv-python-headless==4.11.0.86 \
    fast-histogram==0.14 psutil==7.2.2 typing_extensions==4.16.0 sympy==1.14.0 \
    filelock==4.3.1 networkx==3.6.1 jinja2==3.1.6 fsspec==2026.9.0 "setuptools==65.5.0"
# the import is the check: it loads the compiler's native libraries and pkg_resources
"$DEST/venv/bin/python" -c "from rknn.api import RKNN; import importlib.metadata as m; print('rknn-toolkit2', m.version('rknn-toolkit2'))"
