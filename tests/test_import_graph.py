"""The package's modules import each other without a circle, and no library module imports a command module
(lazy imports inside functions included)."""
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


def is_command(path):
    """A module a user runs: a `__main__.py`, or one with a `cli_errors` console script or a `__main__` guard."""
    if path.name == "__main__.py":
        return True
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d) == "cli_errors" for d in node.decorator_list):
            return True
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__"):
            return True
    return False


def command_imports(graph, commands, exempt=frozenset()):
    """[(library module, command module it imports)]: a library never depends on a command line's module."""
    return sorted((name, target) for name, targets in graph.items() if name not in commands
                  for target in targets if target in commands and target not in exempt)


# Modules that still hold a library next to their console script; the experiment drivers (and the piece encoder,
# data.prepare) import that library. Every other command module is out of a library's reach.
LIBRARY_AND_COMMAND = {"fairseq_xmlm.data.bible", "fairseq_xmlm.data.freedict", "fairseq_xmlm.data.prepare",
                       "fairseq_xmlm.zeroshot.genre", "fairseq_xmlm.analysis.knn_table"}


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


def test_commands_are_recognised():
    commands = {module_name(path) for path in PACKAGE.rglob("*.py") if is_command(path)}
    assert {"fairseq_xmlm.zeroshot.run", "fairseq_xmlm.analysis.cli", "fairseq_xmlm.train"} <= commands
    assert "fairseq_xmlm.zeroshot.readers" not in commands
    assert LIBRARY_AND_COMMAND <= commands, "a module of LIBRARY_AND_COMMAND lost its command: drop it from the list"
    graph = {"lib": {"cli", "other_lib"}, "cli": {"lib"}, "other_lib": set()}
    assert command_imports(graph, {"cli"}) == [("lib", "cli")]
    assert command_imports(graph, {"cli"}, exempt={"cli"}) == []


def test_no_library_module_imports_a_command_module():
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    commands = {name for name, path in modules.items() if is_command(path)}
    assert command_imports(import_graph(), commands, LIBRARY_AND_COMMAND) == []
