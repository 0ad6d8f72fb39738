"""RKNN-Toolkit2 worker: runs inside the toolchain's virtualenv (scripts/toolchains/rknn.sh),
never in portable-pe's process, and imports nothing of portable-pe (toolchain.py's contract).

    python rknn_worker.py request.json        (cwd = the work folder)

request.json (paths relative to the work folder):
    {"model": "model.onnx", "soc": "rk3588", "dtype": "int8" | "fp16",
     "dataset": "dataset.txt",             # int8: one .npy path per line, RKNN's format
     "config": {...},                      # extra RKNN.config() keywords (optional)
     "rknn": "model.rknn",                 # exported model (optional: build only)
     "simulate": [["x.npy", ...], ...],    # input sets for the x86 simulator (optional)
     "data_format": ["nchw", ...]}          # per input, for 4-D inputs (optional; RKNN's default is nhwc)

Before each step it writes progress.json ({"stage": ...}), so a crash (RKNN segfaults on
some graphs) still tells which step died. A step the vendor refuses ends with exit 1 and
its own words in the log. On success result.json holds versions, timings, the simulator's
outputs (sim_<i>.npz, output_<k> keys in output order). The verbose build log, whose
layer table says where each op runs, is the worker's stdout (worker.log).
"""

import json
import sys
import time
from importlib import metadata


def _stage(name):
    with open("progress.json", "w") as f:
        json.dump({"stage": name}, f)
    print(f"[rknn_worker] stage: {name}", flush=True)


def _check(ret, what):
    if ret != 0:
        print(f"[rknn_worker] {what} returned {ret}", flush=True)
        sys.exit(1)


def main(request_path):
    with open(request_path) as f:
        req = json.load(f)
    timings = {}
    t = time.perf_counter()
    _stage("import")
    import numpy as np
    from rknn.api import RKNN
    timings["import_s"] = time.perf_counter() - t

    rknn = RKNN(verbose=True)
    _stage("config")
    _check(rknn.config(target_platform=req["soc"], **req.get("config", {})), "config")
    _stage("load")
    t = time.perf_counter()
    _check(rknn.load_onnx(model=req["model"]), "load_onnx")
    timings["load_s"] = time.perf_counter() - t
    _stage("build")
    t = time.perf_counter()
    quantize = req["dtype"] == "int8"
    _check(rknn.build(do_quantization=quantize, dataset=req.get("dataset") if quantize else None), "build")
    timings["build_s"] = time.perf_counter() - t
    if req.get("rknn"):
        _stage("export")
        _check(rknn.export_rknn(req["rknn"]), "export_rknn")
    simulated = []
    if req.get("simulate"):
        _stage("simulator")
        t = time.perf_counter()
        _check(rknn.init_runtime(), "init_runtime (simulator)")
        for i, paths in enumerate(req["simulate"]):
            extra = {"data_format": req["data_format"]} if req.get("data_format") else {}
            outputs = rknn.inference(inputs=[np.load(p) for p in paths], **extra)
            if outputs is None:
                print("[rknn_worker] inference (simulator) returned no outputs", flush=True)
                sys.exit(1)
            name = f"sim_{i}.npz"
            np.savez(name, **{f"output_{k}": np.asarray(o) for k, o in enumerate(outputs)})
            simulated.append(name)
        timings["simulate_s"] = time.perf_counter() - t
    rknn.release()
    _stage("done")
    with open("result.json", "w") as f:
        json.dump({"toolkit": "rknn-toolkit2", "version": metadata.version("rknn-toolkit2"),
                   "soc": req["soc"], "dtype": req["dtype"], "rknn": req.get("rknn"),
                   "simulated": simulated, "timings": timings}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
