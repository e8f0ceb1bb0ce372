"""No import cycle between any two modules of ``vllm_lookahead`` or ``quality_sidecar``.

``lint-imports`` (pyproject.toml, [tool.importlinter]) checks sibling packages; a cycle between a
package's ``__init__`` and one of its own modules is not a sibling cycle, so this test looks at the
whole module graph (imports inside functions count; imports under ``if TYPE_CHECKING:`` do not).
"""

from __future__ import annotations

import grimp
import pytest

pytestmark = pytest.mark.unit


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")
    g.add_import(importer="p", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycles():
    graph = grimp.build_graph("vllm_lookahead", "quality_sidecar", exclude_type_checking_imports=True,
                              cache_dir=None)
    found = []
    for comp in _cycles(graph):
        members = set(comp)
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph.find_modules_directly_imported_by(a))
                 if b in members]
        found.append(f"{comp}: " + "; ".join(edges))
    assert not found, "import cycles:\n" + "\n".join(found)
