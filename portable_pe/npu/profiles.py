"""NPU profiles (targets/npu/*.toml), the PROFILES registry, and the per-node check.

A profile lists the ops an NPU compiler accepts, with constraints, its maximum rank,
static lengths and quantization scheme. `check_model` walks every node and says, per
node, whether the NPU takes it and if not why; nodes it refuses run on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from ..spec.registry import ROOT, read_toml, toml_registry

PROFILES_DIR = ROOT / "targets" / "npu"
DEFAULT_PROFILE = "generic_int8"
_KEYS = {"name", "description", "source", "max_rank", "seq_lens", "batch", "dtypes", "quantization", "ops",
         "vendor", "socs", "soc_ops", "accelerator", "tflite"}
#: [tflite] of a profile whose vendor is handed TFLite (Vela): the operators and tensor
#: dtypes the NPU takes (npu/tflite_check.py judges by them)
_TFLITE_KEYS = {"ops", "dtypes"}
_CONSTRAINTS = ("max_dim", "const", "not_const")  # plus attr_<name>
#: ops that only move or quantize data: no MACs, and their dtype follows their input
_DATA_OPS = {"QuantizeLinear", "DequantizeLinear", "Reshape", "Transpose", "Concat", "Slice", "Split",
             "Gather", "Squeeze", "Unsqueeze"}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    max_rank: int
    ops: dict[str, dict]
    quantization: dict
    dtypes: tuple[str, ...] = ("int8",)
    seq_lens: tuple[int, ...] = ()
    batch: int = 1
    vendor: str | None = None  # npu/vendors.py VENDORS key: whose compiler builds for this NPU
    socs: tuple[str, ...] = ()  # the chips that compiler targets; the first is the default
    soc_ops: dict = field(default_factory=dict)  # soc -> {"add": [...], "remove": [...]} vs socs[0]
    accelerator: str | None = None  # Vela's accelerator (npu/vela.py ACCELERATORS) for ethos-u profiles
    tflite: dict = field(default_factory=dict)  # [tflite]: the pre-check of the TFLite graph the vendor gets

    def check_seq_len(self, n: int) -> None:
        if self.seq_lens and n not in self.seq_lens:
            raise ValueError(f"profile {self.name!r} accepts sequence lengths {list(self.seq_lens)}, got --seq-len {n}")

    def resolve_soc(self, soc: str | None) -> str | None:
        if not self.socs:
            if soc:
                raise ValueError(f"--soc {soc}: profile {self.name!r} has no vendor compiler that targets a SoC")
            return None
        if soc and soc not in self.socs:
            raise ValueError(f"--soc {soc!r} is not a chip profile {self.name!r} builds for; valid: {', '.join(self.socs)}")
        return soc or self.socs[0]

    def for_soc(self, soc: str | None) -> "Profile":
        """The profile as `soc`'s compiler places ops (ops listed for socs[0], adjusted)."""
        change = self.soc_ops.get(soc or "", {})
        if not change:
            return self
        ops = {op: c for op, c in self.ops.items() if op not in change.get("remove", ())}
        ops.update({op: {} for op in change.get("add", ()) if op not in ops})
        return replace(self, ops=ops)

    def check_dtype(self, dtype: str) -> None:
        """--npu-dtype: int8 always (QDQ); fp16 only where the NPU runs float16."""
        runs = {"int8": "int8", "fp16": "float16"}
        if dtype not in runs:
            raise ValueError(f"--npu-dtype {dtype!r} is not one of {', '.join(runs)}")
        if runs[dtype] not in self.dtypes:
            raise ValueError(f"profile {self.name!r} runs {', '.join(self.dtypes)}, not {runs[dtype]} (--npu-dtype {dtype})")


PROFILES: dict[str, Path] = toml_registry(PROFILES_DIR)


def resolve_profile(options: dict) -> tuple[Profile, str, str | None]:
    """(the profile as the chosen SoC's compiler places ops, the NPU dtype, the SoC) from
    an npu compile's resolved options (targets/npu.toml: profile, npu_dtype, soc)."""
    profile = load_profile(options["profile"])
    profile.check_dtype(options["npu_dtype"])
    soc = profile.resolve_soc(options.get("soc"))
    return profile.for_soc(soc), options["npu_dtype"], soc


def load_profile(name_or_path: str | Path) -> Profile:
    path = Path(name_or_path)
    if path.suffix != ".toml":
        if str(name_or_path) not in PROFILES:
            raise ValueError(f"unknown NPU profile {str(name_or_path)!r}; valid: {', '.join(PROFILES)} "
                             "(or a path to a profile .toml)")
        path = PROFILES[str(name_or_path)]
    data = read_toml(path, what="NPU profile")
    unknown, missing = set(data) - _KEYS, {"name", "source", "max_rank", "ops", "quantization"} - set(data)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    unknown_socs = set(data.get("soc_ops", {})) - set(data.get("socs", ()))
    if unknown_socs:
        raise ValueError(f"{path}: [soc_ops] names {sorted(unknown_socs)}, not in socs {data.get('socs', [])}")
    if not str(data["source"]).strip():
        raise ValueError(f"{path}: `source` must cite the vendor op list the profile is written from")
    for op, cons in data["ops"].items():
        bad = [k for k in cons if k not in _CONSTRAINTS and not k.startswith("attr_")]
        if bad:
            raise ValueError(f"{path}: [ops] {op} has unknown constraint(s) {bad}; "
                             f"valid: {', '.join(_CONSTRAINTS)}, attr_<name>")
    tflite = dict(data.get("tflite", {}))
    if tflite and set(tflite) != _TFLITE_KEYS:
        raise ValueError(f"{path}: [tflite] must have exactly the keys {sorted(_TFLITE_KEYS)}, got {sorted(tflite)}")
    return Profile(name=data["name"], description=data.get("description", ""), source=data["source"],
                   max_rank=int(data["max_rank"]), ops=dict(data["ops"]), quantization=dict(data["quantization"]),
                   dtypes=tuple(data.get("dtypes", ("int8",))), seq_lens=tuple(data.get("seq_lens", ())),
                   batch=int(data.get("batch", 1)), vendor=data.get("vendor"), socs=tuple(data.get("socs", ())),
                   soc_ops=dict(data.get("soc_ops", {})), accelerator=data.get("accelerator"), tflite=tflite)


@dataclass
class NodeVerdict:
    node: str
    op: str
    allowed: bool
    why: list[str] = field(default_factory=list)
    macs: int = 0


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in [*g.input, *g.value_info, *g.output]}
    shapes.update({i.name: list(i.dims) for i in g.initializer})
    return shapes


def _macs(node, shapes) -> int:
    """Multiply-accumulates of MatMul/Gemm from the static shapes (0 for other ops)."""
    if node.op_type not in ("MatMul", "Gemm"):
        return 0
    a, out = shapes.get(node.input[0]), shapes.get(node.output[0])
    if not a or not out or None in a or None in out:
        return 0
    k = a[0] if node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
    return int(np.prod(out)) * int(k)


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def check_node(node, profile: Profile, shapes, consts: dict, producers: dict, *, quantized: bool) -> NodeVerdict:
    v = NodeVerdict(node.name or node.output[0], node.op_type, True, macs=_macs(node, shapes))
    if node.op_type not in profile.ops:
        v.why.append(f"op {node.op_type} is not in profile {profile.name}")
    ranks = {t: len(shapes[t]) for t in [*node.input, *node.output] if t and shapes.get(t) is not None}
    for t, r in ranks.items():
        if r > profile.max_rank:
            v.why.append(f"tensor {t} has rank {r} > max_rank {profile.max_rank}")
    for key, allowed in profile.ops.get(node.op_type, {}).items():
        if key == "max_dim":
            big = [(t, s) for t in [*node.input, *node.output] if t and t not in consts
                   for s in [shapes.get(t)] if s and max((d or 0) for d in s) > allowed]
            if big:
                v.why.append(f"{big[0][0]} has a dim > {allowed} (shape {big[0][1]})")
        elif key == "const":
            moving = [i for i in allowed if i < len(node.input) and node.input[i] and node.input[i] not in consts]
            if moving:
                v.why.append(f"input {moving[0]} ({node.input[moving[0]]}) is not a constant (profile: const {allowed})")
        elif key == "not_const":
            fixed = [i for i in allowed if i < len(node.input) and node.input[i] in consts]
            if fixed:
                v.why.append(f"input {fixed[0]} ({node.input[fixed[0]]}) is a constant (profile: not_const {allowed})")
        elif key.startswith("attr_"):
            name = key[5:]
            value = _attr(node, name)
            if name == "steps" and node.op_type == "Slice":  # steps is an input since opset 10
                value = consts[node.input[4]].tolist() if len(node.input) > 4 and node.input[4] in consts else [1]
            if name == "axis" and value is None:
                value = -1 if node.op_type == "Softmax" else 0
            rank = ranks.get(node.input[0], 0)
            values = value if isinstance(value, list) else [value]
            if name == "axis":
                values = [x % rank if rank else x for x in values]
            if any(x not in allowed for x in values):
                v.why.append(f"{name}={value} not allowed (profile allows {allowed})")
    if quantized and node.op_type not in _DATA_OPS and "float32" not in profile.dtypes:
        # In QDQ form a node runs int8 when each float activation input is dequantized int8.
        floats = [t for t in node.input if t and t not in consts and producers.get(t, (None,))[0] != "DequantizeLinear"
                  and shapes.get(t) is not None]
        if floats:
            v.why.append(f"input {floats[0]} is float32, not a dequantized int8 tensor "
                         f"(profile dtypes {list(profile.dtypes)})")
    v.allowed = not v.why
    return v


def check_model(model: onnx.ModelProto, profile: Profile, *, quantized: bool = False) -> list[NodeVerdict]:
    """One verdict per node, in graph order."""
    shapes = _shapes(model)
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: (n.op_type, n) for n in model.graph.node for o in n.output}
    return [check_node(n, profile, shapes, consts, producers, quantized=quantized) for n in model.graph.node]


def coverage(verdicts: list[NodeVerdict]) -> dict:
    """Nodes and MACs the NPU takes vs the host."""
    npu = [v for v in verdicts if v.allowed]
    total_macs = sum(v.macs for v in verdicts)
    npu_macs = sum(v.macs for v in npu)
    return {"nodes_total": len(verdicts), "nodes_npu": len(npu), "nodes_host": len(verdicts) - len(npu),
            "macs_total": total_macs, "macs_npu": npu_macs,
            "mac_coverage": npu_macs / total_macs if total_macs else 1.0,
            "node_coverage": len(npu) / len(verdicts) if verdicts else 1.0}


def format_blockers(verdicts: list[NodeVerdict], profile: Profile, *, graph: str, limit: int = 40) -> str:
    """The refused nodes, one a line; `graph` says which graph the check looked at (the host
    ONNX graph is not always the one the vendor's compiler is handed)."""
    bad = [v for v in verdicts if not v.allowed]
    lines = [f"{len(bad)} node(s) of {graph} are not allowed by NPU profile {profile.name} "
             f"({profile.source.split()[0]}):"]
    lines += [f"  {v.node} [{v.op}]: {'; '.join(v.why)}" for v in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"  ... and {len(bad) - limit} more")
    return "\n".join(lines)
