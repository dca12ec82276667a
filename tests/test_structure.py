"""The package's structure, held by its source: every architecture module has the interface refllama.arch names and
imports no sibling; the reference core imports no numerics or harness module; no import climbs back up (file readers
to the architectures, the harness to the API, the trace to the architectures); numerics import no loader; the layers
hold no numerics dispatch; the model file's hyper-parameters (ModelConfig) hold no run-time choice."""

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import refllama
from refllama import arch
from refllama.config import ModelConfig

PACKAGE = Path(refllama.__file__).parent
CORE = ("layers.py", "cache.py", "trace.py", "config.py", "sampling.py", "errors.py", "pairs.py",
        "arch")  # what a learner reads
FAMILIES = {name: m.__name__ for name, m in arch.ARCHITECTURES.items()}


def imports(path):  # every module a file imports, as absolute names (relative ones resolved)
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)  # `from . import x` names module x


def files(*names):
    for name in names:
        p = PACKAGE / name
        yield from sorted(p.rglob("*.py")) if p.is_dir() else [p]


@pytest.mark.parametrize("name", list(arch.ARCHITECTURES))
def test_every_architecture_has_the_interface(name):
    module = arch.get(name)
    missing = [n for n in arch.REQUIRED if not hasattr(module, n)]
    assert not missing, f"refllama.arch.{name} lacks {missing}"
    assert list(inspect.signature(module.forward).parameters) == [
        "w", "cfg", "ops", "tokens", "start_pos", "cache", "last_only"]
    assert module.NAME == name and module.ROPE_LAYOUT in arch.LAYOUTS
    assert all(isinstance(row, arch.Weight) for row in (*module.WEIGHTS, *module.LAYER_WEIGHTS))
    extra = {n for n in vars(module) if n.isupper() and n not in arch.REQUIRED + arch.OPTIONAL}
    assert extra <= {"SWA_PATTERN", "LOCAL_ROPE_BASE", "WINDOW", "CAPS", "NOPE_INTERVAL",
                     "FULL_ATTENTION_INTERVAL", "OAI_SWIGLU", "LATENT_EPS"}, \
        f"undocumented interface names {extra}"


@pytest.mark.parametrize("name", list(arch.ARCHITECTURES))
def test_no_architecture_imports_another(name):
    others = {m for n, m in FAMILIES.items() if n != name}
    used = set(imports(Path(arch.get(name).__file__))) & others
    assert not used, f"refllama.arch.{name} imports {used}"


def test_the_reference_core_imports_no_numerics_or_harness_module():
    """The layers, the architectures, the cache and the trace read without the kernels and the compare engine: the
    numerics come in through the operations table a forward is handed (refllama.layers.Ops)."""
    for path in files(*CORE):
        bad = [m for m in imports(path) if m.startswith(("refllama.numerics", "refllama.check"))]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("below, above", [
    ("formats", ("refllama.arch", "refllama.loader", "refllama.api")),  # file readers: the loader joins them to arch
    ("check", ("refllama.api", "refllama.loader", "refllama.compare", "refllama.run")),  # the commands use the harness
    ("trace.py", ("refllama.arch",)),  # the trace converts q/k with refllama.pairs, below the architectures
    ("arch", ("refllama.loader", "refllama.api", "refllama.check")),
])
def test_no_import_climbs_back_up(below, above):
    for path in files(below):
        bad = [m for m in imports(path) if m.startswith(above)]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_numerics_import_no_loader():
    loaders = ("refllama.formats.gguf_loader", "refllama.formats.hf_loader", "refllama.formats.tokenizer",
               "refllama.api")
    for path in files("numerics"):
        bad = [m for m in imports(path) if m.startswith(loaders)]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_layers_are_the_formula_with_no_numerics_dispatch():
    source = (PACKAGE / "layers.py").read_text()
    assert "numerics_ops" not in source and "import importlib" not in source
    assert not any(p.name == "numerics" for f in (refllama.layers.rms_norm, refllama.layers.attention_scores,
                                                    refllama.layers.swiglu, refllama.layers.gelu_tanh)
                   for p in inspect.signature(f).parameters.values())


def test_model_config_holds_the_model_files_hyper_parameters_only():
    assert "numerics" not in {f.name for f in dataclasses.fields(ModelConfig)}


ROOT = PACKAGE.parent
TEXTS = [p for p in (*ROOT.glob("*.md"), *ROOT.glob("*/*.md"), *PACKAGE.rglob("*.py"), *ROOT.glob("tools/*.py"),
                     *ROOT.glob("tests/*.py"), *ROOT.glob("checkpoints/*.py"))]
PATH = re.compile(r"(?<![\w/.-])((?:refllama|tests|tools|checkpoints|docs|benchmarks)/[\w/.-]*[\w/])(?![\w{*-])")


def test_every_file_and_refllama_name_the_docs_and_docstrings_give_exists():
    """A doc or docstring that names a module, function or constant of refllama's (dotted, from `refllama`) or a file
    of this repository names one that exists now (names with an upper-case placeholder, as tests/data/gguf-NAME, stand
    for many; __pycache__ is made by a run)."""
    missing = []
    for text in TEXTS:
        source = text.read_text(encoding="utf-8")
        for path in PATH.findall(source):
            if not any(c.isupper() for c in path) and not (ROOT / path).exists() and "__pycache__" not in path:
                missing.append(f"{text.relative_to(ROOT)}: {path}")
        for name in set(re.findall(r"\brefllama(?:\.[A-Za-z_]\w*)+", source)):
            parts, obj = name.split("."), None
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                for attr in parts[i:]:
                    obj = getattr(obj, attr, None)
                break
            if obj is None:
                missing.append(f"{text.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_the_dump_format_lists_every_architecture():
    lines = (ROOT / "checkpoints" / "FORMAT.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `arch`"))
    assert [n for n in arch.ARCHITECTURES if f"`{n}`" not in row] == []
