"""NPU preparation: profiles, position folding, op rewrites, int8 quantization, checks.

The flow of `--target npu` (see backends/npu.py), one module per step:

    fold.py       fix shapes to (1, N), positions -> constant arange(N), fold every
                  position computation (sin/cos, RoPE tables, T5/ALiBi biases) to constants
    rewrite.py    ops the profile lacks -> ops it has (Gelu, LayerNorm, Split, Softmax axis);
                  rank.py drops the unit batch axis of rank-5 tensors
    quantize.py   onnxruntime quantize_static, QDQ, per-channel int8 weights
    profiles.py   targets/npu/*.toml: allowed ops, dtypes, rank, constraints; node check
    partition.py  Relax FuseOpsByPattern with a pattern table derived from the profile
"""
