"""Tools that cannot rot: every refllama name a tools/ script imports exists, and so does every name it takes from
another tool, checked from the source without running the scripts (they need torch, transformers or llama.cpp, which
CI does not install); and tools/README.md has a row for each script."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
SCRIPTS = sorted(p.stem for p in TOOLS.glob("*.py"))


def imported(path):  # (module, name or None) for every import anywhere in the file, functions' own included
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield from ((node.module, a.name) for a in node.names)


def top_level_names(path):
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_name_a_tool_imports_exists(script):
    for module, name in imported(TOOLS / f"{script}.py"):
        if module.split(".")[0] == "refllama":
            m = importlib.import_module(module)
            if name is not None:
                assert hasattr(m, name) or importlib.util.find_spec(f"{module}.{name}"), \
                    f"tools/{script}.py: refllama has no {module}.{name}"
        elif module in SCRIPTS and name is not None:  # another tool's name, found in its source
            assert name in top_level_names(TOOLS / f"{module}.py"), f"tools/{script}.py: no {name} in tools/{module}.py"


def test_every_tool_has_a_row_in_the_tools_readme():
    readme = (TOOLS / "README.md").read_text()
    missing = [s for s in SCRIPTS if f"`{s}.py`" not in readme]
    assert not missing, f"tools/README.md has no row for {missing}"
