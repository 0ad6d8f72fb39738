"""Import cycles in portable_pe: every `import` of one of its modules, anywhere in a module
(lazy imports inside functions count too; `--top` counts module-level imports only), as a
graph; its strongly connected components of more than one module are the cycles.

    python scripts/import_cycles.py [--top]      # exit 1 when there is a cycle
"""
import ast
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent / "portable_pe"
mods = {}
for p in root.rglob("*.py"):
    name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
    if name.endswith(".__init__"): name = name[: -len(".__init__")]
    mods[name] = p
def resolve(cur, node):
    pkg = cur if mods[cur].name == "__init__.py" else cur.rsplit(".", 1)[0]
    if isinstance(node, ast.ImportFrom):
        base = pkg
        for _ in range(node.level - 1): base = base.rsplit(".", 1)[0]
        mod = (base + "." + node.module) if node.level and node.module else (base if node.level else node.module)
        out = []
        for a in node.names:
            if f"{mod}.{a.name}" in mods: out.append(f"{mod}.{a.name}")
            elif mod in mods: out.append(mod)
        return out
    return [a.name for a in node.names if a.name in mods]
edges = {m: set() for m in mods}
top_only = "--top" in sys.argv
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    nodes = tree.body if top_only else ast.walk(tree)
    for n in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            edges[m] |= {t for t in resolve(m, n) if t != m}
# strongly connected components (Tarjan)
index, low, stack, on, sccs, i = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def sc(v):
    index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in mods:
    if v not in index: sc(v)
print(f"{'top-level' if top_only else 'all'} imports: {len(sccs)} cycle(s)")
for c in sccs:
    print("  ", " <-> ".join(c))
sys.exit(1 if sccs else 0)
