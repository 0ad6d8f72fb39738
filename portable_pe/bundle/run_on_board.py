"""run_on_board.py: a bundle checks itself on the board, without RPC and without portable-pe.

    python3 run_on_board.py [BUNDLE_DIR] [--json PATH]     (BUNDLE_DIR: default this file's folder)

Needs only the standard library, numpy and the TVM runtime (TVM_USE_RUNTIME_LIB=1 is
enough). Verifies the bundle's checksums, loads model.so, runs every case stored in
reference.npz (the manifest's reference.cases say which array is which) and compares with
the same rule and the tolerances the manifest records as portable-pe's parity harness. Exit 0 when every
output passes, 1 on a mismatch, 2 when the bundle cannot be run here.
"""

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

import numpy as np


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_manifest(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not {"model.so", "model.onnx", "reference.npz"} <= set(files):
        raise SystemExit(f"run_on_board: {bundle / 'manifest.json'} has no complete checksum list (`files`): "
                         "the bundle cannot be verified; recompile or re-copy it")
    for name, expected in files.items():
        if sha256(bundle / name) != expected:
            raise SystemExit(f"run_on_board: {bundle / name} does not match its checksum in manifest.json")
    return manifest


def reference_cases(npz, index):
    """{length or size label: (inputs, outputs)}: the manifest's reference.cases records, read
    from reference.npz."""
    return {case.get("length") or "x".join(map(str, case["sizes"].values())):
            ({n: npz[k] for n, k in case["inputs"].items()}, {n: npz[k] for n, k in case["outputs"].items()})
            for case in index}


def compare(ref, got, tol):
    """(max_abs, max_rel, cosine, ok, why): the rule of portable_pe.parity.compare."""
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return np.inf, np.inf, 0.0, False, f"got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    max_abs = float(np.max(np.abs(r - g))) if r.size else 0.0
    denom = float(np.linalg.norm(r) * np.linalg.norm(g))
    cosine = float(r @ g / denom) if denom else float(max_abs == 0.0)
    ok = bool(np.all(np.isfinite(g)) and max_abs <= tol["atol"] + tol["rtol"] * scale and cosine >= tol["min_cosine"])
    why = "" if ok else f"atol {tol['atol']:g} + rtol {tol['rtol']:g}*{scale:.3g}, min cosine {tol['min_cosine']}"
    return max_abs, (max_abs / scale if scale else max_abs), cosine, ok, why


#: aarch64 features a bundle may be compiled to use (LLVM's names, which the manifest's
#: target.cpu_features records) -> (auxv entry, bit): Linux's HWCAP/HWCAP2 bits
#: (arch/arm64/include/uapi/asm/hwcap.h). A core without one of them stops the process
#: with SIGILL at the first such instruction, so the bundle is refused before it loads.
AT_HWCAP, AT_HWCAP2 = 16, 26
HWCAP_OF_FEATURE = {
    "fullfp16": (AT_HWCAP, 1 << 10),   # ASIMDHP: half-precision SIMD arithmetic
    "dotprod": (AT_HWCAP, 1 << 20),    # ASIMDDP: sdot/udot
    "sve": (AT_HWCAP, 1 << 22),
    "sve2": (AT_HWCAP2, 1 << 1),
    "i8mm": (AT_HWCAP2, 1 << 13),      # smmla
    "bf16": (AT_HWCAP2, 1 << 14),      # bfdot/bfmmla
}


def missing_cpu_features(needed, auxv):
    """The features of ``needed`` that the process whose /proc/self/auxv is ``auxv``
    (bytes: pairs of native 64-bit words, type then value) lacks; [] when auxv has no
    HWCAP entry (nothing to judge by)."""
    import struct
    words = dict(struct.iter_unpack("<QQ", auxv[: len(auxv) // 16 * 16]))
    if AT_HWCAP not in words:
        return []
    return [f for f in needed if f in HWCAP_OF_FEATURE
            and not words.get(HWCAP_OF_FEATURE[f][0], 0) & HWCAP_OF_FEATURE[f][1]]


def load_device_runtime(kind):
    """The TVM runtime's loader for `kind`'s kernels. A runtime-only TVM
    (TVM_USE_RUNTIME_LIB=1) registers none for CUDA: its full import loads the sidecar
    libtvm_runtime_cuda.so, so load it here from beside libtvm_runtime.so, else model.so
    fails with "a loader of that name is not registered"."""
    import ctypes
    import tvm_ffi
    from tvm.base import _LOADED_LIBS
    if kind != "cuda" or tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True):
        return
    sidecar = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
    try:
        ctypes.CDLL(str(sidecar), mode=ctypes.RTLD_LOCAL)
    except OSError as err:
        raise SystemExit(f"run_on_board: this TVM cannot load CUDA kernels ({sidecar}: {err}); install a TVM "
                         "built with CUDA (the apache-tvm wheel) and the NVIDIA driver") from None


def load_vm(bundle, manifest):
    import tvm
    from tvm.runtime.vm import VirtualMachine  # works with the runtime-only TVM
    host = manifest["target"].get("host_arch")
    if host and host != platform.machine():
        raise SystemExit(f"run_on_board: {bundle} was built for {host} ({manifest['target']['name']} target); "
                         f"this machine is {platform.machine()}")
    needed = manifest["target"].get("cpu_features", [])
    if needed and platform.machine() == "aarch64":
        missing = missing_cpu_features(needed, Path("/proc/self/auxv").read_bytes())
        if missing:
            raise SystemExit(f"run_on_board: {bundle} was compiled for a CPU with {', '.join(needed)} "
                             f"(board {manifest['target'].get('options', {}).get('board', '?')!r}); this CPU has no "
                             f"{', '.join(missing)} (/proc/self/auxv), so it would stop at the first such "
                             "instruction (SIGILL): compile with the --board this machine is")
    if (manifest.get("cuda") or {}).get("kernel_code") == "source":
        raise SystemExit(f"run_on_board: {bundle} holds its CUDA kernels as source only: it was compiled where TVM "
                         "had no CUDA runtime (no NVIDIA driver). Compile it again on a machine with the driver")
    load_device_runtime(manifest["target"]["device"])
    device = tvm.runtime.device(manifest["target"]["device"], 0)
    if not device.exist:
        raise SystemExit(f"run_on_board: the bundle needs a {manifest['target']['device']} device; none here")
    vm = VirtualMachine(tvm.runtime.load_module(str(bundle / "model.so")), device)
    return vm, device


def run(vm, device, manifest, inputs):
    import tvm
    args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[i["name"]]), device=device) for i in manifest["inputs"]]
    result = vm["main"](*args)
    values = [result] if hasattr(result, "numpy") else list(result)
    return {o["name"]: v.numpy() for o, v in zip(manifest["outputs"], values)}


def main(argv=None):
    ap = argparse.ArgumentParser(description="check this bundle on this machine against its reference.npz")
    ap.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = load_manifest(bundle)
    vm, device = load_vm(bundle, manifest)
    rows = []
    with np.load(bundle / "reference.npz") as npz:
        cases = reference_cases(npz, manifest["reference"]["cases"])
    for length, (inputs, expected) in cases.items():
        got = run(vm, device, manifest, inputs)
        for name, ref in expected.items():
            out = got.get(name)
            stats = compare(ref, out, manifest["tolerance"][str(ref.dtype)]) if out is not None else \
                (np.inf, np.inf, 0.0, False, "missing output")
            rows.append({"length": length, "output": name, "shape": list(ref.shape),
                         **dict(zip(("max_abs", "max_rel", "cosine", "ok", "why"), stats))})
    ok = bool(rows) and all(r["ok"] for r in rows)
    print(f"### parity on board ({platform.machine()}): {manifest['graph']['name']} on "
          f"{manifest['target']['name']} (reference: reference.npz, {manifest['reference']['source']})\n")
    print("| candidate | T | output | shape | max abs | max rel | cosine | result |\n|---|---:|---|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| tvm@board | {r['length']} | {r['output']} | {'x'.join(map(str, r['shape']))} | {r['max_abs']:.2e} | "
              f"{r['max_rel']:.2e} | {r['cosine']:.6f} | {'ok' if r['ok'] else 'FAIL (' + r['why'] + ')'} |")
    print(f"\n**{'PASS' if ok else 'FAIL'}**")
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "rows": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # our clear errors: print them, exit 2
            print(exit_.code, file=sys.stderr)
            sys.exit(2)
        raise
