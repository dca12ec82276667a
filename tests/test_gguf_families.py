"""GGUF families made by llama.cpp's own converter (tools/make_tiny_gguf.py): tiny random Llama, Qwen2, Qwen3,
Phi-3, Gemma 3 and GPT-2 models, and the mixtures of experts Mixtral (a `llama` file), Qwen3-MoE, Qwen2-MoE and OLMoE,
F32 and Q8_0, checked against transformers (the HF weights they were converted
from) and llama.cpp (its logits on both files, every stage of every layer on the F32 file, F32 KV cache)."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from families import GGUF
from tiers import first_fast, param

import refllama
from refllama import arch
from refllama.check.compare import compare
from refllama.check.dump import Dump, split_name
from refllama.check.tolerances import band
from refllama.formats.gguf_loader import Field, GGUFFile
from refllama.numerics.cpu_paths import EMULATED

DATA = Path(__file__).parent / "data"
FAMILIES = list(GGUF)
N_CTX = 256  # Phi-3's original context: its short factors, which llama.cpp and transformers both take here
F32_TOL = 1e-5  # of the reference's range: llama.cpp on F32 weights and an F32 cache computes in float32


def ref(family):
    return np.load(DATA / f"gguf-{family}" / "reference.npz")


def load(family, qtype="f32", backend="numpy"):
    return refllama.load(DATA / f"gguf-{family}" / f"{family}-{qtype}.gguf", backend=backend, n_ctx=N_CTX)


def rel_err(got, want):
    return float(np.abs(got - want).max() / (want.max() - want.min()))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_runs_as_its_architecture_with_llamacpps_pair_layout(family):
    cfg = load(family).config
    assert (cfg.arch, cfg.rope_layout) == (GGUF[family].arch, GGUF[family].layout)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_ids_and_end_of_generation_set_equal_llamacpps(family):
    r = json.loads((DATA / f"gguf-{family}" / "reference.json").read_text())
    m = load(family)
    assert m.tokenize(r["text"]) == ref(family)["token_ids"].tolist()
    assert sorted(m.tokenizer.eog_ids) == r["llamacpp_eog"]


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_logits_and_hidden_states_match_transformers(family):
    m, r = load(family), ref(family)
    with refllama.trace(m) as t:
        logits = m.logits(r["token_ids"].tolist())
    assert rel_err(logits, r["hf_logits"]) < F32_TOL
    ours = [t[m.arch.INPUTS[-1]]] + [t[f"l_out-{i}"] for i in range(m.config.n_layer - 1)] + [t["result_norm"]]
    for i, (a, b) in enumerate(zip(ours, r["hf_hidden_states"], strict=True)):
        assert rel_err(a, b) < F32_TOL, f"hidden state {i}"


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_every_stage_of_every_layer_matches_llamacpp(family, tmp_path):
    """refllama's dump against llama.cpp's, q/k in the same layout (no permutation), at float32 agreement: end to
    end, and each stage recomputed by refllama from llama.cpp's own inputs. Gemma 3 and GPT-2 end to end only
    within llama.cpp's float16 GELU table's error (GGML_GELU_FP16, the `llama.cpp F32` rows of ffn_geglu and
    ffn_gelu), which every later stage carries; every other stage, recomputed from llama.cpp's inputs, agrees at
    float32."""
    m, r = load(family), ref(family)
    theirs = Dump(DATA / f"gguf-{family}" / "llamacpp-f32")
    assert theirs.layout == m.config.rope_layout
    ours = m.dump(r["token_ids"].tolist(), tmp_path / "ours")
    a = arch.get(m.config.arch)
    absorbed = getattr(a, "ABSORBED_STAGES", ())  # latent attention: llama.cpp's form alone, not float32's
    shared = {n for n in theirs.names if split_name(n)[0] not in absorbed}
    assert shared <= set(Dump(ours).names)
    assert bool(absorbed) == (shared != set(theirs.names))  # llama.cpp's dump holds its absorbed stages
    expanded = getattr(a, "EXPANDED_STAGES", ())
    assert len(theirs.names) == len(a.INPUTS) + 2 + sum(len([s for s in stages if s not in expanded])
                                                       for stages in arch.layer_stages(a, m.config))
    e2e_tol = 5e-3 if GGUF[family].gelu_table else F32_TOL  # Gemma 3: 4.6e-3 at kq_soft_max, GPT-2: 2.7e-5
    report = compare(ours, DATA / f"gguf-{family}" / "llamacpp-f32", m)
    rows = report.rows
    assert len(rows) == len(shared)
    assert bool(absorbed) == ("absorbed form, compared at the stages both forms share" in " ".join(report.coverage))
    for row in rows:  # float32's rounding grows with a stage's magnitude, not its range: a stage near 1 that varies
        # by 0.1 (ffn_moe_weights_sum) carries another CPU's BLAS's last bits upstream to 1e-5 of its range
        values = theirs[row["name"]]
        values = values[np.isfinite(values)]  # the experts routing masks at -inf
        span = float(np.ptp(values)) or 1.0
        scale = max(span, float(np.abs(values).max())) / span
        assert row["max_rel"] <= e2e_tol * scale, f"{row['name']}: max_rel {row['max_rel']:.2e}"
        local, tol = row["local_REF"], band("llama.cpp F32", row["stage"])
        assert local["max_rel"] <= tol[0] and local["nmse"] <= tol[1], f"{row['name']} recomputed: {local}"
    assert rel_err(m.logits(r["token_ids"].tolist()), r["llamacpp_logits_f32"]) < e2e_tol


def test_phi3_takes_its_long_rope_factors_beyond_the_original_context_as_llamacpp_does():
    """llama.cpp picks LongRoPE's factors by context size; at 512 > 256 its logits are the long factors' and so are
    refllama's, while at 256 both take the short ones (transformers picks by sequence length: short here)."""
    r = ref("phi3")
    long = refllama.load(DATA / "gguf-phi3" / "phi3-f32.gguf", n_ctx=512)
    assert long.config.rope_ctx_orig == N_CTX
    logits = long.logits(r["token_ids"].tolist())
    assert rel_err(logits, r["llamacpp_logits_f32_long"]) < F32_TOL
    assert rel_err(logits, r["llamacpp_logits_f32"]) > 1e-3


@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_logits_match_llamacpp(family, backend):
    """On Q8_0 weights llama.cpp rounds the activations to Q8_0 too before its integer dot products; refllama keeps
    them float32 (both backends), so the two differ by that rounding: at most 6.4e-3 of the logit range here. The
    tiny Gemma 3 amplifies it (embeddings times 8, four (1 + w) norms a block of w ~ 1, a float16 GELU): 8.9e-2,
    top-1 equal at 35 of 39 positions; its F32 file agrees at every stage (above). The tiny Gemma 2 likewise:
    2.4e-2. The tiny Qwen3.5-MoE and Qwen3-Next: the rounding flips some of their experts' near ties (1 to 6 of 117
    slots a layer; 1 to 2 of 78): 3.8e-2 both, top-1 equal at 39 and 38 of 39 positions. The tiny gpt-oss likewise
    (0 to 8 of 117 slots a layer, its experts' gates up to 30): 4.3e-2, top-1 equal at 35 of 39 positions."""
    m, r = load(family, "q8_0", backend), ref(family)
    logits = m.logits(r["token_ids"].tolist())
    tol, agree = {"gemma3": (0.1, 0.85), "gemma2": (0.1, 0.85), "qwen35moe": (5e-2, 0.9),
                  "qwen3next": (5e-2, 0.9), "gptoss": (5e-2, 0.85)}.get(family, (2e-2, 0.9))
    assert rel_err(logits, r["llamacpp_logits_q8_0"]) < tol
    assert (logits.argmax(-1) == r["llamacpp_logits_q8_0"].argmax(-1)).mean() >= agree


def ggml_refs(family, suffix=""):
    """CPU path -> llama.cpp's Q8_0 logits on it (float16 cache), each made by the llama.cpp built for that path
    (tools/make_tiny_gguf.py --ggml-logits), as reference.json names them; `suffix`: the ARM references' runs of
    the prompt's first tokens, or without the repack ("_first1", "_first5", "_first1_norepack", "_first39_norepack")."""
    paths = json.loads((DATA / f"gguf-{family}" / "reference.json").read_text())["q8_0_f16kv_paths"]
    return {text.split(":")[0]: ref(family)[key + suffix] for key, text in paths.items() if key + suffix in ref(family)}


def assert_llamacpps(logits, want, family, cpu):
    """Bit-equal, but where the logits pass through the C library's tanhf on an ARM path computed on x86: aarch64's
    glibc (built with fused multiply-adds) differs from x86-64's in the last bit for about 1 input in 4,000 (69 of
    the tiny Gemma 2's 35,523), so a few soft-capped logits may be 1 ulp apart; in Gemma 2, whose attention scores
    pass through tanhf too, the difference is carried through the layers: a few ulps in a few logits. With aarch64's
    tanhf put in, the tiny Gemma 3 and Gemma 2 are bit-equal (checked under qemu-aarch64)."""
    ulps = GGUF[family].tanhf_ulps  # logits soft-capped with the C library's tanhf: 0 none, None carried through
    if ulps != 0 and cpu.startswith("neon") and not platform.machine().lower().startswith(("arm", "aarch64")):
        if ulps:
            np.testing.assert_array_max_ulp(logits, want, ulps)
            assert (logits != want).mean() < 1e-3
        else:
            assert rel_err(logits, want) < 1e-6 and (logits != want).mean() < 1e-2
    else:
        np.testing.assert_array_equal(logits, want)


@pytest.mark.parametrize("backend, cpu", [param(b, c, fast=(b, c) == ("numpy", "avx512-vnni"))
                                          for b in ("numpy", "numba") for c in EMULATED[b]])
@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_logits_in_ggml_numerics_are_llamacpps(family, backend, cpu):
    """numerics "ggml" computes as llama.cpp does (8-bit activations, float16 KV cache, its sums' order, its GELU
    table, Gemma 3's q scaled before q.k): bit-equal logits to llama.cpp's on its default float16 cache, on each of
    its paths: x86's (no matrix here is one they repack; Phi-3's logits differ between the two) and ARM's (every
    Q8_0 matrix repacked, float16 sums in float16, no tinyBLAS at all with i8mm)."""
    refs = ggml_refs(family)
    assert cpu in refs, f"no reference from llama.cpp's {cpu} build"
    m = refllama.load(DATA / f"gguf-{family}" / f"{family}-q8_0.gguf", backend=backend, n_ctx=N_CTX, numerics="ggml",
                      cpu_path=cpu)
    assert_llamacpps(m.logits(ref(family)["token_ids"].tolist()), refs[cpu], family, cpu)


@pytest.mark.parametrize("cpu", [c for c in EMULATED["numpy"] if c.startswith("neon")])
@pytest.mark.parametrize("n, repack", first_fast([(1, True), (5, True), (1, False), (39, False)]))
@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_logits_on_arm_paths_for_few_tokens_and_without_the_repack(family, n, repack, cpu):
    """ARM's kernels for fewer than 8 tokens (ggml_vec_dot_f16's float16 lanes, the F32 vec_dot below 4) and those
    the repack replaces (ggml_vec_dot_q8_0_q8_0 for one token, tinyBLAS_Q0_ARM for a batch): bit-equal too."""
    want = ggml_refs(family, f"_first{n}" + ("" if repack else "_norepack"))[cpu]
    m = refllama.load(DATA / f"gguf-{family}" / f"{family}-q8_0.gguf", n_ctx=N_CTX, numerics="ggml", cpu_path=cpu,
                      repack=repack)
    assert_llamacpps(m.logits(ref(family)["token_ids"][:n].tolist()), want, family, cpu)


@pytest.mark.parametrize("pattern, local", [
    (Field(4, False, 3), (True, True, False, True, True, False)),  # a period, as load_swa_pattern reads it
    (Field(7, True, [True, False, False, True, True, True]), (True, False, False, True, True, True)),  # flags
    (Field(4, False, 0), (True,) * 6),  # 0: every layer local
])
def test_gemma3_sliding_window_pattern_from_metadata(pattern, local):
    g = GGUFFile(DATA / "gguf-gemma3" / "gemma3-f32.gguf")
    assert arch.gemma3.config_from_gguf(g).swa_layers == (True,) * 5 + (False,)  # none given: llama.cpp's 6
    g.fields["gemma3.attention.sliding_window_pattern"] = pattern
    assert arch.gemma3.config_from_gguf(g).swa_layers == local
    g.fields["gemma3.attention.sliding_window"] = Field(4, False, 0)  # no window: every layer global, one base
    cfg = arch.gemma3.config_from_gguf(g)
    assert cfg.swa_layers is None and cfg.sliding_window is None and cfg.rope_base_swa is None


def test_gemma3_pattern_of_the_wrong_length_is_named():
    g = GGUFFile(DATA / "gguf-gemma3" / "gemma3-f32.gguf")
    g.fields["gemma3.attention.sliding_window_pattern"] = Field(7, True, [True, False])
    with pytest.raises(refllama.RefllamaError, match="sliding_window_pattern' has 2 entries for 6 layers"):
        arch.gemma3.config_from_gguf(g)


def test_a_window_longer_than_any_context_hides_nothing():
    """Found by tools/fuzz.py (hf seed 600264): a sliding_window of 1e30 overflowed the mask's arithmetic."""
    from refllama.layers import causal_mask

    np.testing.assert_array_equal(causal_mask(3, 4, 7, np, 10 ** 30), causal_mask(3, 4, 7, np))
    assert np.isinf(causal_mask(3, 4, 7, np, 2)[0, :2]).all() and (causal_mask(3, 4, 7, np, 2)[0, 2:4] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_block_count_past_the_files_tensors_is_refused_before_any_table_is_sized(family):
    """Found by tools/fuzz.py (gguf seed 700873): Gemma 3's block_count 2^32 - 1 sized its per-layer window table."""
    g = GGUFFile(DATA / f"gguf-{family}" / f"{family}-f32.gguf")
    name = GGUF[family].arch
    g.fields[f"{name}.block_count"] = Field(4, False, 2 ** 32 - 1)
    with pytest.raises(refllama.RefllamaError, match="block_count' is 4294967295, more blocks than the file's"):
        arch.get(name).config_from_gguf(g)


def test_gpt2_heads_that_do_not_split_the_width_are_named():
    """Found by tools/fuzz.py (gguf seed 501758): head_count 7 for a width of 64 reached a reshape."""
    g = GGUFFile(DATA / "gguf-gpt2" / "gpt2-f32.gguf")
    g.fields["gpt2.attention.head_count"] = Field(4, False, 7)
    with pytest.raises(refllama.RefllamaError, match="embedding length 64 does not split into 7 heads"):
        arch.gpt2.config_from_gguf(g)


def patched(family, tmp_path, old, new):
    """The F32 file with one header string changed (same length), as a corrupt or foreign file would have it."""
    data = (DATA / f"gguf-{family}" / f"{family}-f32.gguf").read_bytes()
    assert len(old) == len(new) and data.count(old) >= 1
    path = tmp_path / "patched.gguf"
    path.write_bytes(data.replace(old, new))
    return path


def error_of(path):
    r = subprocess.run([sys.executable, "-m", "refllama.run", "-m", str(path), "-p", "hi", "-n", "1"],
                       capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("refllama: error:"), r.stderr
    return lines[0]


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    data = (DATA / "gguf-qwen2" / "qwen2-f32.gguf").read_bytes()
    at = data.index(b"general.architecture") + len(b"general.architecture") + 4 + 8  # value type, string length
    assert data[at:at + 5] == b"qwen2"
    path = tmp_path / "other.gguf"
    path.write_bytes(data[:at] + b"qwen9" + data[at + 5:])
    line = error_of(path)
    assert "unsupported general.architecture 'qwen9'" in line and "llama, qwen2, qwen3, phi3, gemma3" in line


@pytest.mark.parametrize("family, old, new", [
    ("qwen3", b"blk.1.attn_k_norm.weight", b"blk.1.attn_k_xorm.weight"),
    ("phi3", b"blk.0.attn_qkv.weight", b"blk.0.attn_qkx.weight"),
    ("qwen2", b"blk.0.attn_v.bias", b"blk.0.attn_v.bia_"),
])
def test_a_missing_family_tensor_is_named(family, old, new, tmp_path):
    assert f"missing tensor '{old.decode()}'" in error_of(patched(family, tmp_path, old, new))


def test_a_missing_metadata_key_is_named(tmp_path):
    old = b"phi3.attention.layer_norm_rms_epsilon"
    line = error_of(patched("phi3", tmp_path, old, old[:-1] + b"X"))
    assert f"missing metadata field '{old.decode()}'" in line


def test_the_llamacpp_dump_tool_reads_each_files_architecture(monkeypatch):
    pytest.importorskip("llama_cpp", reason="tools/dump_llamacpp.py needs llama-cpp-python, a reference "
                        "tool: pip install ../shared/wheels/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "tools"))
    import dump_llamacpp

    for family in FAMILIES:
        assert dump_llamacpp.arch_of(DATA / f"gguf-{family}" / f"{family}-q8_0.gguf").NAME == GGUF[family].arch
