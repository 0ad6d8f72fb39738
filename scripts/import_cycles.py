"""Import cycles in portable_pe: every import of one of its modules, anywhere in a module,
as a graph; its strongly connected components of more than one module are the cycles.

    python scripts/import_cycles.py [--top]      # exit 1 when there is a cycle

Edges come from `import` statements (lazy ones inside functions too; `--top` counts
module-level statements only) and from modules loaded by name: a call of
importlib.import_module or __import__ whose argument is a string naming a module of the
package, and, in a module that makes such calls, every string constant naming one (a
registry's table of module paths). A dynamic import whose target cannot be read (an
f-string, a variable) is reported and fails the check too: write the path as a string.
"""
import ast
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent / "portable_pe"
PACKAGE = root.name
mods = {}
for p in root.rglob("*.py"):
    name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    mods[name] = p


def resolve(cur, node):
    pkg = cur if mods[cur].name == "__init__.py" else cur.rsplit(".", 1)[0]
    if isinstance(node, ast.ImportFrom):
        base = pkg
        for _ in range(node.level - 1):
            base = base.rsplit(".", 1)[0]
        mod = (base + "." + node.module) if node.level and node.module else (base if node.level else node.module)
        out = []
        for a in node.names:
            if f"{mod}.{a.name}" in mods:
                out.append(f"{mod}.{a.name}")
            elif mod in mods:
                out.append(mod)
        return out
    return [a.name for a in node.names if a.name in mods]


def named_module(text):
    """The package module a dotted string names (its longest module prefix), or None."""
    if not isinstance(text, str) or not (text == PACKAGE or text.startswith(PACKAGE + ".")):
        return None
    while text and text not in mods:
        text = text.rpartition(".")[0]
    return text or None


def is_dynamic_import(call):
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or \
           (isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))


edges = {m: set() for m in mods}
unreadable = []
top_only = "--top" in sys.argv
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    nodes = list(tree.body if top_only else ast.walk(tree))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and is_dynamic_import(n)]
    for n in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            edges[m] |= {t for t in resolve(m, n) if t != m}
    named = {named_module(n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)} - {None, m}
    for call in calls:
        arg = call.args[0] if call.args else None
        if isinstance(arg, ast.Constant) and named_module(arg.value):
            edges[m].add(named_module(arg.value))
        elif named:  # loaded from a table of module paths: each path is an edge
            edges[m] |= named
        else:
            unreadable.append(f"{p.relative_to(root.parent)}:{call.lineno}")
    edges[m].discard(m)
# strongly connected components (Tarjan)
index, low, stack, on, sccs, i = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def sc(v):
    index[v] = low[v] = i[0]
    i[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in mods:
    if v not in index:
        sc(v)
print(f"{'top-level' if top_only else 'all'} imports (importlib included): {len(sccs)} cycle(s)")
for c in sccs:
    print("  ", " <-> ".join(c))
for where in unreadable:
    print(f"   dynamic import whose module cannot be read: {where} (name the module in a string constant)")
sys.exit(1 if sccs or unreadable else 0)
