"""Seeded, bounded fuzzing of everything a model file carries (tools/fuzz.py runs the same mutators by the
thousand): each mutant must load cleanly and run, or be refused with one RefllamaError line."""

import traceback
from pathlib import Path

import pytest
from fuzzing import gguf_mutant, header_outcome, hf_mutant, load_outcome, rng_for, template_mutant, template_outcome

from refllama.api import default_model_path

DATA = Path(__file__).parent / "data"
GGUF_SOURCES = sorted(DATA.glob("gguf-*/*.gguf"))
HF_SOURCES = sorted(p for p in DATA.glob("tiny-*") if p.is_dir())
BLOCK = 50  # mutants per test: a failure names its seed and mutation


def run_block(first, make, outcome, expected):
    """Run seeds first..first+BLOCK; every outcome must be in `expected`."""
    for seed in range(first, first + BLOCK):
        what = "(not made)"
        try:
            target, what = make(seed)
            assert outcome(target) in expected
        except Exception as e:
            pytest.fail(f"seed {seed}: {what}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")


@pytest.mark.parametrize("first", range(0, 2000, BLOCK))
def test_gguf_mutants_of_tiny_models(tmp_path, first):
    def make(seed):
        path = tmp_path / f"m{seed}.gguf"
        return path, gguf_mutant(GGUF_SOURCES[seed % len(GGUF_SOURCES)], path, rng_for(seed))
    run_block(first, make, load_outcome, ("loaded", "refused"))


@pytest.mark.parametrize("first", range(10_000, 10_000 + BLOCK, BLOCK))
def test_gguf_mutants_of_the_default_models_header(tmp_path, first):
    src = default_model_path()

    def make(seed):  # the data section is a hole: it is the 3 MB header that is fuzzed here
        path = tmp_path / "m.gguf"
        return path, gguf_mutant(src, path, rng_for(seed), sparse=True)
    run_block(first, make, header_outcome, ("loaded", "refused"))


@pytest.mark.parametrize("first", range(0, 400, BLOCK))
def test_hf_directory_mutants(tmp_path, first):
    def make(seed):
        d = tmp_path / f"m{seed}"
        return d, hf_mutant(HF_SOURCES[seed % len(HF_SOURCES)], d, rng_for(seed))
    run_block(first, make, load_outcome, ("loaded", "refused"))


@pytest.mark.parametrize("first", range(0, 100, BLOCK))
def test_template_mutants(first):
    def make(seed):
        t = template_mutant(rng_for(seed))
        return t, repr(t[:80])
    run_block(first, make, lambda t: template_outcome(t, timeout=1.0), ("rendered", "refused"))
