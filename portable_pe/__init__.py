"""portable-pe: Transformer encoders with swappable position encodings, compiled by TVM."""

__version__ = "0.1.0"

from .threads import default_tvm_threads as _default_tvm_threads

_default_tvm_threads()  # before any kernel starts TVM's pool (see threads.default_tvm_threads)
