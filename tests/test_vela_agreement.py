"""Does the Ethos-U profiles' pre-check agree with Vela? Both ways, operator by operator.

A probe encoder holds one branch per operator class the profiles name (and some they
refuse, so that the probe reaches the CPU too); it goes the way every Ethos-U build goes
(torch.export -> litert-torch -> ai-edge-quantizer full int8 -> Vela, npu/vela.py), and
the profile's verdict on each TFLite operator (npu/tflite_check.py) must be Vela's own
placement. Needs the ethos-u toolchain (`bash scripts/npu_toolchain.sh ethos-u`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from portable_pe.npu.agreement import agreement
from portable_pe.npu.profiles import load_profile
from portable_pe.npu.tflite_check import check_tflite
from portable_pe.npu.toolchain import missing_message, toolchain_python

pytestmark = pytest.mark.integration  # run by scripts/test.sh after the default run (pyproject.toml)

needs_toolchain = pytest.mark.skipif(toolchain_python("ethos-u") is None, reason=missing_message("ethos-u"))
PROFILES = ("ethos-u55", "ethos-u85")
SEQ, WIDTH = 16, 32


def probe_module():
    """x (1, T, D) -> the sum of one branch per operator (each broadcast to (1, T, D)):
    the TFLite operators litert-torch makes of them are the probe."""
    import torch
    from torch import nn

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.fc = nn.Linear(WIDTH, WIDTH)
            self.norm = nn.LayerNorm(WIDTH)
            self.register_buffer("table", torch.randn(1, SEQ, WIDTH, generator=g))  # x's rank: the quantizer needs it
            self.register_buffer("rows", torch.arange(SEQ - 1, -1, -1))

        def forward(self, x, positions):
            pos = x.abs() + 1.0                                   # a positive input
            half = x[..., : WIDTH // 2]
            branches = [
                self.fc(x),                                       # FULLY_CONNECTED
                (x @ x.transpose(1, 2)) @ x / WIDTH,              # BATCH_MATMUL, TRANSPOSE
                x * self.table - self.table,                      # MUL, SUB
                x / pos,                                          # DIV by a tensor
                torch.exp(-pos), torch.log(pos), torch.tanh(x), torch.sigmoid(x),
                nn.functional.gelu(x), nn.functional.gelu(x, approximate="tanh"), torch.relu(x),
                torch.softmax(x, dim=-1), self.norm(x),
                x.mean(-1, keepdim=True), x.sum(-1, keepdim=True),
                -x, torch.maximum(x, pos - 2.0), torch.minimum(x, 2.0 - pos),
                torch.where(x > 0, x, pos - 2.0),                 # GREATER, SELECT (constants: the quantizer fails)
                torch.cat([half, half.flip(-1)], -1),             # CONCATENATION, REVERSE
                torch.cat(torch.split(x, WIDTH // 4, -1)[::-1], -1),  # SPLIT
                x.reshape(1, SEQ, 4, WIDTH // 4).transpose(1, 2).reshape(1, SEQ, WIDTH),
                x.unsqueeze(0).squeeze(0),
                x[:, self.rows],                                  # GATHER of constant rows
                torch.stack([x[..., 0::2], x[..., 1::2]], -1).flatten(-2),  # strided slices, PACK
                torch.rsqrt(pos), torch.sqrt(pos), x.pow(3),
                torch.sin(x), torch.cos(x), x.cumsum(1),  # no Ethos-U op: the CPU
            ]
            out = branches[0]
            for b in branches[1:]:
                out = out + b                                     # ADD
            return out

    return Probe().eval()


@dataclass(frozen=True)
class _Model:
    d_model: int = WIDTH


@dataclass(frozen=True)
class ProbeSpec:
    """What npu/vela.py reads of a graph spec: a name, a length limit, d_model, build()."""
    name: str = "vela_probe"
    max_length: int = SEQ
    model: _Model = _Model()

    def build(self):
        return probe_module()


@pytest.fixture(scope="module")
def probe_build(tmp_path_factory):
    from portable_pe.npu.vela import VelaJob, compile_jobs
    (entry,) = compile_jobs([VelaJob(ProbeSpec(), SEQ)], accelerators=[load_profile(p).accelerator for p in PROFILES],
                            work_dir=tmp_path_factory.mktemp("vela_probe"), workers=1, log=lambda m: None)
    assert entry.get("ok"), entry.get("error")
    return entry


@needs_toolchain
@pytest.mark.parametrize("name", PROFILES)
def test_profile_agrees_with_vela_op_by_op(probe_build, name):
    """Every probe operator: where Vela put it is what the profile says, both ways; and a
    profile that is wrong either way is caught."""
    from portable_pe.npu.vela import placement
    profile = load_profile(name)
    placed = placement(probe_build, profile.accelerator)
    verdicts = check_tflite(probe_build["tflite_operators"], profile)
    result = agreement(verdicts, placed)
    assert result["agree"], "\n".join(result["disagreements"])
    assert placed["cpu_ops"], "the probe must reach Vela's CPU fallback too"
    ops_on_npu = {v.op for v in verdicts if v.allowed}
    assert {"FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "ADD"} <= ops_on_npu
    cpu_op = next(v for v in verdicts if not v.allowed)
    npu_op = next(v for v in verdicts if v.allowed and v.op == "SOFTMAX")
    wrong = replace(profile, tflite={**profile.tflite,
                                     "ops": [o for o in profile.tflite["ops"] if o != "SOFTMAX"] + [cpu_op.op],
                                     "dtypes": [*profile.tflite["dtypes"], *cpu_op_dtypes(cpu_op, probe_build)]})
    bad = agreement(check_tflite(probe_build["tflite_operators"], wrong), placed)["disagreements"]
    assert any(f"allows {cpu_op.node} " in d for d in bad) and any(f"refuses {npu_op.node} " in d for d in bad)


def cpu_op_dtypes(verdict, entry) -> list[str]:
    """The dtypes of the operator behind a verdict (so a wrong profile can allow all of it)."""
    return next(op["dtypes"] for op in entry["tflite_operators"] if op["name"] == verdict.node)
