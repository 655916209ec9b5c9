"""The one-way floors (issue 34): import-linter's contracts in pyproject.toml hold, an upward import
breaks them (so this test can fail), and no module imports itself back through others.

Layers, top to bottom: plots | hydra_plugins.gravac_sweeper > gravac.run > gravac.config >
gravac.loop | gravac.hooks > gravac.methods | gravac.models | gravac.data > gravac.cluster >
compressors > gravac.core. Imports inside functions count: grimp reads every import statement.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gravac", "compressors", "plots", "hydra_plugins")
OURS = ("gravac", "compressors", "plots", "hydra_plugins.gravac_sweeper")


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at `root` (its pyproject.toml, its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_contracts_hold():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "KEPT" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the packages and pyproject.toml, to inject imports into."""
    root = tmp_path_factory.mktemp("tree")
    for p in PACKAGES:
        shutil.copytree(ROOT / p, root / p, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


UPWARD = [  # (module file, line added, where: "top" or "function")
    ("gravac/core/schema.py", "from gravac.loop.results import RunWriter", "top"),          # core -> loop
    ("gravac/cluster/netmodel.py", "from gravac.methods import METHODS", "function"),       # cluster -> methods
    ("compressors/topk.py", "import gravac.run.sweep", "top"),                               # compressors -> run
    ("plots/labels.py", "from gravac.loop import summary", "function"),                     # plots -> library
]


@pytest.mark.parametrize("path,line,where", UPWARD, ids=[u[0] for u in UPWARD])
def test_an_upward_import_fails_the_lint(tree, path, line, where):
    f = tree / path
    original = f.read_text()
    added = f"\n\n{line}\n" if where == "top" else f"\n\ndef _injected():\n    {line}\n"
    f.write_text(original + added)
    try:
        r = lint(tree)
    finally:
        f.write_text(original)
    assert r.returncode != 0, f"lint-imports passed with `{line}` in {path}:\n{r.stdout}"
    assert "BROKEN" in r.stdout, r.stdout
    module = path[:-3].replace("/", ".")
    assert module in r.stdout, r.stdout      # the report names the importing module


def test_the_unchanged_copy_passes(tree):
    """The copy itself lints clean: the failures above are the injected imports' doing."""
    r = lint(tree)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_import_cycles():
    """No module reaches itself through imports (module level and inside functions alike)."""
    grimp = pytest.importorskip("grimp")
    code = ("import grimp, json; g = grimp.build_graph(*%r, include_external_packages=False); "
            "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))" % (PACKAGES,))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json
    ours = lambda m: m.split(".")[0] in OURS or m.startswith(OURS)   # noqa: E731
    edges = {m: [n for n in v if ours(n)] for m, v in json.loads(r.stdout).items() if ours(m)}
    assert grimp and len(edges) > 50
    cycles = strongly_connected(edges)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges.get(start, ())))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert strongly_connected({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert strongly_connected({"a": ["b"], "b": []}) == []
