"""The package's layers import downwards (DESIGN.md): the only modules that import each other
in a circle are the tracked array and what its operator methods need (the tape's recording,
and the rules of its operators: arithmetic, indexing and writes, matmul). Every import counts,
also one inside a function.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tracker_gpu"
OPERATOR_CIRCLE = {
    "tracker_gpu.tracked",
    "tracker_gpu.primitive",
    "tracker_gpu.rules.elementwise",
    "tracker_gpu.rules.shape",
    "tracker_gpu.rules.reductions",  # shape's unbroadcast sums; sum's gradient broadcasts
    "tracker_gpu.rules.linalg_base",
    "tracker_gpu.rules.indexed",
}


def _modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name, path, modules):
    """The package's modules that `name` imports, anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            target = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".")
            if not node.level:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & set(modules)


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

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
            circle = set()
            while not circle or v not in circle:
                circle.add(stack.pop())
            on_stack.difference_update(circle)
            if len(circle) > 1:
                circles.append(circle)

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_only_the_operators_rules_import_each_other_in_a_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == [OPERATOR_CIRCLE]


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [{"a", "b", "c"}]
