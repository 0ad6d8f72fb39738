"""The guide's length section: what each encoder and its compiled artifacts do at lengths
beyond its table or its export example.

Per encoder: its hard limit (a learned table's rows, else none: the position work is
computed from positions), the llvm bundle's outputs against PyTorch at 2x and 4x the export
example length (lengths the trace never saw), and what the bundle does one past the longest
length it accepts: run, or refuse with the runtime's error. NPU builds are static: the NPU
section shows which lengths each encoder built at, and a model built at N takes N only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def check(specs: dict, bundles: dict[str, str], *, multiples: tuple[int, ...] = (2, 4)) -> list[dict]:
    """One row per encoder: limits, parity at multiples of the example length, refusal."""
    from ..bundle.artifact import load_bundle
    from ..run.parity import compare, torch_reference
    from .cpu import Runner
    from ..run.local import InputError
    rows = []
    for name, spec in specs.items():
        runner = Runner(load_bundle(Path(bundles[name])))
        reference = torch_reference(spec.to_dict())
        table = spec.build().pe.max_length
        accepted = runner.bundle.manifest["dims"]["seq"]["max"]
        row = {"graph": name, "encoding": spec.encoding, "example_length": spec.example_length,
               "table_limit": table, "bundle_max_length": accepted, "checks": []}
        rng = np.random.default_rng(1)
        for k in multiples:
            seq = k * spec.example_length
            x = rng.standard_normal((1, seq, spec.model.d_model)).astype(np.float32)
            try:
                args = runner.args(x)
            except InputError as err:
                row["checks"].append({"seq": seq, "multiple": k, "ok": False, "refused": str(err)})
                continue
            got = runner.vm["main"](*args)
            got = got if hasattr(got, "numpy") else got[0]
            ref = reference({"x": x, "positions": np.arange(seq, dtype=np.int64)})
            (c,) = compare(ref, {"hidden": got.numpy()}, name="tvm", length=seq)
            row["checks"].append({"seq": seq, "multiple": k, "ok": c.ok, "max_abs": c.max_abs, "cosine": c.cosine})
        beyond = accepted + 1
        try:
            runner.args(np.zeros((1, beyond, spec.model.d_model), np.float32))
            row["beyond"] = {"seq": beyond, "refused": None}
        except InputError as err:
            row["beyond"] = {"seq": beyond, "refused": str(err)}
        rows.append(row)
    return rows
