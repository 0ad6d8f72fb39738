"""How far int8 attention moves a shipped graph's output, in PyTorch: 1 - cosine and max abs
against float32 attention, for the rounding int8_attention.py does (Q·Kᵀ: queries 8 bits,
keys 7 bits, per row) and for P·V in int8 too (P to 8 bits, V to 7 bits per channel),
which the CPU build does not do (the README says why).

    python scripts/int8_attention_error.py [GRAPH ...] [--cells 8x512,1x128]

Only attention is rounded (the matmuls with weights stay float32), so the figures are what
this rounding adds to an int8 build's own error (1 - cosine ~4e-5 from its weights).
"""

from __future__ import annotations

import argparse

import torch

from portable_pe.spec import model as encoder_model
from portable_pe.spec.graphs import load_graph

SEQUENCE_GRAPHS = ("learned", "sinusoidal", "rope", "rope_interleaved", "alibi", "t5_bias", "hybrid")


def rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded per row (last dim) to symmetric `bits`-bit steps of max|row| / (2^(bits-1) - 1)."""
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / top
    return torch.round(x / scale).clamp(-top, top) * scale


def attention_forward(pv_in_int8: bool):
    """Attention.forward with Q·Kᵀ from rounded operands (and P·V too, `pv_in_int8`)."""
    def forward(self, x, positions, pe, prefix: int = 0):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        q, k = encoder_model._rotate(pe, q, k, positions, prefix)
        logits = (rounded(q, 8) @ rounded(k, 7).transpose(-2, -1)) * self.scale
        bias = pe.bias(positions)
        if bias is not None:
            logits = logits + encoder_model._pad_prefix(bias, prefix)
        p = torch.exp(logits - logits.amax(-1, keepdim=True))
        if pv_in_int8:  # p in [0, 1]: 8 bits of 1/255; V per channel (over the keys)
            p, v = torch.round(p * 255) / 255, rounded(v.transpose(-1, -2), 7).transpose(-1, -2)
        y = (p @ v) / p.sum(-1, keepdim=True)
        return self.proj(y.transpose(-3, -2).flatten(-2))
    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="*", default=list(SEQUENCE_GRAPHS))
    parser.add_argument("--cells", default="8x512,1x128", help="BxT, comma-separated")
    args = parser.parse_args()
    float_forward = encoder_model.Attention.forward
    print("| graph | B | T | Q·Kᵀ int8: 1 - cosine | max abs | and P·V int8: 1 - cosine | max abs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.graphs:
        spec = load_graph(name)
        model = spec.build()
        for cell in args.cells.split(","):
            batch, length = map(int, cell.split("x"))
            torch.manual_seed(0)
            x, positions = torch.randn(batch, length, spec.model.d_model), torch.arange(length)
            row = []
            with torch.no_grad():
                encoder_model.Attention.forward = float_forward
                want = model(x, positions).double().flatten()
                for pv_in_int8 in (False, True):
                    encoder_model.Attention.forward = attention_forward(pv_in_int8)
                    got = model(x, positions).double().flatten()
                    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
                    row += [f"{1 - cosine:.1e}", f"{(got - want).abs().max().item():.1e}"]
                encoder_model.Attention.forward = float_forward
            print(f"| {name} | {batch} | {length} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
