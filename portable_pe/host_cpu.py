"""What this machine's CPU reports it can do (Linux /proc/cpuinfo), in LLVM's words.

LLVM names the host CPU by its family and model number; a virtual machine often shows
the model number of an older part (an AMX-capable Xeon here reads as "rocketlake", whose
LLVM model has neither AVX512-BF16 nor AMX), while the flags the kernel reports are the
CPU's own. The compile adds what the flags show (backends/llvm.py), and a bundle built
for instructions this CPU lacks is refused before it runs (run/local.py).
"""

from __future__ import annotations

from pathlib import Path

#: /proc/cpuinfo flags -> the LLVM features they are (the bf16 kernels', cpu_schedule/bf16_isa.py,
#: and AMX-INT8's, int8_isa.py)
LLVM_FEATURE_OF_FLAG = {"avx512_bf16": "avx512bf16", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16",
                        "amx_int8": "amx-int8"}


def _cpuinfo_field(key: str) -> str | None:
    """The value of `key` for the first CPU in /proc/cpuinfo (None where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key)), None)


def cpu_flags() -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    return set((_cpuinfo_field("flags") or "").split())


#: the flags that decide which kernels a build takes: the float32 dense (AVX-512 or AVX2), int8
#: (AMX, VNNI or neither: int8_isa.py) and bf16 (AMX or AVX512-BF16: bf16_isa.py)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx_vnni", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_summary() -> str:
    """The CPU as a result table should name it, e.g. "Intel(R) Xeon(R) Processor, 2 logical
    cores; avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8": the model name the
    kernel reports (a VM often masks it, so the flags that choose the kernels follow)."""
    import os
    import platform
    name = _cpuinfo_field("model name") or platform.processor() or platform.machine()
    flags = cpu_flags()
    named = " ".join(f for f in KERNEL_FLAGS if f in flags) or "none of " + " ".join(KERNEL_FLAGS)
    return f"{name}, {os.cpu_count()} logical cores; {named}"


def llvm_features_here() -> set[str]:
    """The LLVM features of LLVM_FEATURE_OF_FLAG this CPU has."""
    flags = cpu_flags()
    return {feature for flag, feature in LLVM_FEATURE_OF_FLAG.items() if flag in flags}


def amx_permitted() -> bool:
    """Whether Linux gives this process AMX's tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
    which the AMX kernel asks for on its first call): a kernel that refuses it would make
    every tile instruction fault."""
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0
    except (OSError, AttributeError):
        return False
