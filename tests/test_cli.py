"""The command line, run as a user runs it: streamed text on stdout, timings on stderr, one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest
from tiers import first_fast


def cli(*args):
    return subprocess.run([sys.executable, "-m", "refllama.run", *args], capture_output=True, text=True, timeout=300)


def test_greedy_run_prints_prompt_continuation_and_timings(model):
    r = cli("-p", "The history of the printing press begins", "-n", "12", "--temp", "0")
    assert r.returncode == 0, r.stderr
    ids = model.tokenize("The history of the printing press begins")
    expected = model.detokenize(list(model.generate(ids, max_tokens=12, temperature=0)))
    assert r.stdout == "The history of the printing press begins" + expected + "\n"
    for field in ("load:", "prompt: 7 tokens", "tok/s", "generated: 12 tokens"):
        assert field in r.stderr


@pytest.mark.slow
def test_numerics_ggml_runs_llamacpps_arithmetic_on_both_backends():
    """--numerics ggml on the CLI: the same greedy text on numpy (the readable emulation) and numba (its kernels),
    and the timing line names the numerics."""
    args = ("-p", "The capital of France is", "-n", "8", "--temp", "0", "--numerics", "ggml")
    numpy_run, numba_run = cli(*args), cli(*args, "--backend", "numba")
    assert numpy_run.returncode == 0 and numba_run.returncode == 0, numpy_run.stderr + numba_run.stderr
    assert numpy_run.stdout == numba_run.stdout and "numerics ggml, cpu path " in numba_run.stderr


@pytest.mark.slow
def test_prompt_from_file_and_chat_mode(tmp_path):
    p = tmp_path / "q.txt"
    p.write_text("What is the capital of France? Answer in one word.", encoding="utf-8")
    r = cli("-f", str(p), "--chat", "--system", "Answer briefly.", "-n", "16", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "stop: stop" in r.stderr


@pytest.mark.slow
def test_sampling_flags_with_seed_are_reproducible():
    args = ("-p", "Once upon a time", "-n", "10", "--temp", "0.9", "--top-k", "20", "--top-p", "0.9",
            "--min-p", "0.02", "--repeat-penalty", "1.1", "--repeat-last-n", "32", "--seed", "5", "-c", "256")
    a, b = cli(*args), cli(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


@pytest.mark.parametrize("args, fragment", first_fast([  # the slow tier: the rest, each a process
    (("-f", "/nonexistent/prompt.txt"), "/nonexistent/prompt.txt"),
    (("-m", "/nonexistent/model.gguf"), "/nonexistent/model.gguf"),
    (("-m", "weights/pytorch_model.bin"), "pickle"),
    (("-p", "x" * 100, "-c", "8"), "context size 8"),
    (("--temp", "-1"), "temperature"),
    (("-m", "meta-llama/Llama-3.1-8B"), "never downloads"),
], n=2))
def test_bad_input_is_one_line_and_nonzero(args, fragment):
    r = cli(*args, "-n", "2")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refllama: error:") and fragment in lines[0], r.stderr


@pytest.mark.slow
def test_a_prompt_too_long_is_refused_before_it_is_echoed():
    r = cli("-p", "hello " * 50, "-c", "16", "-n", "2")
    assert r.returncode == 1 and r.stdout == "" and "context size 16" in r.stderr


@pytest.mark.parametrize("args, fragment", [
    (("--system", "be brief", "-p", "hi"), "--system goes with --chat"),
    (("--no-repack", "-p", "hi"), "--no-repack goes with --numerics ggml"),
    (("--cpu-path", "avx2", "-p", "hi"), "--cpu-path goes with --numerics ggml"),
    (("-n", "-2",), "-n/--n-predict must be -1"),
    (("--backend", "cupy", "-ngl", "0"), "-ngl 0 with --backend cupy"),
])
def test_contradictory_or_ignored_flags_are_refused(args, fragment):
    r = cli(*args)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr


@pytest.mark.slow
def test_llamacpp_habits_work(tmp_path):
    """-ngl 99 (on a CPU backend: a notice, not `-n gl`), -n -1 (to the context's end), --version, and the console
    script and `python -m refllama` run the same command."""
    r = cli("-p", "Once upon a time", "-ngl", "99", "-n", "-1", "-c", "16", "--temp", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "-ngl 99 ignored: layers run on the GPU with --backend cupy" in r.stderr
    assert "prompt: 4 tokens" in r.stderr and "generated: 12 tokens" in r.stderr and "stop: length" in r.stderr
    version = subprocess.run([sys.executable, "-m", "refllama", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("refllama 0.")
    script = Path(sys.executable).with_name("refllama-server")
    assert script.exists(), "pip install -e . installs the console scripts"
    usage = subprocess.run([script, "--help"], capture_output=True, text=True).stdout
    assert usage.startswith("usage: refllama-server") and "(default 8080)" in usage


def test_cupy_backend_without_gpu_is_a_clear_error():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a CUDA GPU is present, so the cupy backend loads")
    except Exception:
        pass
    r = cli("--backend", "cupy", "-n", "1")
    assert r.returncode == 1 and ("CuPy" in r.stderr or "GPU" in r.stderr) and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_checkpoint_suite_runs_one_backend_on_request():
    def collected(*args):
        r = subprocess.run([sys.executable, "-m", "pytest", "checkpoints/checkpoint_00_embedding.py", "--collect-only",
                            "-q", "--full", *args], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).parents[1])
        assert r.returncode == 0, r.stdout + r.stderr
        return [line for line in r.stdout.splitlines() if "::" in line]

    every, numba = collected(), collected("--backend", "numba")
    on_numba = ("-gguf-numba-", "-ggml-numba-")  # its float32 and ggml numerics cases
    assert numba and all(any(b in t for b in on_numba) for t in numba)
    assert numba == [t for t in every if any(b in t for b in on_numba)] and len(every) > len(numba)


def test_a_dump_keeps_the_blocks_and_positions_asked_for(tmp_path):
    """--dump-layers and --dump-positions keep a long prompt's dump small: those blocks (and each one's input),
    the first 8 and last positions of every stage but K and V."""
    import json

    tiny = Path(__file__).parent / "data" / "gguf-llama" / "llama-f32.gguf"
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)
    r = cli("-m", tiny, "-p", prompt, "--dump-dir", tmp_path / "d", "-n", "0", "--dump-layers", "-1",
            "--dump-positions", "12")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    n_tokens, layers = len(manifest["token_ids"]), {t["layer"] for t in manifest["tensors"]} - {None}
    assert n_tokens > 12 and len(layers) == 2  # the last block, and the one before it for its input l_out
    rows = {t["stage"]: t["positions"] for t in manifest["tensors"]}
    assert rows["attn_norm"] == [*range(8), *range(n_tokens - 4, n_tokens)] and len(rows["Kcur"]) == n_tokens
    r = cli("-m", tiny, "-p", "hi", "--dump-dir", tmp_path / "e", "-n", "0", "--dump-layers", "99")
    assert r.returncode == 1 and "block 99 asked for" in r.stderr
    assert cli("-m", tiny, "-p", "hi", "--dump-layers", "0").returncode == 2  # only with --dump-dir
