"""Two Hugging Face encoders as foreign ONNX for the npu flow: BERT (learned absolute
positions) and RoFormer (rotary positions computed in the graph from the length).

    python scripts/hf_encoders.py OUT_DIR [--size tiny|small]

Built from local configs (no download) with seeded random weights and exported by
torch.onnx (TorchScript exporter, opset 17) with `inputs_embeds` as the input: the token
embedding lookup stays on the host, as NPU deployments of encoders do; what the NPU gets
is the encoder, its position encoding included. Prints the compile command for each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SIZES = {"tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
         "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)}


def _model(kind: str, size: str):
    import torch
    from transformers import BertConfig, BertModel, RoFormerConfig, RoFormerModel
    torch.manual_seed(0)
    common = dict(vocab_size=128, max_position_embeddings=1024, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, attn_implementation="eager", **SIZES[size])
    if kind == "bert":
        return BertModel(BertConfig(**common), add_pooling_layer=False).eval()
    return RoFormerModel(RoFormerConfig(embedding_size=common["hidden_size"], **common)).eval()


def export_encoders(out: Path, *, size: str = "small", seq_len: int = 128) -> dict[str, tuple[Path, dict]]:
    """{name: (onnx path, --shape dict)} for hf_bert and hf_roformer."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, inputs_embeds):
            return self.model(inputs_embeds=inputs_embeds).last_hidden_state

    out.mkdir(parents=True, exist_ok=True)
    made = {}
    for kind in ("bert", "roformer"):
        model = _model(kind, size)
        hidden = model.config.hidden_size
        path = out / f"hf_{kind}_{size}.onnx"
        x = torch.randn(1, 16, hidden)
        torch.onnx.export(Encoder(model), (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["inputs_embeds"], output_names=["hidden"],
                          dynamic_axes={"inputs_embeds": {1: "seq"}, "hidden": {1: "seq"}})
        made[f"hf_{kind}"] = (path, {"inputs_embeds": [1, seq_len, hidden]})
    return made


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--size", choices=SIZES, default="small")
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    for name, (path, shapes) in export_encoders(args.out, size=args.size, seq_len=args.seq_len).items():
        shape = "x".join(map(str, shapes["inputs_embeds"]))
        print(f"{name}: {path}\n  portable-pe compile {path} --target npu --profile rknpu2 "
              f"--seq-len {args.seq_len} --shape inputs_embeds={shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
