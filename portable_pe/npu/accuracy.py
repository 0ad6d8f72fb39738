"""How close an NPU build's output is to the float32 reference: the numbers every NPU
report shows (cosine, max abs error, and the reference's largest magnitude beside it)."""

from __future__ import annotations

import numpy as np


def accuracy(reference: np.ndarray, got: np.ndarray) -> dict:
    r, g = reference.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    return {"cosine": float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g))),
            "max_abs": float(np.max(np.abs(r - g))), "max_ref": float(np.max(np.abs(r)))}
