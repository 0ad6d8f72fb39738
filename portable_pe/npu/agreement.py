"""Does our profile check agree with the vendor's placement? Both ways, node by node.

The profile check (profiles.check_model) predicts, per ONNX node, NPU or not; the vendor's
build log says where each op it built runs (e.g. rknn_log.placement). The vendor renames
what it builds from a node: the same name with "#k" when it converts the op (RKNN turns
Reciprocal into a Div "name#1"), other suffixes ("-rs", "_tp", "#1_rs") for layout ops it
inserts around a node. Converted ops are the node's own placement; inserted ones are the
vendor's and are listed apart (the profile cannot predict them, but they count as CPU ops).
"""

from __future__ import annotations

import re

_SAME_NODE = re.compile(r"^(#\d+)?$")


def _owner(name: str, nodes: list[str]) -> tuple[str | None, str]:
    """The ONNX node a vendor op name comes from (longest name that prefixes it), and the rest."""
    best = max((n for n in nodes if name.startswith(n)), key=len, default=None)
    return best, name[len(best):] if best else name


def agreement(verdicts, placement: dict) -> dict:
    """verdicts: profile verdicts on the graph the vendor was handed; placement: the
    vendor's ({"cpu_ops": [{"op", "name", ...}]}). Disagreements say which way."""
    by_name = {v.node: v for v in verdicts}
    names = list(by_name)
    on_cpu, inserted = {}, []
    for op in placement["cpu_ops"]:
        node, rest = _owner(op["name"], names)
        if node is None:  # made from a graph input or output name (e.g. RKNN's "x_rs#28")
            inserted.append(f"{op['op']} {op['name']} (made by the vendor, from no ONNX node)")
        elif _SAME_NODE.match(rest):
            on_cpu.setdefault(node, op)
        else:
            inserted.append(f"{op['op']} {op['name']} (inserted by the vendor around {node} [{by_name[node].op}])")
    refused = {v.node: v for v in verdicts if not v.allowed}
    lines = [f"profile allows {n} [{by_name[n].op}], the vendor placed it ({op['op']}) on the {op['target']}"
             for n, op in on_cpu.items() if n not in refused]
    lines += [f"profile refuses {n} [{v.op}] ({'; '.join(v.why)}), the vendor ran it on the NPU (or folded it away)"
              for n, v in refused.items() if n not in on_cpu]
    return {"agree": not lines, "disagreements": lines,
            "profile_refused": sorted(refused), "vendor_cpu_nodes": sorted(on_cpu),
            "vendor_inserted_cpu_ops": inserted}
