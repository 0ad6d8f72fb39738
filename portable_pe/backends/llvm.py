"""The host CPU."""

from __future__ import annotations

import os

import tvm


def tvm_target(spec, **options) -> tvm.target.Target:
    config = dict(spec.tvm)
    if config.get("mcpu") == "host":
        config["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
    config.setdefault("num-cores", os.cpu_count() or 1)
    return tvm.target.Target(config)


def relax_pipeline(target):
    # TVM's stock CPU pipeline schedules nothing (serial, scalar loops): ours adds
    # parallel, vectorized, tiled schedules for every kernel.
    from ..cpu_schedule import cpu_pipeline
    return cpu_pipeline(target)


def legalize_onnx(model, state):
    return model


def export_library(executable, path) -> None:
    executable.export_library(str(path))
