"""The engines `portable-pe bench` times: each one as its users run it.

An engine is built once per bench (``make(ctx)``), then per cell ``prepare(inputs)``
gives ``(run, fetch)``: run() is what gets timed, fetch(result) turns its result into
numpy. ``ctx`` holds the bundles (``bundle``: float32, ``tuned``, ``int8``, ``bf16``), the thread
count and the pool mode:

* ``default``: every engine's own defaults at an equal thread count: onnxruntime spins
  its intra-op pool, OpenVINO runs its CPU plugin's latency defaults, TVM and torch keep
  their pools' default spin. Engines are timed in blocks (bench.time_in_blocks), so an
  engine's spinning pool only ever competes with itself.
* ``passive``: idle workers sleep (threads.set_threads' passive settings,
  onnxruntime ``allow_spinning=0``), for machines shared with other work.

The int8 engines run the int8 bundle: its model.onnx is the quantized (QDQ) graph, the
same one TVM compiled, so onnxruntime and OpenVINO quantize nothing themselves.
"""

from __future__ import annotations

import numpy as np

from ..spec.io_names import HIDDEN

NO_TUNING = "n/a (no tuning database)"
# the recheck timed every tuned entry no faster than the dynamic main: a tuned compile builds what "tvm" runs
NO_TUNED_ENTRY = "n/a (every tuned entry left out: main was as fast)"
NO_INT8 = "n/a (no int8 bundle)"
NO_BF16 = "n/a (no bf16 bundle)"
POOLS = ("default", "passive")


def torch_engine(ctx: dict, *, compiled: bool):
    import torch
    from ..spec.graphs import GraphSpec
    spec = ctx["bundle"].manifest["graph"]["spec"]
    if spec is None:
        raise ValueError("the graph came as an ONNX file: there is no PyTorch model to run")
    model = GraphSpec.from_dict(spec, source="bundle manifest").build().eval()
    if compiled:  # static shapes: inductor's best case, one compile per cell (in warm-up)
        model = torch.compile(model, dynamic=False)

    def prepare(inputs):
        feeds = {k: torch.from_numpy(v) for k, v in inputs.items()}

        def run():
            with torch.inference_mode():
                return model(**feeds)
        return run, lambda out: {HIDDEN: out.numpy()}
    return prepare


def _bundle(ctx: dict, key: str):
    bundle = ctx.get(key)
    if bundle is None:
        raise LookupError({"tuned": ctx.get("tuned_missing") or NO_TUNING, "int8": NO_INT8}.get(key)
                          or ctx.get("bf16_missing") or NO_BF16)
    return bundle


def ort_engine(ctx: dict, *, bundle: str = "bundle"):
    from ..compile.simplify import ort_session
    session = ort_session(_bundle(ctx, bundle).file("model.onnx"), threads=ctx["threads"],
                          spin=ctx.get("pool", "default") != "passive")
    names = [o.name for o in session.get_outputs()]
    wanted = [i.name for i in session.get_inputs()]

    def prepare(inputs):
        feeds = _own_inputs(inputs, wanted)
        return (lambda: session.run(names, feeds)), (lambda out: dict(zip(names, out)))
    return prepare


def _own_inputs(inputs: dict, wanted: list[str]) -> dict:
    """The feeds a model takes: an NPU bundle's graph has its positions folded to constants,
    so it takes fewer inputs than the float bundle the cell's inputs were made for."""
    missing = [n for n in wanted if n not in inputs]
    if missing:
        raise ValueError(f"the model takes input(s) {missing} the bench did not make (it made {sorted(inputs)})")
    return {n: inputs[n] for n in wanted}


def openvino_engine(ctx: dict, *, bundle: str = "bundle", f32: bool = False):
    """OpenVINO's CPU plugin on the bundle's model.onnx, at its defaults but for the thread
    count (its default is every core). `f32`: INFERENCE_PRECISION_HINT=f32, the float32
    compute a user gets by asking for it where the default is bf16 (the equal-precision peer)."""
    try:
        import openvino as ov
    except ImportError:
        raise RuntimeError("openvino is not installed (pip install openvino, pinned in pyproject.toml)") from None
    path = _bundle(ctx, bundle).file("model.onnx")
    config = {"INFERENCE_NUM_THREADS": ctx["threads"], **({"INFERENCE_PRECISION_HINT": "f32"} if f32 else {})}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    # OpenVINO's CPU default computes float32 models in bf16 where the CPU has bf16 support
    # (avx512_bf16, AMX): that is what its users get, so it is kept, recorded, and judged
    # by the bf16 tolerance (the float32 one would fail it on such CPUs)
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    ctx.setdefault("compute_precision", {})["openvino-int8" if bundle == "int8" else "openvino-f32" if f32 else "openvino"] = \
        hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]
    wanted = [i.get_any_name() for i in compiled.inputs]

    def prepare(inputs):
        feeds = _own_inputs(inputs, wanted)

        def fetch(result):
            return {name: np.asarray(result[output]) for name, output in zip(names, compiled.outputs)}
        return (lambda: request.infer(feeds)), fetch
    return prepare


def tvm_engine(ctx: dict, *, bundle: str = "bundle"):
    import tvm
    from ..run.local import LocalRunner, entry_for
    bundle = _bundle(ctx, bundle)
    runner = LocalRunner(bundle)
    inputs_order = [spec["name"] for spec in bundle.manifest["inputs"]]
    outputs = [o["name"] for o in bundle.manifest["outputs"]]

    def prepare(inputs):
        # the tuned entry for exactly these shapes if the bundle has one (what run() would pick)
        main = runner.vm[entry_for(bundle.manifest, inputs)]
        args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[n]), device=runner.device) for n in inputs_order]

        def fetch(out):
            values = [out] if hasattr(out, "numpy") else list(out)
            return {name: v.numpy() for name, v in zip(outputs, values)}
        return (lambda: main(*args)), fetch
    return prepare


ENGINES = {
    "torch": lambda ctx: torch_engine(ctx, compiled=False),
    "torch.compile": lambda ctx: torch_engine(ctx, compiled=True),
    "onnxruntime": ort_engine,
    "openvino": openvino_engine,
    "openvino-f32": lambda ctx: openvino_engine(ctx, f32=True),
    "tvm": tvm_engine,
    "tvm-tuned": lambda ctx: tvm_engine(ctx, bundle="tuned"),
    "onnxruntime-int8": lambda ctx: ort_engine(ctx, bundle="int8"),
    "openvino-int8": lambda ctx: openvino_engine(ctx, bundle="int8"),
    "tvm-int8": lambda ctx: tvm_engine(ctx, bundle="int8"),
    "tvm-bf16": lambda ctx: tvm_engine(ctx, bundle="bf16"),
}

#: engines that run the int8 bundle; each table's ratios are to its peer
INT8_ENGINES = ("onnxruntime-int8", "openvino-int8", "tvm-int8")
#: the bf16 bundle's engine; its peer is OpenVINO at its default (bf16 compute on bf16 CPUs)
BF16_ENGINES = ("tvm-bf16",)
PEERS = {"fp32": "onnxruntime", "int8": "onnxruntime-int8", "bf16": "openvino"}


def precision_of(engine: str) -> str:
    return "int8" if engine in INT8_ENGINES else "bf16" if engine in BF16_ENGINES else "fp32"
