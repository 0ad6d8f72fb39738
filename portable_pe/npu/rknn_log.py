"""Read RKNN-Toolkit2's verbose build log: where each op runs, and the vendor's own words.

With RKNN(verbose=True) the compiler prints a "Network Layer Information Table", one line
per op of the graph it built (after its own fusions: LayerNormalization becomes exNorm,
MatMul+Softmax+MatMul exSDPAttention, linears Conv):

    D RKNN: [..] ID   OpType  DataType Target InputShape  OutputShape  Cycles(DDR/NPU/Total)  RW(KB)  FullName
    D RKNN: [..] 35   Erf     FLOAT16  CPU    (1,1024,1,128)  (1,1024,1,128)  0/0/0  256  Erf:npu_n_erf_1

The table says NPU or CPU but not why; the why is the warnings and errors the toolkit
printed that name the op, and otherwise the table's own row (RKNN 2.5 prints nothing more
for an op it has no NPU kernel for). Its Cycles and RW(KB) columns are the compiler's
estimate of each op's NPU cycles and memory traffic: a CPU op's RW is what crosses between
NPU and CPU memory for it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROW = re.compile(r"^D RKNN: \[[^\]]*\]\s+(\d+)\s+(\S+)\s+(\S+)\s+(NPU|CPU|GPU)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
#: the toolkit's own input/output operators: RKNN places them on the CPU in every model
IO_OPS = ("InputOperator", "OutputOperator")


@dataclass
class LayerRow:
    id: int
    op: str
    dtype: str
    target: str
    input_shape: str
    output_shape: str
    name: str  # "OpType:onnx node or tensor name"
    cycles: int  # the compiler's total cycle estimate (0 for CPU ops)
    rw_kb: float
    row: str  # the table's line as RKNN printed it

    @property
    def onnx_name(self) -> str:
        return self.name.split(":", 1)[1] if ":" in self.name else self.name


def clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in text.splitlines()]


def layer_table(text: str) -> list[LayerRow]:
    """The first layer table of the build stage (the simulator does not print one)."""
    rows, started = [], False
    for line in clean(text):
        if "Network Layer Information Table" in line:
            if started:
                break
            started = True
            continue
        m = _ROW.match(line) if started else None
        if m:
            i, op, dtype, target, ins, outs, cycles, rw, name = m.groups()
            total = cycles.split("/")[-1]
            rows.append(LayerRow(int(i), op, dtype, target, ins, outs, name, int(total) if total.isdigit() else 0,
                                 _number(rw), line.split("] ", 1)[-1].strip()))
    return rows


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def vendor_messages(text: str, *, levels: str = "WE") -> list[str]:
    """The toolkit's warning/error lines ("W ..."/"E ..."), deduplicated, in order."""
    seen, out = set(), []
    for line in clean(text):
        if len(line) > 2 and line[0] in levels and line[1] == " " and line not in seen:
            seen.add(line)
            out.append(line)
    return out


def placement(text: str) -> dict:
    """What the manifest records: op counts per target, and every op on the CPU with why."""
    rows = layer_table(text)
    if not rows:
        raise ValueError("the RKNN build log holds no layer table (was the toolkit run with verbose=True?)")
    messages = vendor_messages(text)
    compute = [r for r in rows if r.op not in IO_OPS]
    on_cpu = []
    for r in compute:
        if r.target == "NPU":
            continue
        said = [m for m in messages if r.onnx_name in m or f" {r.op} " in m]
        on_cpu.append({"id": r.id, "op": r.op, "name": r.onnx_name, "dtype": r.dtype, "target": r.target,
                       "input_shape": r.input_shape, "output_shape": r.output_shape, "rw_kb": r.rw_kb,
                       "why": said or [f"RKNN's layer table: {' '.join(r.row.split()[:5])} ... "
                                       f"(RKNN printed no warning or error for it)"]})
    return {"ops_total": len(compute), "ops_npu": sum(r.target == "NPU" for r in compute),
            "ops_cpu": len(on_cpu), "io_ops": len(rows) - len(compute),
            "npu_cycles": sum(r.cycles for r in compute), "cpu_rw_kb": sum(o["rw_kb"] for o in on_cpu),
            "npu_ops": dict(Counter(r.op for r in compute if r.target == "NPU")),
            "cpu_ops": on_cpu}


def rows_as_dicts(text: str) -> list[dict]:
    return [asdict(r) for r in layer_table(text)]
