"""The package's layout: no import circle between tokencredit's modules, lazy imports inside functions included."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "verifiers", "schemas", "flows")


def modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(["tokencredit", *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The tokencredit modules a file imports anywhere; `from package import module` counts as the module
    (the package's own __init__ runs first either way, and is not a dependency of its submodules)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; tokencredit's imports are absolute"
            submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            out |= set(submodules) if len(submodules) == len(node.names) else {node.module, *submodules}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {name for name in out if name in known}


def test_no_import_circle():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, "import circle: " + " -> ".join(path[path.index(name):] + [name])
        if name in done:
            return
        for dependency in sorted(graph[name]):
            visit(dependency, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert "tokencredit.pipeline.sample.vllm_backend" in known and "tokencredit.flows.cli" in known
