"""portable-pe: Transformer encoders with swappable position encodings, compiled by TVM."""

__version__ = "0.1.0"
