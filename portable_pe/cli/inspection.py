"""`portable-pe inspect`: what a bundle's manifest says (its checksums verified), or what an
.onnx file holds and which of its nodes would block a compile."""

from __future__ import annotations

import json
from pathlib import Path


def inspect_onnx(path: Path) -> int:
    """What a compile would meet: inputs, ops, and the nodes that would block the import."""
    import onnx
    from collections import Counter
    from ..compile.frontend import blocking_nodes
    from ..user_files import load_onnx_file
    model = load_onnx_file(path)  # what compile accepts, checked the same way
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    print(f"onnx {path}: {len(model.graph.node)} nodes, opsets: {opsets}, producer {model.producer_name or '?'}")
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for vi in values:
            dims = [d.dim_param or d.dim_value or "?" for d in vi.type.tensor_type.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) if vi.type.tensor_type.elem_type else "?"
            print(f"  {kind:6} {vi.name}: {dtype}[{', '.join(map(str, dims))}]")
    print("  ops: " + ", ".join(f"{op} x{n}" for op, n in Counter(n.op_type for n in model.graph.node).most_common()))
    _print_shape_following(model)
    _print_dim_relations(model)
    blocked = blocking_nodes(model)
    if not blocked:
        print("  import: every node has a converter (TVM's or portable-pe's)")
        return 0
    print(f"  import: {len(blocked)} node(s) would block compilation:")
    for b in blocked:
        print(f"    {b['node']}: {b['op']} ({b['domain'] or 'ai.onnx'} opset {b['opset']}): {b['reason']}")
    return 1


def _print_dim_relations(model) -> None:
    """How the input dims are tied, as the compile will learn it (onnxruntime runs the graph)."""
    from ..compile.bf16_mul import widen_bf16_mul
    from ..compile.relation_probe import DimRelationError, learn_relations
    from ..spec.io_names import describe_io
    said = []
    try:
        runnable, _ = widen_bf16_mul(model)  # what the compile's probe runs (onnxruntime has no bf16 Mul)
        io = learn_relations(runnable, describe_io(runnable, None), log=said.append)
    except DimRelationError as err:
        print(f"  dims: not related: {err}")
        return
    except Exception as err:  # pylint: disable=broad-except  # a graph onnxruntime cannot load: said elsewhere
        print(f"  dims: not tried ({' '.join(str(err).split())[:160]})")
        return
    for line in said:  # each relation learned, or the dims kept at one length, with why
        print(f"  {line.strip()}")
    if not said:
        print(f"  dims: independent ({', '.join(io['dims']) or 'none symbolic'})")


def _print_shape_following(model) -> None:
    """The first node whose dims legalize cannot follow, with what it saw."""
    from ..legalize.follow import first_unfollowed, input_dims
    lost = first_unfollowed(model)
    if lost is None:
        print(f"  shapes: every node's dims are expressions of the input dims ({', '.join(input_dims(model)) or 'all static'})")
        return
    print(f"  shapes: cannot follow node {lost['node']} ({lost['op']}): {lost['why']}")
    for line in lost["inputs"]:
        print(f"    it saw {line}")
    for line in lost["outputs"]:
        print(f"    it gives {line}")


def cmd_inspect(args) -> int:
    from ..bundle.artifact import load_bundle
    from ..spec.dims import DimBound
    if Path(args.bundle).suffix == ".onnx":
        return inspect_onnx(Path(args.bundle))
    bundle = load_bundle(args.bundle)
    m = bundle.manifest
    print(f"bundle {bundle.path}: graph {m['graph']['name']} ({m['graph']['source']}), "
          f"encoding {m['encoding']}, target {m['target']['name']}")
    print(f"  tvm target: {json.dumps(m['target']['tvm'])}")
    for kind in ("inputs", "outputs"):
        for io in m[kind]:
            print(f"  {kind[:-1]:6} {io['name']}: {io['dtype']}[{', '.join(map(str, io['dims']))}]")
    for dim, info in m.get("dims", {}).items():
        step = f" in steps of {info['multiple']}" if info.get("multiple", 1) > 1 else ""
        print(f"  dim {dim} ({info['role']}): {info['min']}..{info['max']}{step} {info.get('why', '')}")
    for bound in map(DimBound.from_json, m.get("dim_sums", [])):
        print(f"  dims {bound.text} <= {bound.max} {bound.why}")
    print(f"  simplify: {m['simplify'].get('nodes_before')} -> {m['simplify'].get('nodes_after')} nodes")
    at = ", ".join("x".join(map(str, s.values())) for s in m["reference"]["sizes"]) if "sizes" in m["reference"] \
        else f"T={m['reference']['lengths']}"
    print(f"  reference: {m['reference']['source']} at {at}")
    print(f"  versions: {m['versions']}")
    if m.get("vendor"):
        from ..npu.vendors import vendor_hooks
        v = m["vendor"]
        print(f"  vendor: {vendor_hooks(v['name']).describe(v) if v.get('built') else v['name'] + ' no build (' + str(v.get('why')) + ')'}")
    print("  files: " + ", ".join(f"{n} (sha256 {h[:12]})" for n, h in m["files"].items()) + " [verified]")
    return 0
