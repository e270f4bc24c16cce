"""The package's modules import each other without a circle, and no module imports a command module (lazy imports
inside functions included): a library never depends on a command line's module, nor a command on another
command's; only a former module name kept as an alias imports the command it stands for."""
import ast

from conftest import REPO, command_modules, module_name

PACKAGE = REPO / "fairseq_xmlm"


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


def command_imports(graph, commands, aliases=None):
    """[(module, command module it imports)]: no module depends on a command line's module, except an alias (a
    former module name kept working) on the one command it stands for."""
    aliases = aliases or {}
    return sorted((name, target) for name, targets in graph.items() for target in targets
                  if target in commands and aliases.get(name) != target)


# {former module name: the command it stands for}; the issue keeps `python -m fairseq_xmlm.packed_training`
ALIASES = {"fairseq_xmlm.packed_training": "fairseq_xmlm.packed.__main__"}


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
    commands = set(command_modules())
    assert {"fairseq_xmlm.zeroshot.run", "fairseq_xmlm.analysis.cli", "fairseq_xmlm.train",
            "fairseq_xmlm.data.prepare", "fairseq_xmlm.experiments.conneau.__main__"} <= commands
    assert not commands & {"fairseq_xmlm.zeroshot.readers", "fairseq_xmlm.data.preparation"}
    graph = {"lib": {"cli", "other_lib"}, "cli": {"lib"}, "other_cli": {"cli"}, "other_lib": set()}
    assert command_imports(graph, {"cli", "other_cli"}) == [("lib", "cli"), ("other_cli", "cli")]
    assert command_imports(graph, {"cli", "other_cli"}, aliases={"other_cli": "cli"}) == [("lib", "cli")]


def test_no_module_imports_a_command_module():
    commands = set(command_modules())
    assert set(ALIASES) | set(ALIASES.values()) <= commands, "an alias or its command is gone: update ALIASES"
    assert command_imports(import_graph(), commands, ALIASES) == []
