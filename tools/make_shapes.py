"""Write tests/data/shapes/: each tiny family's F32 file (tests/data/gguf-NAME/) with its feed-forward cut to
other widths, in Q8_0 where a row is whole blocks and F16 where it is not (llama.cpp's quantizer falls back so: at a
width of 72 `ffn_down` is F16 with K = 72, not a multiple of 32; at 96 every matrix is Q8_0, K = 96 a multiple of 32
and not of 64; a mixture's experts, 64 wide, cut to 40 (F16 experts, mul_mat_id's ggml_vec_dot_f16) and 32 (Q8_0,
one block), or 32 wide to 24 and 32, their shared experts with them), and the SHA-256 of llama.cpp's stages on them
(HASHED, every layer, and the logits) on the installed build's CPU path, into llamacpp_PATH.json. Stages, not just
logits: a product's last bits seldom survive the next product's 8-bit activations, so logits alone pass an engine
whose F16 sums are in another order.
tests/test_llamacpp_exact.py holds numerics ggml to them bit for bit on every path stored.

    python tools/make_shapes.py            # the AVX-512 wheel: files and llamacpp_avx512-vnni.json, ~20 s
    python tools/make_shapes.py --logits   # in a venv with the avx2/ wheel: llamacpp_avx2.json

Needs llama-cpp-python 0.3.36 (../shared/wheels).
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import dump_llamacpp
import gguf
import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from refllama.numerics.cpu_paths import llamacpp_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from families import GGUF  # noqa: E402  (the catalogue of tiny families)

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "shapes"
WIDTHS = (72, 96)
EXPERT_WIDTHS = (40, 32)
NARROW_EXPERT_WIDTHS = (24, 32)  # experts 32 wide (the tiny DeepSeek's, GLM's): F16 at 24, Q8_0 as they are
IDS = [1, 5, 9, 14, 22, 31, 40, 47, 3, 11, 28, 19]  # 12 positions: tinyBLAS's batches and ggml_vec_dot's leftovers
HASHED = ("attn_norm", "attn_out", "ffn_inp", "sa_out", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_geglu",
          "ffn_gelu", "ffn_out", "l_out", "result_norm", "result_output", "final_output", "linear_attn_out")  # [T, X]:
# one layout in every engine (the hybrids' delta rule read through its gated norm, final_output)
F32_KEPT = (".ffn_gate_inp.", ".ssm_conv1d.")  # routers, and the conv ggml's SSM_CONV takes in F32 only (biases too,
# gpt-oss's experts' [E, FE] among them, as llama.cpp's quantizer keeps them)
N_CTX = 64
FAMILIES = list(GGUF.values())


def cut(src, out, width):
    """A copy of the F32 GGUF `src` at `out` whose feed-forward is `width` wide (its first rows and columns): a
    mixture's experts, where it has them (a shared expert and the dense layers keep theirs)."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    experts = any("_exps." in t.name for t in r.tensors)
    key = f"{arch}.expert_feed_forward_length" if f"{arch}.expert_feed_forward_length" in r.fields \
        else f"{arch}.feed_forward_length"
    ff = r.fields[key].contents()
    w = GGUFWriter(out, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = width if name == key else f.contents()
        kind = f.types[0]
        w.add_key_value(name, value, kind, sub_type=f.types[-1] if kind == GGUFValueType.ARRAY else None)
    shared = width * int(r.fields[f"{arch}.expert_shared_count"].contents()) if f"{arch}.expert_shared_count" in \
        r.fields else None  # DeepSeek's shared experts: as wide as that many experts
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32)
        if shared and (".ffn_gate_shexp." in t.name or ".ffn_up_shexp." in t.name):
            a = np.ascontiguousarray(a[:shared])
        elif shared and ".ffn_down_shexp." in t.name:
            a = np.ascontiguousarray(a[:, :shared])
        elif experts:  # [E, FE, D] gate and up, [E, D, FE] down
            if ".ffn_gate_exps." in t.name or ".ffn_up_exps." in t.name:
                a = np.ascontiguousarray(a[:, :width])
            elif ".ffn_down_exps.weight" in t.name:  # (gpt-oss's down bias [E, D] keeps its width)
                a = np.ascontiguousarray(a[:, :, :width])
        elif ".ffn_up." in t.name and a.shape[0] == 2 * ff:  # Phi-3's gate and up in one matrix, gate first
            a = np.concatenate([a[:width], a[ff:ff + width]])
        elif ".ffn_gate." in t.name or ".ffn_up." in t.name:
            a = a[:width]  # rows (or a bias)
        elif ".ffn_down.weight" in t.name:
            a = np.ascontiguousarray(a[:, :width])
        kept = any(k in t.name for k in F32_KEPT) or t.name.endswith(".bias")
        if a.ndim >= 2 and a.shape[-1] % 32 == 0 and not kept:
            w.add_tensor(t.name, gguf.quants.quantize(a, QT.Q8_0),
                         raw_shape=gguf.quants.quant_shape_to_byte_shape(a.shape, QT.Q8_0), raw_dtype=QT.Q8_0)
        elif a.ndim >= 2 and not kept:
            w.add_tensor(t.name, a.astype(np.float16), raw_dtype=QT.F16)
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def widths(family):  # the widths a family's feed-forward (a mixture's: its experts) is cut to
    if not family.experts:
        return WIDTHS
    r = GGUFReader(family.gguf("f32"))
    arch = r.fields["general.architecture"].contents()
    ff = r.fields.get(f"{arch}.expert_feed_forward_length") or r.fields[f"{arch}.feed_forward_length"]
    return EXPERT_WIDTHS if ff.contents() > max(EXPERT_WIDTHS) else NARROW_EXPERT_WIDTHS


def hashes(stages):  # {name: the SHA-256 of its float32 bytes} of the HASHED stages, in forward order
    return {n: hashlib.sha256(np.ascontiguousarray(a, np.float32).tobytes()).hexdigest()
            for n, a in stages.items() if n.rsplit("-", 1)[0] in HASHED}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logits", action="store_true", help="only llama.cpp's logits, on the files already written")
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    info = llama_cpp.llama_print_system_info().decode().strip()
    path = llamacpp_path(info)
    table = {"ids": IDS, "n_ctx": N_CTX, "producer": f"llama-cpp-python {llama_cpp.__version__} ({info})",
             "cpu_path": path, "files": {}}
    for family in FAMILIES:
        for width in widths(family):
            name = f"{family.name}-ff{width}.gguf"
            if not args.logits:
                cut(family.gguf("f32"), OUT / name, width)
            stages = dump_llamacpp.capture(str(OUT / name), IDS, 2, kv_f32=False, n_ctx=N_CTX)[0]
            table["files"][name] = hashes(stages)
            print(f"{name}: {path}")
    (OUT / f"llamacpp_{path}.json").write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
