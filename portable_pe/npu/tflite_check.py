"""The pre-check of a TFLite graph: the profile's verdict on each operator of the int8
TFLite model a TFLite-taking vendor compiler (Vela) is handed, which is not the host ONNX
graph (litert-torch converts from PyTorch: the ONNX graph's Gather, say, has no TFLite
counterpart in it).

A profile's [tflite] table (targets/npu/ethos-u*.toml) lists the operators the NPU takes,
and the tensor dtypes (Vela's generic rules name no rank limit); npu/vela_worker.py's tflite_operators() gives, per
operator, its builtin name, output tensor (the name Vela's report uses), dtypes and rank.
The verdicts have the ONNX check's form (profiles.NodeVerdict), so agreement.py compares
them with Vela's placement the way it does RKNN's.
"""

from __future__ import annotations

from .profiles import NodeVerdict, Profile


def check_tflite(operators: list[dict], profile: Profile) -> list[NodeVerdict]:
    """One verdict per TFLite operator, in graph order."""
    rules = profile.tflite
    if not rules:
        raise ValueError(f"profile {profile.name!r} has no [tflite] table: it cannot judge a TFLite graph")
    verdicts = []
    for op in operators:
        why = []
        if op["op"] not in rules["ops"]:
            why.append(f"TFLite op {op['op']} is not in profile {profile.name}'s [tflite] ops")
        other = [d for d in op["dtypes"] if d not in rules["dtypes"]]
        if other:
            why.append(f"a tensor is {other[0]} (profile {profile.name} [tflite] dtypes {list(rules['dtypes'])})")
        verdicts.append(NodeVerdict(op["name"], op["op"], not why, why))
    return verdicts
