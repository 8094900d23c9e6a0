"""The house's rules, checked on the source: the import graph of the product and the
serving package has no cycle and runs one way between them, no product module passes
~300 lines, and every option's help is one or two lines (docs/options.md keeps the
rationale)."""

import ast
from dataclasses import fields
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"budget_plugin": REPO / "budget_plugin", "budget_serve": REPO / "serve" / "budget_serve"}


def sources() -> dict:
    """Each source file of the packages -> its module name."""
    found = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder.parent).with_suffix("").parts
            found[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return found


def import_graph() -> dict:
    """Module -> the package modules it imports, at any depth of its code (an import
    inside a function is an edge too: it only hides a cycle)."""
    files = {name: path for path, name in sources().items()}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    edges.add(target if target in files else base)
        graph[name] = {edge for edge in edges if edge in files and edge != name}
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_product_or_the_serving_package():
    graph = import_graph()
    assert "budget_plugin.dial.model" in graph and graph["budget_plugin.models.budgetformer"]  # the graph is read
    assert cycles(graph) == []


def test_the_serving_package_never_imports_the_plugin():
    graph = import_graph()
    wrong = {name: sorted(e for e in edges if e.startswith("budget_plugin"))
             for name, edges in graph.items() if name.startswith("budget_serve")}
    assert all(not edges for edges in wrong.values()), wrong


def test_no_product_module_passes_300_lines():
    long = {str(path.relative_to(REPO)): n for path in sources()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 300}
    assert long == {}


def option_helps():
    from budget_plugin.config import BudgetConfig
    from budget_plugin.criterions.budget_sentence_prediction import BudgetSentencePredictionConfig
    from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionConfig as TaskConfig

    own = [BudgetConfig, BudgetSentencePredictionConfig, TaskConfig]
    inherited = {f.name for config in own for base in config.__mro__[1:] if hasattr(base, "__dataclass_fields__")
                 for f in fields(base)}
    return [(config.__name__, f.name, f.metadata.get("help", "")) for config in own for f in fields(config)
            if f.name not in inherited]


@pytest.mark.parametrize("config, name, help", option_helps())
def test_every_option_of_ours_has_a_help_of_one_or_two_lines(config, name, help):
    assert 10 <= len(help) <= 180, f"{config}.{name}: {len(help)} characters (rationale: docs/options.md)"
    assert "issue" not in help.lower() and "study" not in help.lower(), help
