"""Seeded, bounded fuzzing of everything a model file carries (tools/fuzz.py runs the same mutators by the
thousand): each mutant must load cleanly and run, or be refused with one RefllamaError line."""

import traceback
from pathlib import Path

import pytest
from fuzzing import gguf_mutant, header_outcome, hf_mutant, load_outcome, rng_for, template_mutant, template_outcome
from tiers import first_fast

from refllama.api import default_model_path

DATA = Path(__file__).parent / "data"
GGUF_SOURCES = sorted(DATA.glob("gguf-*/*.gguf"))
HF_SOURCES = sorted(p for p in DATA.glob("tiny-*") if p.is_dir())
BLOCK = 50  # mutants per test: a failure names its seed and mutation
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # mutated scales dequantize to NaN, by design


def run_block(first, make, outcome, expected):
    """Run seeds first..first+BLOCK; every outcome must be in `expected`."""
    for seed in range(first, first + BLOCK):
        what = "(not made)"
        try:
            target, what = make(seed)
            assert outcome(target) in expected
        except Exception as e:
            pytest.fail(f"seed {seed}: {what}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")


def mutants(tmp_path, sources, mutate, suffix=""):
    """make(seed) -> (mutant path, description): seed picks the source and seeds the mutation."""
    def make(seed):
        target = tmp_path / f"m{seed}{suffix}"
        return target, mutate(sources[seed % len(sources)], target, rng_for(seed))
    return make


@pytest.mark.parametrize("first", first_fast(range(0, 2000, BLOCK)))
def test_gguf_mutants_of_tiny_models(tmp_path, first):
    run_block(first, mutants(tmp_path, GGUF_SOURCES, gguf_mutant, ".gguf"), load_outcome, ("loaded", "refused"))


@pytest.mark.slow  # SmolLM2 loaded 50 times: the tiny models' first block is the fast tier's
@pytest.mark.parametrize("first", range(10_000, 10_000 + BLOCK, BLOCK))
def test_gguf_mutants_of_the_default_models_header(tmp_path, first):
    src = default_model_path()

    def make(seed):  # the data section is a hole: it is the 3 MB header that is fuzzed here
        path = tmp_path / "m.gguf"
        return path, gguf_mutant(src, path, rng_for(seed), sparse=True)
    run_block(first, make, header_outcome, ("loaded", "refused"))


@pytest.mark.parametrize("first", first_fast(range(0, 400, BLOCK)))
def test_hf_directory_mutants(tmp_path, first):
    run_block(first, mutants(tmp_path, HF_SOURCES, hf_mutant), load_outcome, ("loaded", "refused"))


@pytest.mark.slow  # a sandboxed process a template, 6 s a block: test_hostile_input's corpus is the fast tier's
@pytest.mark.parametrize("first", range(0, 100, BLOCK))
def test_template_mutants(first):
    def make(seed):
        t = template_mutant(rng_for(seed))
        return t, repr(t[:80])
    run_block(first, make, lambda t: template_outcome(t, timeout=1.0), ("rendered", "refused"))
