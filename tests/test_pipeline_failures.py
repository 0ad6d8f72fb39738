"""A CPU schedule rule or rewrite that raises leaves the build correct but slower; the
build names what failed (cpu_schedule/failures.py): the compile's log warns and the
manifest's "cpu_schedules" lists each kernel with its error."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from portable_pe.cpu_schedule import cpu_pipeline
from portable_pe.cpu_schedule import pipeline as cpu_pipeline_module
from portable_pe.cpu_schedule.failures import PipelineFailures, error_summary, warning_line

HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _dense_module():
    w = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tirx.Var("rows", "int64"), 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    return bb.get(), w


def _broken(*_args, **_kwargs):
    raise RuntimeError("rule broke on purpose\n  a traceback line")


def test_a_rule_that_raises_is_named_in_the_report_and_the_result_is_still_right(monkeypatch):
    monkeypatch.setattr(cpu_pipeline_module, "schedule_prim_func", _broken)
    mod, w = _dense_module()
    pipeline = cpu_pipeline(HOST)
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST, relax_pipeline=pipeline), tvm.cpu())
    section = pipeline.report()["cpu_schedules"]
    assert section["unscheduled"] == {"matmul": "rule broke on purpose"}, section
    x = np.random.default_rng(1).standard_normal((5, 64)).astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x @ w, rtol=1e-5, atol=1e-5)


def test_a_build_where_every_rule_went_through_reports_nothing():
    mod, _ = _dense_module()
    pipeline = cpu_pipeline(HOST)
    tvm.compile(mod, target=HOST, relax_pipeline=pipeline)
    assert pipeline.report() == {}


def test_the_warning_names_the_kernels_and_the_failed_rewrites():
    failures = PipelineFailures()
    for name in ("k5", "k1", "k3", "k2", "k4"):
        failures.kernel(name, ValueError(f"{name} failed"))
    failures.rewrite("attention not fused", KeyError("x"))
    line = warning_line(failures.to_manifest()["cpu_schedules"])
    assert line.startswith("warning: 5 kernel(s) left unscheduled"), line
    assert "k1, k2, k3, k4, ..." in line and "1 rewrite(s) failed (attention not fused: 'x')" in line, line
    assert error_summary(RuntimeError("\n\n  first\nsecond")) == "first"


def test_the_compile_warns_and_the_manifest_lists_the_unscheduled_kernels(monkeypatch, tmp_path):
    from conftest import TINY_SPEC
    from portable_pe.compile.pipeline import compile_graph
    monkeypatch.setattr(cpu_pipeline_module, "schedule_f32_dense", _broken)
    monkeypatch.setattr(cpu_pipeline_module, "_schedule_matmul", _broken)
    lines = []
    bundle = compile_graph(str(TINY_SPEC), target="llvm", out=tmp_path / "tiny", log=lines.append)
    unscheduled = bundle.manifest["cpu_schedules"]["unscheduled"]
    assert unscheduled and all("matmul" in name for name in unscheduled), unscheduled
    assert set(unscheduled.values()) == {"rule broke on purpose"}, unscheduled
    assert any(line.strip().startswith("warning:") and "unscheduled" in line for line in lines), lines
