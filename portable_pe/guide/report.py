"""guide.json -> guide.md and the PNG plots. Rendering reads the result only: every number
in the report is one of guide.json's, formatted by fmt_ms / fmt_pct."""

from __future__ import annotations

from pathlib import Path


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.0f}%"


def fmt_mib(n_bytes: float | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 2**20:.3g}"


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "|" + "---|" + "---:|" * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", align, *("| " + " | ".join(r) + " |" for r in rows), ""]


def _cell(rows: list[dict], **key) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


# ----------------------------------------------------------------------------- sections
def claims_table(claims: list[dict]) -> list[str]:
    """The claims' rows: what each says, what this run measured, its verdict."""
    rows = [[c["claim"], "<br>".join(f"{k}: {v}" for k, v in c["measured"].items()) or "n/a", f"**{c['verdict']}**"]
            for c in claims]
    return _table(["claim", "measured in this run", "verdict"], rows, "|---|---|---|")


def claims_section(result: dict) -> list[str]:
    lines = ["## The article's claims, measured", ""] + claims_table(result["claims"])
    lines += ["Verdict rules:", ""] + [f"- {c['claim']}: {c['rule']}." for c in result["claims"]] + [""]
    return lines


def llvm_latency_section(result: dict, plots: dict) -> list[str]:
    llvm, s = result["llvm"], result["settings"]
    base, ref = result["baseline"], result.get("reference_graph")
    lines = ["## llvm (this CPU): latency", "",
             f"Median ms per run, {s['threads']} threads, encoders timed round-robin run by run on the same "
             f"input; in brackets: latency / the no-position encoder's - 1"
             f"{', and / ' + ref + ' - 1' if ref else ''}. Default schedules for every build (no tuning database).",
             ""]
    for batch in s["batches"]:
        rows = []
        for g in result["graphs"]:
            cells = []
            for seq in s["lengths"]:
                row = _cell(llvm["latency"], graph=g["name"], batch=batch, seq=seq)
                if row is None or not row["ok"]:
                    cells.append("refused" if row else "")
                    continue
                none = _cell(llvm["latency"], graph=base, batch=batch, seq=seq)
                sin = _cell(llvm["latency"], graph=ref, batch=batch, seq=seq) if ref else None
                rel = [fmt_pct(row["median_ms"] / none["median_ms"] - 1) if none and none["ok"] and g["name"] != base else ""]
                if sin and sin["ok"] and g["name"] not in (base, ref):
                    rel.append(fmt_pct(row["median_ms"] / sin["median_ms"] - 1))
                rel = [r for r in rel if r]
                cells.append(fmt_ms(row["median_ms"]) + (f" ({', '.join(rel)})" if rel else ""))
            rows.append([g["name"], *cells])
        lines += [f"B={batch}:", ""] + _table(["encoder", *(f"T={n}" for n in s["lengths"])], rows)
    refused = [r for r in llvm["latency"] if not r["ok"]]
    if refused:
        lines += ["Refused cells, in the runtime's words:", ""]
        lines += sorted({f"- {r['graph']} at T={r['seq']}: {r['error']}" for r in refused}) + [""]
    if plots.get("llvm"):
        lines += [f"![llvm latency relative to the no-position encoder]({plots['llvm']})", ""]
    return lines


def llvm_position_section(result: dict) -> list[str]:
    llvm, s = result["llvm"], result["settings"]
    if not llvm.get("profile"):
        return []
    lines = ["## llvm: the position work alone", "",
             f"From a per-kernel profile at B={s['profile_batch']} (median of {s['profile_runs']} instrumented runs): "
             "kernels are matched to the no-position build's by structural hash; the position work is the time of "
             "the kernels the encoding adds or changes minus the time of the baseline kernels they replace. "
             "ms per run (share of the run's kernel time).", ""]
    rows = []
    for g in result["graphs"]:
        if g["name"] == result["baseline"]:
            continue
        cells = []
        for seq in s["lengths"]:
            p = _cell(llvm["profile"], graph=g["name"], seq=seq)
            cells.append(f"{fmt_ms(p['position_ms'])} ({fmt_pct(p['position_share'])})" if p else "")
        rows.append([g["name"], *cells])
    lines += _table(["encoder", *(f"T={n}" for n in s["lengths"])], rows)
    seq = max((p["seq"] for p in llvm["profile"]), default=None)
    lines += [f"The kernels behind it at T={seq} (added / replaced, ms):", ""]
    for g in result["graphs"]:
        p = _cell(llvm["profile"], graph=g["name"], seq=seq)
        if p and (p["added"] or p["replaced"]):
            added = ", ".join(f"`{n[:60]}` {fmt_ms(ms)}" for n, ms in p["added"][:4])
            replaced = ", ".join(f"`{n[:60]}` {fmt_ms(ms)}" for n, ms in p["replaced"][:3])
            lines.append(f"- {g['name']}: + {added or 'none'}; - {replaced or 'none'}")
    return lines + [""]


def llvm_memory_section(result: dict) -> list[str]:
    llvm, s = result["llvm"], result["settings"]
    cols = [(b, n) for b in s["batches"] for n in s["lengths"]]
    rows = []
    for g in result["graphs"]:
        cells = []
        for b, n in cols:
            m = _cell(llvm["memory"], graph=g["name"], batch=b, seq=n)
            cells.append(fmt_mib(m["run_bytes"]) if m else "")
        rows.append([g["name"], *cells])
    return (["## llvm: run memory", "",
             "MiB of resident memory one run adds, from an empty TVM memory pool (the pool keeps every block the "
             "run allocates, so this is the run's peak).", ""]
            + _table(["encoder", *(f"B={b} T={n}" for b, n in cols)], rows))


def tables_section(result: dict) -> list[str]:
    tables = result.get("tables")
    if not tables:
        return []
    lines = ["## Position tables: fp32 against int8", "",
             "Every table an encoder amounts to with positions folded to constants (what NPU builds hold), "
             "fp32 against int8 rows with per-row scales (`--pe-tables int8`), and the largest error int8 adds:", ""]
    rows = [[r["graph"], r["table"], str(r["seq"]), "x".join(map(str, r["shape"])), fmt_mib(r["bytes_fp32"]),
             fmt_mib(r["bytes_int8"]), f"{r['max_abs_err']:.2g}"] for r in tables["materialized"]]
    lines += _table(["encoder", "table", "T", "shape", "fp32 MiB", "int8 MiB", "max abs error"], rows,
                    "|---|---|---:|---|---:|---:|---:|")
    for b in tables.get("builds", []):
        lines += [f"{b['graph']} on llvm, stored tables as int8 ({', '.join(t['table'] for t in b['tables'])}): "
                  f"model.onnx {fmt_mib(b['model_onnx_bytes']['fp32'])} -> {fmt_mib(b['model_onnx_bytes']['int8'])} MiB", ""]
        rows = [[str(c["seq"]), fmt_ms(c["fp32_ms"]), fmt_ms(c["int8_ms"]), f"{c['fp32_max_abs']:.2g}",
                 f"{c['int8_max_abs']:.2g}", "ok" if c["int8_ok"] else "FAIL"] for c in b["cells"]]
        lines += _table(["T (B=1)", "fp32 ms", "int8 ms", "fp32 max abs err", "int8 max abs err", "int8 parity"], rows)
    return lines


def lengths_section(result: dict) -> list[str]:
    rows = []
    for r in result.get("lengths", []):
        checks = [f"T={c['seq']}: " + ("refused" if "refused" in c else
                                       f"max abs {c['max_abs']:.2g}, cosine {c['cosine']:.6f} {'ok' if c['ok'] else 'FAIL'}")
                  for c in r["checks"]]
        beyond = r["beyond"]
        rows.append([r["graph"], str(r["table_limit"] or "none"), str(r["example_length"]), str(r["bundle_max_length"]),
                     "<br>".join(checks), f"T={beyond['seq']}: " + (f"refused: {beyond['refused']}" if beyond["refused"]
                                                                   else "runs")])
    if not rows:
        return []
    return (["## Length behaviour", "",
             "Table limit: the most positions the encoding can represent (a learned table's rows). The llvm bundle "
             "is one dynamic build; its outputs are compared with PyTorch at multiples of the export example length "
             "(lengths the trace never saw), and it is fed one token past the longest length it accepts. NPU builds "
             "are static: one model per length (see the NPU sections for the lengths each encoder built at).", ""]
            + _table(["encoder", "table limit", "export example", "bundle accepts up to", "beyond the example vs PyTorch",
                      "past the limit"], rows, "|---|---:|---:|---:|---|---|"))


def npu_section(result: dict, plots: dict) -> list[str]:
    lines = []
    base = result["baseline"]
    for vendor, data in result.get("npu", {}).items():
        lines += [f"## NPU: {vendor}", ""]
        if not data["ran"]:
            lines += [f"Not run: {data['error']}", ""]
            continue
        for column, reports in data["reports"].items():
            lengths = sorted({r["seq_len"] for r in reports})
            source = next((r["time_source"] for r in reports if r["ok"] and r["time_source"]), None)
            lines += [f"### {column}", "", f"{source or 'no time estimate from this vendor'}. Per cell: estimated ms "
                      "(vs the no-position encoder; position work share), operators on NPU/CPU, int8 cosine "
                      "against PyTorch fp32.", ""]
            rows = []
            for g in result["graphs"]:
                cells = []
                for n in lengths:
                    r = _cell(reports, graph=g["name"], seq_len=n)
                    if r is None:
                        cells.append("")
                    elif not r["ok"]:
                        cells.append("not built")
                    else:
                        rel = f" ({fmt_pct(r['time_ms'] / _cell(reports, graph=base, seq_len=n)['time_ms'] - 1)}; " \
                              f"{fmt_pct(r.get('position_share'))})" if g["name"] != base and r.get("position_share") is not None else ""
                        acc = f", cos {r['accuracy']['cosine']:.4f}" if r.get("accuracy") else ""
                        cells.append(f"{fmt_ms(r['time_ms'])}{rel}<br>{r['ops_npu']}/{r['ops_cpu']}{acc}")
                rows.append([g["name"], *cells])
            lines += _table(["encoder", *(f"T={n}" for n in lengths)], rows)
            failed = [r for r in reports if not r["ok"]]
            fallbacks = [(r, c) for r in reports if r["ok"] for c in r["cpu_ops"]]
            if failed:
                lines += ["Not built, with the reason:", ""]
                lines += [f"- {r['graph']} at T={r['seq_len']}: {r['error']}" for r in failed] + [""]
            if fallbacks:
                lines += ["Operators left to the CPU, with the vendor's reason:", ""]
                lines += [f"- {r['graph']} T={r['seq_len']}: {c['op']} `{c['name'][:80]}`: {c['reason']}"
                          for r, c in fallbacks[:40]] + [""]
            d = [r for r in reports if r["ok"] and r["details"].get("dram_bytes") is not None]
            if d:
                lines += [f"Memory traffic per inference at T={max(lengths)} (MiB SRAM / DRAM / off-chip flash): "
                          + ", ".join(f"{r['graph']} {fmt_mib(r['details']['sram_bytes'])} / {fmt_mib(r['details']['dram_bytes'])}"
                                      f" / {fmt_mib(r['details']['off_chip_flash_bytes'])}"
                                      for r in d if r["seq_len"] == max(lengths)), ""]
        if plots.get(vendor):
            lines += [f"![{vendor} estimated time relative to the no-position encoder]({plots[vendor]})", ""]
    return lines


def render(result: dict, *, plots: dict | None = None) -> str:
    plots = plots or {}
    s = result["settings"]
    lines = ["# Position encodings: a measured selection guide", "",
             f"One run of `{result['command']}` on {s['machine']}, {result['timings_s'].get('total', 0):.0f} s "
             f"(versions: {', '.join(f'{k} {v}' for k, v in result['versions'].items())}). Encoders: "
             + ", ".join(f"{g['name']} ({g['encoding']})" for g in result["graphs"])
             + f"; the same model ({result['model']}), only the position encoding differs; `{result['baseline']}` "
               "has none.", ""]
    lines += claims_section(result)
    if "llvm" in result:
        lines += llvm_latency_section(result, plots) + llvm_position_section(result) + llvm_memory_section(result)
    lines += tables_section(result) + lengths_section(result) + npu_section(result, plots)
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- plots
def plot(result: dict, out: Path) -> dict[str, str]:
    """PNG plots next to the report; returns {section: file name}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = {}
    base, s = result["baseline"], result["settings"]
    if "llvm" in result:
        fig, axes = plt.subplots(1, len(s["batches"]), figsize=(5.5 * len(s["batches"]), 4), squeeze=False)
        for ax, batch in zip(axes[0], s["batches"]):
            for g in result["graphs"]:
                pts = []
                for n in s["lengths"]:
                    r = _cell(result["llvm"]["latency"], graph=g["name"], batch=batch, seq=n)
                    b = _cell(result["llvm"]["latency"], graph=base, batch=batch, seq=n)
                    if r and r["ok"] and b and b["ok"]:
                        pts.append((n, r["median_ms"] / b["median_ms"]))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=g["name"])
            ax.set(xscale="log", xlabel="sequence length", ylabel="latency / no-position latency",
                   title=f"llvm, B={batch}")
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.legend(fontsize=8)
        made["llvm"] = _save(fig, out / "guide-llvm.png", plt)
    for vendor, data in result.get("npu", {}).items():
        if not data["ran"] or not any(r["time_ms"] for rows in data["reports"].values() for r in rows):
            continue  # nothing to plot: a vendor without time estimates (RKNN) has its table only
        columns = list(data["reports"])
        fig, axes = plt.subplots(1, len(columns), figsize=(5 * len(columns), 4), squeeze=False)
        for ax, column in zip(axes[0], columns):
            reports = data["reports"][column]
            for g in result["graphs"]:
                pts = []
                for r in reports:
                    b = _cell(reports, graph=base, seq_len=r["seq_len"])
                    if r["graph"] == g["name"] and r["ok"] and b and b["ok"] and r["time_ms"] and b["time_ms"]:
                        pts.append((r["seq_len"], r["time_ms"] / b["time_ms"]))
                if pts:
                    ax.plot(*zip(*sorted(pts)), marker="o", label=g["name"])
            ax.set(xscale="log", xlabel="sequence length", ylabel="estimate / no-position estimate", title=column)
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.legend(fontsize=8)
        made[vendor] = _save(fig, out / f"guide-{vendor}.png", plt)
    return made


def _save(fig, path: Path, plt) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
