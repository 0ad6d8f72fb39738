"""The parity harness: one way to make inputs, one tolerance table, one comparison.

The reference is PyTorch eager (rebuilt from the bundle's graph spec) or, for a graph
that came as a foreign ONNX file, onnxruntime on that graph. Candidates are onnxruntime
and the compiled TVM artifact. Each output is checked for shape and dtype before values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..spec.dims import dim_sum_error
from ..spec.io_names import BATCH, HIDDEN, PIXEL_ROLES, POSITIONS, SEQ, X, dim_roles, is_position_input
from ..spec.schema import multiple_text

#: absolute and relative (to the reference's largest magnitude) error allowed, by dtype.
#: A result passes when max_abs <= atol + rtol * max|ref| and cosine >= min_cosine.
TOLERANCES = {
    "float32": {"atol": 1e-4, "rtol": 1e-4, "min_cosine": 0.9999},
    "float16": {"atol": 2e-2, "rtol": 1e-2, "min_cosine": 0.999},
    # int8-quantized graphs (npu): judged mainly by cosine; max abs within 10% of max|ref|
    "int8": {"atol": 0.0, "rtol": 0.1, "min_cosine": 0.99},
    # float32 graphs whose stored position tables are int8 rows (--pe-tables int8): each
    # table entry is off by up to half a step (max|row|/254), about 0.4% of the table
    "int8_tables": {"atol": 0.0, "rtol": 1e-2, "min_cosine": 0.9999},
    # --precision int8 (CPU): the constant-weight matmuls in int8, the rest float32;
    # calibrated on lengths 1..512, every shipped graph measured at cosine >= 0.9998
    "int8_linear": {"atol": 0.0, "rtol": 0.05, "min_cosine": 0.999},
    # a float32 graph a peer engine computes in bf16 (OpenVINO's CPU default where the CPU
    # has bf16): 8 mantissa bits, so about 0.4% of the output's magnitude per rounding
    "bf16_compute": {"atol": 0.0, "rtol": 5e-2, "min_cosine": 0.999},
    # --precision bf16 (CPU): the constant-weight matmuls on bf16 operands with float32
    # accumulation, the rest float32 (cpu_schedule/bf16_linear.py)
    "bf16_linear": {"atol": 0.0, "rtol": 2e-2, "min_cosine": 0.9995},
}
DEFAULT_LENGTHS = (1, 7, 128, 300)
#: a vision bundle's default sizes, in patches per axis (2 x 3, 4 x 4 and 5 x 3 patches;
#: video: 2 frame groups): none of them square with the export example's, one not square
DEFAULT_GRIDS = ((2, 3), (4, 4), (5, 3))


def tolerance_for(dtype: str, overrides: dict | None = None) -> dict:
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {dtype!r}; known: {', '.join(TOLERANCES)}")
    return {**TOLERANCES[dtype], **(overrides or {}).get(dtype, {})}


def make_inputs(input_specs: list[dict], *, length: int = 1, batch: int = 1, seed: int = 0,
                dim_roles: dict[str, str] | None = None, sizes: dict[str, int] | None = None,
                dim_sizes: dict[str, int] | None = None, relations=None) -> dict[str, np.ndarray]:
    """Seeded inputs: symbolic 'seq' dims take `length`, 'batch' dims take `batch`, pixel
    dims (height, width, frames) their size in `sizes` ({role: pixels}); `dim_sizes`
    ({dim: size}) sets single dims, and a dim tied to others by one of `relations`
    (DimRelation records or their JSON: a mask's ``s53 = past + T``) takes their sum.

    Float inputs are standard normal; position inputs count 0..T-1; masks are ones;
    other integer inputs (token ids) are drawn below the input's declared limit.
    """
    from ..spec.dims import DimRelation
    rng = np.random.default_rng(seed)
    roles = dim_roles or {}
    given = {BATCH: batch, SEQ: length, **(sizes or {})}
    tied = {r.dim: r for r in (r if isinstance(r, DimRelation) else DimRelation.from_json(r) for r in relations or ())}

    def size(d):
        if isinstance(d, int):
            return d
        if d in tied:
            return sum(c * size(t) for t, c in tied[d].terms.items())
        return (dim_sizes or {}).get(d, given[roles.get(d, SEQ)])

    arrays = {}
    for spec in input_specs:
        shape = [size(d) for d in spec["dims"]]
        name, dtype = spec["name"], np.dtype(spec["dtype"])
        if dtype.kind == "f":
            arrays[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        elif is_position_input(name):
            arrays[spec["name"]] = np.broadcast_to(np.arange(shape[-1] if shape else 1), shape).astype(dtype).copy()
        elif "mask" in name.lower():
            arrays[spec["name"]] = np.ones(shape, dtype)
        else:
            high = spec.get("high", 2)
            arrays[spec["name"]] = rng.integers(0, high, shape).astype(dtype)
    return arrays


@dataclass
class Comparison:
    candidate: str
    length: int | str  # a sequence length, or a vision bundle's size ("32x48")
    output: str
    shape: list
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    why: str = ""
    gating: bool = True  # False: shown side by side, but the report's verdict ignores it


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], *,
            name: str, length: int | str, tolerance_overrides: dict | None = None) -> list[Comparison]:
    rows = []
    for out, ref in reference.items():
        got = candidate.get(out)
        if got is None:
            rows.append(Comparison(name, length, out, list(ref.shape), np.inf, np.inf, 0.0, False, "missing output"))
            continue
        if got.shape != ref.shape or got.dtype != ref.dtype:
            rows.append(Comparison(name, length, out, list(got.shape), np.inf, np.inf, 0.0, False,
                                   f"got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"))
            continue
        tol = tolerance_for(str(ref.dtype), tolerance_overrides)
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        max_abs = float(np.max(np.abs(r - g))) if r.size else 0.0
        denom = float(np.linalg.norm(r) * np.linalg.norm(g))
        cosine = float(r @ g / denom) if denom else float(max_abs == 0.0)
        ok = bool(np.all(np.isfinite(g)) and max_abs <= tol["atol"] + tol["rtol"] * scale
                  and cosine >= tol["min_cosine"])
        why = "" if ok else f"atol {tol['atol']:g} + rtol {tol['rtol']:g}*{scale:.3g}, min cosine {tol['min_cosine']}"
        rows.append(Comparison(name, length, out, list(ref.shape), max_abs,
                               max_abs / scale if scale else max_abs, cosine, ok, why))
    return rows


@dataclass
class ParityReport:
    graph: str
    target: str
    reference: str
    rows: list[Comparison] = field(default_factory=list)
    #: why the compiled artifact did not run here (a board's or a GPU's bundle): the
    #: verdict is then UNVERIFIED, never PASS, whatever onnxruntime's rows say
    unverified: str = ""

    @property
    def ok(self) -> bool:
        """Nothing that decides the verdict failed (PASS, or UNVERIFIED with passing rows);
        peer rows (onnxruntime on an int8 graph) are shown but never decide it."""
        gating = [r for r in self.rows if r.gating]
        return (bool(gating) or bool(self.unverified)) and all(r.ok for r in gating)

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.ok else "UNVERIFIED" if self.unverified else "PASS"

    def worst(self, candidate: str) -> float:
        return max((r.max_abs for r in self.rows if r.candidate == candidate), default=float("nan"))

    def to_json(self) -> str:
        return json.dumps({"graph": self.graph, "target": self.target, "reference": self.reference,
                           "ok": self.ok, "verdict": self.verdict, "unverified": self.unverified,
                           "rows": [asdict(r) for r in self.rows]}, indent=2)

    def to_markdown(self) -> str:
        lines = [f"### parity: {self.graph} on {self.target} (reference: {self.reference})", "",
                 f"| candidate | {'size' if any(isinstance(r.length, str) for r in self.rows) else 'T'} | output | shape "
                 "| max abs | max rel | cosine | result |",
                 "|---|---:|---|---|---:|---:|---:|---|"]
        for r in self.rows:
            lines.append(f"| {r.candidate} | {r.length} | {r.output} | {'x'.join(map(str, r.shape))} | "
                         f"{r.max_abs:.2e} | {r.max_rel:.2e} | {r.cosine:.6f} | "
                         f"{'ok' if r.ok else 'FAIL (' + r.why + ')'}{'' if r.gating else ' (peer, not gating)'} |")
        lines += ["", f"**{self.verdict}**"]
        if self.unverified:
            lines[-1] += (f" (the compiled model did not run here: {self.unverified}. "
                          f"{'Only onnxruntime was compared; ' if self.rows else ''}"
                          "run the bundle where it can run, e.g. `portable-pe deploy`)")
        return "\n".join(lines)


def pixel_roles(manifest: dict) -> list[str]:
    """A vision bundle's pixel dims by role, in axis order (frames, height, width); [] otherwise."""
    present = {info.get("role") for info in manifest.get("dims", {}).values()}
    return [role for role in PIXEL_ROLES if role in present]


def size_label(sizes: dict[str, int]) -> str:
    """"32x48" for {"height": 32, "width": 48} (frames first when there are frames)."""
    return "x".join(str(sizes[role]) for role in PIXEL_ROLES if role in sizes)


def parse_sizes(text: str, roles: list[str]) -> dict[str, int]:
    """{"height": 32, "width": 48} from "32x48" for a bundle whose pixel roles are `roles`."""
    values = text.split("x")
    if not roles:
        raise ValueError(f"--sizes {text!r}: this bundle has no image dims to size (not a vision bundle, or its "
                         "image size is pinned: it runs at the one size it was built for)")
    if len(values) != len(roles) or not all(v.isdigit() for v in values):
        raise ValueError(f"--sizes {text!r}: expected {'x'.join(r.upper()[0] for r in roles)} "
                         f"({', '.join(roles)} in pixels), e.g. {'x'.join(['32'] * len(roles))}")
    return dict(zip(roles, map(int, values)))


def default_sizes(manifest: dict, grids=DEFAULT_GRIDS) -> list[dict[str, int]]:
    """`grids` (patches per axis; DEFAULT_GRIDS) in pixels for a vision bundle, within its
    bounds (a video's frames: 2 units of its frame multiple)."""
    roles, dims = pixel_roles(manifest), {info["role"]: info for info in manifest["dims"].values()}
    out = []
    for grid in grids:
        counts = ([2] if len(roles) == 3 else []) + list(grid)
        sizes = {role: n * dims[role].get("multiple", 1) for role, n in zip(roles, counts)}
        if all(dims[r]["min"] <= s <= dims[r]["max"] for r, s in sizes.items()):
            out.append(sizes)
    return out


def size_error(manifest: dict, sizes: dict[str, int]) -> str | None:
    """Why a vision bundle cannot take `sizes`, or None."""
    dims = {info["role"]: info for info in manifest["dims"].values()}
    for role, size in sizes.items():
        info = dims[role]
        if not info["min"] <= size <= info["max"]:
            return f"{role} {size} is outside {info['min']}..{info['max']}"
        if size % info.get("multiple", 1):
            return f"{role} {size} is not a multiple of {multiple_text(info['multiple'], info.get('patch', info['multiple']))}"
    return None


def usable_lengths(manifest: dict, lengths) -> list[int]:
    """The requested lengths the bundle accepts; a static graph has its one length."""
    seq = [info for info in manifest.get("dims", {}).values() if info.get("role") == SEQ]
    if not seq:
        return [manifest.get("static_length", 0)]
    lo, hi = max(i["min"] for i in seq), min(i["max"] for i in seq)
    seq_dims = [d for d, i in manifest.get("dims", {}).items() if i.get("role") == SEQ]
    # every seq dim at n (a KV cache's past too): a bound on their sum may refuse n
    return [n for n in lengths if lo <= n <= hi and not dim_sum_error(manifest, dict.fromkeys(seq_dims, n))]


def check_request(manifest: dict, *, lengths, batch: int = 1, sizes=()) -> None:
    """Refuse sequence lengths, pixel sizes or a batch the bundle cannot take, naming its bounds."""
    for wanted in sizes:
        why = size_error(manifest, wanted)
        if why:
            raise ValueError(f"--sizes {size_label(wanted)}: {why}; this bundle accepts "
                             + ", ".join(f"{info['role']} {info['min']}..{info['max']} in steps of {info.get('multiple', 1)}"
                                         for info in manifest["dims"].values() if info["role"] in PIXEL_ROLES))
    if pixel_roles(manifest):
        lengths = ()  # a vision bundle's cases are sizes, not lengths
    bad = sorted(set(lengths) - set(usable_lengths(manifest, lengths)))
    if bad:
        seq = [f"{info['min']}..{info['max']}" for info in manifest.get("dims", {}).values() if info["role"] == SEQ]
        accepts = f"lengths in {seq[0]}" if seq else f"only its static length {manifest.get('static_length')}"
        raise ValueError(f"--lengths {','.join(map(str, bad))}: this bundle accepts {accepts}")
    batches = [info for info in manifest.get("dims", {}).values() if info["role"] == BATCH]
    top = batches[0]["max"] if batches else 1
    if not 1 <= batch <= top:
        raise ValueError(f"--batch {batch}: this bundle accepts batch sizes 1..{top}")


def torch_reference(spec_dict: dict):
    """PyTorch eager as a callable on named numpy inputs (the encoder rebuilt from its spec)."""
    import torch
    from ..spec.graphs import GraphSpec
    model = GraphSpec.from_dict(spec_dict, source="bundle manifest").build()

    def run(inputs):
        feeds = {k: torch.from_numpy(v) for k, v in inputs.items()}
        if X in feeds and POSITIONS not in feeds:  # an NPU graph has positions folded in as arange(T)
            feeds[POSITIONS] = torch.arange(feeds[X].shape[1])
        with torch.no_grad():
            out = model(**feeds)
        return {HIDDEN: out.numpy()}
    return run


def onnxruntime_runner(onnx_path, output_names: list[str]):
    import onnx
    from ..compile.simplify import ort_session
    session = ort_session(onnx.load(str(onnx_path)))
    return lambda inputs: dict(zip(output_names, session.run(output_names, inputs)))


def openvino_runner(onnx_path, output_names: list[str]):
    """OpenVINO's CPU plugin at its defaults (bf16 compute on CPUs with AMX or AVX512-BF16),
    compiled once per input shape: OpenVINO 2026.4.1 in bf16 returns NaN for the rope graph
    at T=128 when the compiled model ran T=1 before (a fresh compile at 128 is right)."""
    import openvino as ov
    core, compiled = ov.Core(), {}

    def run(inputs):
        key = tuple(sorted((k, v.shape) for k, v in inputs.items()))
        if key not in compiled:
            compiled[key] = core.compile_model(str(onnx_path), "CPU")
        model = compiled[key]
        result = model.create_infer_request().infer({i.get_any_name(): inputs[i.get_any_name()] for i in model.inputs})
        return {name: np.asarray(result[out]) for name, out in zip(output_names, model.outputs)}
    return run


def check_bundle(bundle, *, lengths=DEFAULT_LENGTHS, batch: int = 1, seed: int = 0, sizes=None,
                 tvm_runner=None, candidates=("onnxruntime", "tvm"), extra_runners: dict | None = None) -> ParityReport:
    """Compare the bundle (and onnxruntime on its ONNX) with the reference at each length,
    or, for a vision bundle, at each of `sizes` ({role: pixels}; default: default_sizes).

    `tvm_runner` runs the compiled module (default: load it here); deploy passes one
    that runs on a board over RPC. `extra_runners` adds candidates by name (e.g. a vendor
    NPU simulator, npu/simulator.py).
    """
    from .local import LocalRunner
    manifest = bundle.manifest
    outputs = [o["name"] for o in manifest["outputs"]]
    ref_source = manifest["reference"]["source"]
    ref_model = manifest["reference"].get("model", "model.onnx")  # foreign npu bundles: the float graph
    if ref_source == "torch":
        reference = torch_reference(manifest["graph"]["spec"])
    else:
        reference = onnxruntime_runner(bundle.file(ref_model), outputs)
    runners = {"onnxruntime": lambda: onnxruntime_runner(bundle.file("model.onnx"), outputs),
               "openvino": lambda: openvino_runner(bundle.file("model.onnx"), outputs),
               "tvm": lambda: tvm_runner or LocalRunner(bundle).run}
    precision = manifest.get("precision", "fp32")
    if precision == "bf16" and "openvino" not in candidates:
        # what a bf16 user compares with: OpenVINO's default, bf16 on the CPUs this builds for
        candidates = [*candidates, "openvino"]
    if ref_source == "onnxruntime" and ref_model == "model.onnx":  # onnxruntime vs itself proves nothing
        candidates = [c for c in candidates if c != "onnxruntime"]
    active = {**{name: runners[name]() for name in candidates}, **(extra_runners or {})}
    # An int8 bundle's model.onnx is its quantized graph: onnxruntime's int8 kernels run it
    # side by side, as the peer an int8 user would compare with, without deciding the verdict
    # (its x86 U8S8 kernels round on CPUs without VNNI, see cpu_schedule/int8_isa.py); a
    # bf16 bundle's peers are onnxruntime (float32) and OpenVINO's default (bf16 compute).
    peers = {"onnxruntime", "openvino"} if precision != "fp32" else set()
    report = ParityReport(bundle.name, bundle.target, ref_source)
    roles = dim_roles(manifest)
    if pixel_roles(manifest):
        cases = [(size_label(s), {"sizes": s}) for s in (sizes if sizes is not None else default_sizes(manifest))
                 if size_error(manifest, s) is None]
    else:
        # an NPU bundle of a vision graph is pinned to one image: its case is that size, not
        # the static "length" its first pixel dim (the channels) would read as
        image = (manifest.get("npu") or {}).get("image")
        cases = [("x".join(map(str, image["shape"][2:])) if image else n, {"length": n})
                 for n in usable_lengths(manifest, lengths)]
    for label, at in cases:
        inputs = make_inputs(manifest["inputs"], batch=batch, seed=seed, dim_roles=roles,
                             relations=manifest.get("dim_relations"), **at)
        expected = reference(inputs)
        for name, run in active.items():
            rows = compare(expected, run(inputs), name=name, length=label, tolerance_overrides=manifest.get("tolerance"))
            report.rows += [replace(r, gating=name not in peers) for r in rows]
    return report
