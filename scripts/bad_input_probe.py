#!/usr/bin/env python3
"""Try portable-pe as a careless or hostile user would, and classify what happens.

    python scripts/bad_input_probe.py [--jobs 2] [--only CATEGORY,...] [--json PATH] [--root DIR] [--keep]

Every case (scripts/bad_input_cases.py: paths, files, specs, numbers, manifests, signals,
concurrency) runs the CLI of this checkout in a subprocess, in a fresh workspace of its
own that holds files a user cares about (notes.txt, mydir/, a bundle, inputs). Each case
is classified by these rules, first match wins:

    probe error the probe itself failed to set the case up (reported, never counted as clean)
    traceback   "Traceback (most recent call last)" in the output, an "internal error"
                line, or a process that died by a signal it was not sent
    data loss   a file that existed before the command changed or vanished (outside what
                the case lets it write), or a failed command left files behind (partial
                bundles, .partial-PID folders, half-written outputs)
    wrong exit  the exit status is not the one the case expects (2 for bad input, 130 for
                Ctrl-C, ...)
    unclear     the error does not name the input (none of the case's words - the path,
                option, field or value - is in stderr), or does not say what is wrong or
                expected (none of EXPECTED_WORDS is in stderr)
    clean       otherwise

It prints the counts per class and per category and every case that is not clean.
Exit status 0 when there are no tracebacks, no data loss and no wrong exits, else 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
TINY_SPEC = ROOT / "tests" / "data" / "tiny_rope.toml"
#: a message says what is wrong or what is expected when it holds one of these
EXPECTED_WORDS = re.compile(
    r"expect|must|valid|allowed|accepts|choose from|refus|give |only |not a |is a (file|folder)|"
    r"does not exist|no such|cannot|missing|unknown|exceeds|outside|lacks|required|interrupted|"
    r"being written|not match|damaged|corrupt|empty|permission|no space left|file too large", re.IGNORECASE)
CLASSES = ("clean", "unclear", "wrong exit", "data loss", "traceback", "probe error")


@dataclass
class Case:
    category: str
    name: str
    argv: list[str]                       # after `python -m portable_pe`; {ws} {bundle} {work} expand
    words: tuple[str, ...] = ()           # the error must name one of these
    rc: tuple[int, ...] = (2,)
    setup: Callable[[Path], None] | None = None
    writes: tuple[str, ...] = ()          # paths (relative to ws) the command may create or change
    signal: tuple[str | None, int, float] | None = None  # (stdout marker, signal, delay s after it)
    twin: bool = False                    # run the same command twice at once (concurrency)
    #: an extra check (ws, result, digest before); a non-empty answer is data loss
    check: Callable[[Path, "Result", dict], str] | None = None
    #: bytes: the command's RLIMIT_FSIZE (`ulimit -f`), a disk that fills: a write beyond it
    #: fails with EFBIG, naming no file, as a full disk's ENOSPC does
    file_size_limit: int | None = None


@dataclass
class Result:
    case: Case
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    verdict: str = "clean"
    why: str = ""
    extra: list = field(default_factory=list)


def tree_digest(root: Path) -> dict[str, str]:
    """relative path -> sha256 (or 'dir' / 'link:target') of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def cli_command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "portable_pe", *argv]


def environment(ws: Path, cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "HOME": str(ws / "home"),
            "PORTABLE_PE_CACHE_DIR": str(cache)}


def run_case(case: Case, ws: Path, cache: Path, timeout: float) -> Result:
    work = ws / "work"
    argv = [a.format(ws=ws, work=work, bundle=ws / "bundle") for a in case.argv]
    env = environment(ws, cache)
    if case.setup:
        case.setup(ws)
    before = tree_digest(ws)
    start = time.perf_counter()
    if case.signal:
        rc, out, err = _signalled(argv, work, env, case.signal, timeout)
        extra = []
    elif case.twin:
        procs = [subprocess.Popen(cli_command(argv), cwd=work, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=timeout) for p in procs]
        rcs = [p.returncode for p in procs]
        extra = list(zip(rcs, outs))
        # the pair is judged as one: the worst exit status, both outputs
        rc = max(rcs, key=lambda r: (r not in case.rc, r))
        out, err = "\n".join(o for o, _ in outs), "\n".join(e for _, e in outs)
    else:
        try:
            proc = subprocess.run(cli_command(argv), cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout, preexec_fn=_file_size_limit(case.file_size_limit))
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = None, str(exc.stdout or ""), f"timed out after {timeout:g} s"
        extra = []
    result = Result(case, rc, out, err, time.perf_counter() - start, extra=extra)
    classify(result, ws, before, tree_digest(ws))
    return result


def _file_size_limit(limit: int | None):
    if limit is None:
        return None

    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _signalled(argv, cwd, env, spec, timeout):
    marker, sig, delay = spec  # marker None: `delay` seconds after the start
    proc = subprocess.Popen(cli_command(argv), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    lines = []
    deadline = time.monotonic() + timeout
    if marker is None:  # at a time, not at a line of output
        time.sleep(delay)
        proc.send_signal(sig)
    else:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                time.sleep(delay)
                proc.send_signal(sig)
                break
            if time.monotonic() > deadline:
                break
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(lines) + out, err


def classify(result: Result, ws: Path, before: dict, after: dict) -> None:
    case, text = result.case, result.stdout + result.stderr
    allowed = tuple(case.writes)

    def may_write(rel: str) -> bool:
        return any(rel == w or rel.startswith(w.rstrip("/") + "/") for w in allowed)
    lost = [rel for rel, digest in before.items() if after.get(rel) != digest and not may_write(rel)]
    # caches other libraries keep under $HOME (onnxruntime's telemetry id) are no one's data
    new = [rel for rel in after if rel not in before and not may_write(rel) and not rel.startswith("home/.cache")]
    partial = [rel for rel in after if re.search(r"\.(partial|old)-\d+", rel)]
    extra = case.check(ws, result, before) if case.check else ""
    sent = case.signal[1] if case.signal else None
    if result.rc is not None and sent is not None and result.rc == -sent:
        result.rc = 128 + sent  # killed by the signal it was sent: what a shell reports as 128 + N
    if "Traceback (most recent call last)" in text or "internal error" in result.stderr \
            or (result.rc is not None and result.rc < 0):
        result.verdict, result.why = "traceback", _last_line(result.stderr) or f"rc {result.rc}"
    elif lost or partial or extra or (new and result.rc not in (0,)):
        what = (f"changed or removed: {lost[:3]}" if lost else f"left behind: {(partial or new)[:3]}"
                if (partial or new) else extra)
        result.verdict, result.why = "data loss", what
    elif result.rc not in case.rc:
        result.verdict, result.why = "wrong exit", f"rc {result.rc}, expected {case.rc}: {_last_line(result.stderr)}"
    elif result.rc not in (0, 1) and not (_names_input(result.stderr, case.words, ws)
                                          and EXPECTED_WORDS.search(result.stderr)):
        result.verdict, result.why = "unclear", _last_line(result.stderr)
    else:
        result.verdict, result.why = "clean", _last_line(result.stderr) or _last_line(result.stdout)


def _names_input(stderr: str, words: tuple[str, ...], ws: Path) -> bool:
    return not words or any(w.format(ws=ws) in stderr for w in words)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def make_base(root: Path, cache: Path) -> Path:
    """The bundle every case gets a copy of: the tiny RoPE spec compiled for llvm."""
    base = root / "base-bundle"
    env = environment(root, cache)
    (root / "home").mkdir(exist_ok=True)
    proc = subprocess.run(cli_command(["compile", str(TINY_SPEC), "--out", str(base), "--lengths", "7"]),
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"could not compile the base bundle:\n{proc.stdout}\n{proc.stderr}")
    return base


def make_workspace(root: Path, index: int, base: Path) -> Path:
    import numpy as np
    ws = root / f"case-{index:03d}"
    (ws / "work").mkdir(parents=True)
    (ws / "home").mkdir()
    (ws / "notes.txt").write_text("my notes: do not lose me\n")
    (ws / "work" / "notes.txt").write_text("notes in the working directory\n")
    (ws / "mydir" / "sub").mkdir(parents=True)
    (ws / "mydir" / "a.txt").write_text("a\n")
    (ws / "mydir" / "sub" / "b.txt").write_text("b\n")
    shutil.copytree(base, ws / "bundle")
    np.savez(ws / "in.npz", x=np.zeros((1, 5, 64), np.float32), positions=np.arange(5))
    shutil.copy(TINY_SPEC, ws / "tiny.toml")
    return ws


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bad_input_cases import CASES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--only", help="comma-separated categories (default all)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per case (default 600)")
    ap.add_argument("--json", help="write every case's result here")
    ap.add_argument("--keep", action="store_true", help="keep the workspaces (printed)")
    ap.add_argument("--root", help="make the workspaces under this folder (default: the temp folder)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.category in args.only.split(",")]
    if args.root:
        Path(args.root).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pe-probe-", dir=args.root))
    cache = root / "export-cache"
    print(f"{len(cases)} cases; workspaces under {root}", flush=True)
    try:
        base = make_base(root, cache)
        results = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            def one(index: int, case: Case) -> Result:
                return run_case(case, make_workspace(root, index, base), cache, args.timeout)
            futures = {pool.submit(one, i, case): case for i, case in enumerate(cases)}
            for future in concurrent.futures.as_completed(futures):
                try:
                    result = future.result()
                except Exception as err:  # the probe's own failure (a setup that broke): say so, go on
                    case = futures[future]
                    result = Result(case, None, "", "", 0.0, verdict="probe error", why=f"{type(err).__name__}: {err}")
                results.append(result)
                mark = "." if result.verdict == "clean" else result.verdict.upper()
                print(f"[{len(results)}/{len(cases)}] {mark:10} {result.case.category}/{result.case.name} "
                      f"({result.seconds:.1f} s)", flush=True)
        return report(results, args.json)
    finally:
        if args.keep:
            print(f"workspaces kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def report(results: list[Result], json_path: str | None) -> int:
    counts = {c: sum(r.verdict == c for r in results) for c in CLASSES}
    print(f"\n{len(results)} bad inputs: " + ", ".join(f"{n} {c}" for c, n in counts.items()))
    categories = sorted({r.case.category for r in results})
    print("\n| category | cases | " + " | ".join(CLASSES) + " |\n|---|---:|" + "---:|" * len(CLASSES))
    for cat in categories:
        rows = [r for r in results if r.case.category == cat]
        print(f"| {cat} | {len(rows)} | " + " | ".join(str(sum(r.verdict == c for r in rows)) for c in CLASSES) + " |")
    bad = [r for r in results if r.verdict != "clean"]
    if bad:
        print("\nnot clean:")
        for r in sorted(bad, key=lambda r: (CLASSES.index(r.verdict), r.case.category, r.case.name)):
            print(f"  {r.verdict:10} {r.case.category}/{r.case.name}: `portable-pe {' '.join(r.case.argv)}` "
                  f"-> rc {r.rc}: {r.why}")
    if json_path:
        Path(json_path).write_text(json.dumps([{"category": r.case.category, "name": r.case.name,
                                                "argv": r.case.argv, "rc": r.rc, "verdict": r.verdict,
                                                "why": r.why, "stderr": r.stderr[-2000:]} for r in results],
                                               indent=2))
    return 0 if not (counts["traceback"] or counts["data loss"] or counts["wrong exit"] or counts["probe error"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
