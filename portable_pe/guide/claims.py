"""The article's selection guide as rows: claim, what this run measured per target, verdict.

Every number comes from the run's result (guide.json); each claim's rule for its verdict
is stated next to it (RULES), so a reader can check the verdict against the numbers.
Verdicts: "holds", "partly holds", "does not hold", "not measured" (the run lacks the data).
"""

from __future__ import annotations

import statistics

from .report import fmt_pct

HOLDS, PARTLY, FAILS, UNMEASURED = "holds", "partly holds", "does not hold", "not measured"
ABSOLUTE, RELATIVE = ("sinusoidal", "learned"), ("t5_bias", "alibi")
#: "about 35%": the claim holds when the measured overhead lies within this range
ABOUT_35 = (0.20, 0.50)
#: differences within this fraction of the baseline's latency are run-to-run noise here
NOISE = 0.05


# ----------------------------------------------------------------------------- lookups
def _latency(result: dict, graph: str, batch: int, seq: int) -> float | None:
    for row in result.get("llvm", {}).get("latency", []):
        if (row["graph"], row["batch"], row["seq"]) == (graph, batch, seq) and row["ok"]:
            return row["median_ms"]
    return None


def _npu_ms(result: dict, column: str, graph: str, seq: int) -> float | None:
    for vendor in result.get("npu", {}).values():
        for row in vendor["reports"].get(column, []):
            if (row["graph"], row["seq_len"]) == (graph, seq) and row["ok"]:
                return row["time_ms"]
    return None


def _graphs(result: dict, encoding: str) -> list[str]:
    return [g["name"] for g in result["graphs"] if g["encoding"] == encoding and g["name"] != result["baseline"]]


def _first(result: dict, encoding: str) -> str | None:
    names = _graphs(result, encoding)
    return names[0] if names else None


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b - 1


def _columns(result: dict) -> list[str]:
    return [c for vendor in result.get("npu", {}).values() if vendor.get("ran") for c in vendor["reports"]]


# ----------------------------------------------------------------------------- claims
def absolute_for_short_fixed(result: dict) -> dict:
    base, short = result["baseline"], min(result["settings"]["lengths"])
    measured, cheap, others = {}, [], []
    for batch in result["settings"]["batches"]:
        none = _latency(result, base, batch, short)
        over = {g["name"]: _ratio(_latency(result, g["name"], batch, short), none) for g in result["graphs"]
                if g["name"] != base}
        over = {k: v for k, v in over.items() if v is not None}
        if over:
            measured[f"llvm B={batch} T={short}"] = ", ".join(f"{k} {fmt_pct(v)}" for k, v in over.items()) + " vs none"
            cheap += [v for k, v in over.items() if _encoding(result, k) in ABSOLUTE]
            others += [v for k, v in over.items() if _encoding(result, k) not in ABSOLUTE]
    refusals = [f"{row['graph']} refuses T={row['seq']}" for row in result.get("llvm", {}).get("latency", [])
                if not row["ok"] and row["batch"] == result["settings"]["batches"][0]]
    if refusals:
        measured["llvm lengths"] = "; ".join(refusals)
    if not cheap or not others:
        return _row("absolute", measured, UNMEASURED)
    cheapest = max(cheap) <= min(others) + NOISE
    verdict = HOLDS if cheapest and refusals else PARTLY if cheapest or refusals else FAILS
    return _row("absolute", measured, verdict)


def _encoding(result: dict, graph: str) -> str:
    return next(g["encoding"] for g in result["graphs"] if g["name"] == graph)


def relative_bias_overhead(result: dict) -> dict:
    t5, sin = _first(result, "t5_bias"), _first(result, "sinusoidal")
    measured, values = {}, []
    if t5 and sin:
        for batch in result["settings"]["batches"]:
            v = _ratio(_latency(result, t5, batch, 512), _latency(result, sin, batch, 512))
            if v is not None:
                measured[f"llvm B={batch} T=512"] = f"t5_bias {fmt_pct(v)} vs sinusoidal"
                values.append(v)
        for column in _columns(result):
            v = _ratio(_npu_ms(result, column, t5, 512), _npu_ms(result, column, sin, 512))
            if v is not None:
                measured[f"{column} T=512"] = f"t5_bias {fmt_pct(v)} vs sinusoidal (Vela estimate)"
                values.append(v)
    if not values:
        return _row("relative_bias", measured, UNMEASURED)
    inside = [ABOUT_35[0] <= v <= ABOUT_35[1] for v in values]
    verdict = HOLDS if all(inside) else PARTLY if any(inside) or max(values) > ABOUT_35[1] else FAILS
    return _row("relative_bias", measured, verdict)


def rope_long_variable(result: dict) -> dict:
    rope = _first(result, "rope")
    if rope is None or "llvm" not in result:
        return _row("rope_long", {}, UNMEASURED)
    lengths = result["settings"]["lengths"]
    refused = [r["seq"] for r in result["llvm"]["latency"] if r["graph"] == rope and not r["ok"]]
    length_row = next((r for r in result.get("lengths", []) if r["graph"] == rope), None)
    parity = all(c["ok"] for c in length_row["checks"]) if length_row else None
    long = max(lengths)
    over = {b: _ratio(_latency(result, rope, b, long), _latency(result, result["baseline"], b, long))
            for b in result["settings"]["batches"]}
    measured = {"llvm": f"runs at T={', '.join(map(str, lengths))}"
                        f"{' except ' + ', '.join(map(str, refused)) if refused else ''} from one dynamic build; "
                        f"outputs at {', '.join(str(c['seq']) for c in length_row['checks']) if length_row else '?'} "
                        f"(beyond the export example) {'match' if parity else 'do not match'} PyTorch; "
                        + ", ".join(f"B={b} T={long} {fmt_pct(v)} vs none" for b, v in over.items())}
    for column in _columns(result):
        built = sorted(r["seq_len"] for vendor in result["npu"].values() for r in vendor["reports"].get(column, [])
                       if r["graph"] == rope and r["ok"])
        v = _ratio(_npu_ms(result, column, rope, long), _npu_ms(result, column, result["baseline"], long))
        measured[column] = (f"static: one build per length, built at T={', '.join(map(str, built)) or 'none'}"
                            + (f"; T={long} {fmt_pct(v)} vs none (vendor's estimate)" if v is not None else
                               " (no time estimate from this vendor)"))
    verdict = HOLDS if not refused and parity else PARTLY if parity or not refused else FAILS
    return _row("rope_long", measured, verdict)


def rope_low_resource(result: dict) -> dict:
    rope, sin, base = _first(result, "rope"), _first(result, "sinusoidal"), result["baseline"]
    short = min(result["settings"]["lengths"])
    measured, heavier = {}, []
    smallest = [c for c in ("ethos-u55", "ethos-u65", "ethos-u85") if c in _columns(result)]
    for column in smallest[:1]:
        none = _npu_ms(result, column, base, short)
        r, s = _ratio(_npu_ms(result, column, rope, short), none), _ratio(_npu_ms(result, column, sin, short), none)
        cpu = next((row["ops_cpu"] for vendor in result["npu"].values() for row in vendor["reports"].get(column, [])
                    if row["graph"] == rope and row["seq_len"] == short), None)
        if r is not None and s is not None:
            measured[f"{column} T={short}"] = (f"rope {fmt_pct(r)}, sinusoidal {fmt_pct(s)} vs none (Vela estimate); "
                                               f"{cpu} rope operator(s) left to the CPU")
            heavier.append(r > s + NOISE and r > NOISE)
    if "llvm" in result and rope:
        for row in result["llvm"].get("profile", []):
            if row["graph"] == rope and row["seq"] == short:
                measured["llvm profile"] = f"RoPE kernels {fmt_pct(row['position_share'])} of the run at T={short}"
    if not heavier:
        return _row("rope_low_resource", measured, UNMEASURED)
    return _row("rope_low_resource", measured, HOLDS if all(heavier) else FAILS)


def hybrid_between(result: dict) -> dict:
    hyb, rope, t5 = _first(result, "hybrid"), _first(result, "rope"), _first(result, "t5_bias")
    if not (hyb and rope and t5):
        return _row("hybrid", {}, UNMEASURED)
    measured, between = {}, []
    for batch in result["settings"]["batches"]:
        for seq in result["settings"]["lengths"]:
            h, r, t = (_latency(result, g, batch, seq) for g in (hyb, rope, t5))
            if None in (h, r, t):
                continue
            slack = NOISE * min(r, t)
            between.append(min(r, t) - slack <= h <= max(r, t) + slack)
            if seq in (512, max(result["settings"]["lengths"])):
                measured[f"llvm B={batch} T={seq}"] = f"hybrid {h:.3g} ms, rope {r:.3g}, t5_bias {t:.3g}"
    for column in _columns(result)[:1]:
        seq = 512
        h, r, t = (_npu_ms(result, column, g, seq) for g in (hyb, rope, t5))
        if None not in (h, r, t):
            measured[f"{column} T={seq}"] = f"hybrid {h:.3g} ms, rope {r:.3g}, t5_bias {t:.3g} (Vela estimate)"
            between.append(min(r, t) * (1 - NOISE) <= h <= max(r, t) * (1 + NOISE))
    if not between:
        return _row("hybrid", measured, UNMEASURED)
    share = sum(between) / len(between)
    return _row("hybrid", measured, HOLDS if share == 1 else PARTLY if share >= 0.5 else FAILS)


def int8_tables(result: dict) -> dict:
    tables = result.get("tables", {})
    rows = tables.get("materialized", [])
    measured = {}
    if rows:
        long = max(r["seq"] for r in rows)
        big = [r for r in rows if r["seq"] == long]
        measured[f"tables at T={long}"] = ", ".join(
            f"{r['graph']} {r['table']} {r['bytes_fp32'] / 2**20:.3g} -> {r['bytes_int8'] / 2**20:.3g} MiB"
            for r in sorted(big, key=lambda r: -r["bytes_fp32"])[:4])
    builds = tables.get("builds", [])
    ok = []
    for b in builds:
        cells = b["cells"]
        if cells:
            slower = statistics.median(c["int8_ms"] / c["fp32_ms"] - 1 for c in cells)
            measured[f"llvm {b['graph']}"] = (f"model.onnx {b['model_onnx_bytes']['fp32'] / 2**20:.3g} -> "
                                              f"{b['model_onnx_bytes']['int8'] / 2**20:.3g} MiB; max abs error "
                                              f"{max(c['int8_max_abs'] for c in cells):.2g} (fp32 "
                                              f"{max(c['fp32_max_abs'] for c in cells):.2g}); latency {fmt_pct(slower)}")
            ok.append(all(c["int8_ok"] for c in cells))
    if not rows:
        return _row("int8_tables", measured, UNMEASURED)
    long = [r for r in rows if r["seq"] == max(r["seq"] for r in rows)]
    saved = 1 - sum(r["bytes_int8"] for r in long) / sum(r["bytes_fp32"] for r in long)
    measured[f"tables at T={max(r['seq'] for r in rows)}"] += f" (all tables: {saved:.0%} saved)"
    verdict = HOLDS if saved >= 0.7 and all(ok) else PARTLY if saved >= 0.7 else FAILS
    return _row("int8_tables", measured, verdict)


def npu_friendly(result: dict) -> dict:
    columns = _columns(result)
    if not columns:
        return _row("npu_graphs", {}, UNMEASURED)
    short, measured, full = min(result["settings"]["lengths"]), {}, []
    for column in columns:
        rows = [r for vendor in result["npu"].values() for r in vendor["reports"].get(column, [])
                if r["seq_len"] == short]
        built = [r for r in rows if r["ok"]]
        on_cpu = [f"{r['graph']} ({r['ops_cpu']})" for r in built if r["ops_cpu"]]
        measured[f"{column} T={short}"] = (f"{len(built)}/{len(rows)} encoders built; "
                                           + (f"CPU operators: {', '.join(on_cpu)}" if on_cpu else
                                              "every operator on the NPU"))
        full.append(len(built) == len(rows) and not on_cpu)
    return _row("npu_graphs", measured, HOLDS if all(full) else PARTLY if any(full) else FAILS)


CLAIMS = {
    "absolute": ("Absolute encodings (sinusoidal, learned) for short, fixed-length inputs",
                 absolute_for_short_fixed,
                 f"holds when, at the shortest length, the absolute encodings cost no more than any other "
                 f"(within {NOISE:.0%} of the baseline) and a learned table refuses longer inputs"),
    "relative_bias": ("Relative bias (T5) is not for latency-critical deployment: compute overhead about 35% "
                      "above absolute at length 512", relative_bias_overhead,
                      f"holds when t5_bias / sinusoidal - 1 lies in {ABOUT_35[0]:.0%}..{ABOUT_35[1]:.0%} on every "
                      "target; partly when on some, or when it is larger"),
    "rope_long": ("RoPE for long and variable-length inputs", rope_long_variable,
                  "holds when one dynamic build runs every length and matches PyTorch beyond the export example"),
    "rope_low_resource": ("RoPE is not for very low-resource devices", rope_low_resource,
                          f"holds when, on the smallest NPU measured, RoPE costs more than {NOISE:.0%} over both "
                          "the no-position and the sinusoidal encoder"),
    "hybrid": ("Hybrids: RoPE in the lower layers, relative bias in the upper ones", hybrid_between,
               "holds when the hybrid's cost lies between RoPE's and T5's in every measured cell"),
    "int8_tables": ("8-bit position tables to save memory", int8_tables,
                    "holds when int8 rows save at least 70% of all tables' bytes at the longest length and the "
                    "int8-table builds pass parity"),
    "npu_graphs": ("Hardware-friendly (TPU/NPU) position graphs are the direction to go", npu_friendly,
                   "holds when every encoder, positions folded to constants, builds with every operator on "
                   "each NPU measured"),
}


def _row(key: str, measured: dict, verdict: str) -> dict:
    claim, _, rule = CLAIMS[key]
    return {"key": key, "claim": claim, "measured": measured, "verdict": verdict, "rule": rule}


def evaluate(result: dict) -> list[dict]:
    return [check(result) for _, check, _ in CLAIMS.values()]
