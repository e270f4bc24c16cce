"""The package's modules import each other without a circle (lazy imports inside functions included)."""
import ast

from conftest import REPO

PACKAGE = REPO / "fairseq_xmlm"


def module_name(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: modules of the package it imports}; a package's own submodules and parents are left out (importing
    a submodule runs its parents' __init__ first, which is no circle of the code)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}

    def known(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {known(f"{node.module}.{alias.name}") for alias in node.names}
        graph[name] = {t for t in targets if t and t != name and not t.startswith(name + ".")
                       and not name.startswith(t + ".")}
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "fairseq_xmlm.evaluation.multilinguality" in graph["fairseq_xmlm.evaluation.scores"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []
