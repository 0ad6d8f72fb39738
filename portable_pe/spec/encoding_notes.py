"""What each position encoding is good for, as `portable-pe list` shows it.

Kept apart from encodings.py so that listing them does not import torch (a test keeps
the keys equal to encodings.ENCODINGS)."""

#: what each encoding is good for, shown by `portable-pe list`
ENCODING_NOTES = {
    "sinusoidal": "absolute, fixed; short inputs of known length, no parameters",
    "learned": "absolute, learned table; fixed short inputs, hard max length",
    "t5_bias": "relative bias on logits; exact pairwise distances (bucketed)",
    "rope": "rotary q/k; long and variable-length inputs, relative by construction",
    "alibi": "linear distance penalty; extrapolates to lengths longer than training",
    "hybrid": "per-layer mix, e.g. RoPE low, relative bias high",
    "none": "no position information: the baseline `portable-pe guide` measures the others against",
    "rope_2d": "image patches: axial 2D RoPE, half the pairs by row, half by column (DINOv3, Pixtral)",
    "rope_mixed": "image patches: RoPE with learned per-head frequencies mixing both axes (RoPE-Mixed)",
    "mrope": "video patches: rotary sections per axis, frame/row/column (Qwen2-VL's M-RoPE)",
    "sincos_2d": "image patches: 2D sin/cos, half the channels per axis (MAE); absolute",
    "learned_2d": "image patches: learned table of a base grid, bicubic-resized to the image's (ViT, DINOv2)",
    "rel_bias_2d": "image patches: learned bias per 2D offset on the logits (BEiT, Swin)",
    "window_rel_bias_2d": "image patches: attention in (shifted) windows, a learned bias per 2D offset in a window (Swin)",
}
