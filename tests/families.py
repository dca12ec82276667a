"""The catalogue of tiny family models in tests/data: one row a fixture, with its architecture and its features.
Every test parametrized by family reads it (tests/test_catalogue.py holds it to the files on disk and to what
refllama reads from them), so that a new family's tiny model (tools/make_tiny_gguf.py) is one row here plus its
architecture module.

    GGUF     tests/data/gguf-NAME/: NAME-f32.gguf and NAME-q8_0.gguf from llama.cpp's converter, reference.npz,
             llama.cpp's every stage on the F32 file (llamacpp-f32/) and transformers' (hf/)
    HF       tests/data/tiny-NAME/: an HF directory made by transformers (tools/make_tiny_models.py), reference.npz
"""

from pathlib import Path
from typing import NamedTuple

DATA = Path(__file__).parent / "data"


class Family(NamedTuple):
    name: str  # the fixture: tests/data/gguf-NAME
    arch: str  # its GGUF general.architecture, refllama's ModelConfig.arch
    layout: str  # llama.cpp's q/k pair layout for it ("half" for GPT-2, which has no RoPE)
    experts: bool = False  # mixture-of-experts layers
    window: bool = False  # sliding-window layers
    nope: bool = False  # layers without RoPE (SmolLM3)
    recurrent: bool = False  # linear-attention layers with a recurrent state (the hybrids')
    hf_model: bool = False  # gguf-NAME/hf-model: the HF directory it was converted from
    q8_0_stages: bool = False  # gguf-NAME/llamacpp-q8_0: llama.cpp's every stage on the Q8_0 file (float16 cache)
    gpu_graph: bool = False  # its decode step is one the GPU graph reproduces (refllama.numerics.gpu_decode)
    gelu_table: bool = False  # a GELU, which llama.cpp computes from a float16 table (docs/references.md)
    tanhf_ulps: int | None = 0  # soft-capped logits through tanhf: the ulps a last-bit tanhf leaves (None: carried)
    mxfp4: bool = False  # gguf-NAME/NAME-mxfp4.gguf: llama.cpp's quantizer's MXFP4 experts, Q8_0 otherwise
    latent: bool = False  # multi-head latent attention (DeepSeek's): numerics float32 and ggml compute other forms

    @property
    def dir(self):
        return DATA / f"gguf-{self.name}"

    def gguf(self, qtype="f32"):
        return self.dir / f"{self.name}-{qtype}.gguf"


GGUF = {f.name: f for f in (
    Family("llama", "llama", "interleaved", gpu_graph=True),
    Family("qwen2", "qwen2", "half", gpu_graph=True),
    Family("qwen3", "qwen3", "half", gpu_graph=True),
    Family("phi3", "phi3", "half", gpu_graph=True),
    Family("gemma3", "gemma3", "half", window=True, gpu_graph=True, gelu_table=True, tanhf_ulps=1),
    Family("gpt2", "gpt2", "half", gelu_table=True),
    Family("mixtral", "llama", "interleaved", experts=True, hf_model=True),
    Family("qwen3moe", "qwen3moe", "half", experts=True, hf_model=True),
    Family("qwen2moe", "qwen2moe", "half", experts=True, hf_model=True),
    Family("olmoe", "olmoe", "half", experts=True, hf_model=True),
    Family("gemma2", "gemma2", "half", window=True, hf_model=True, q8_0_stages=True, gelu_table=True,
           tanhf_ulps=None),
    Family("smollm3", "smollm3", "interleaved", nope=True, hf_model=True, q8_0_stages=True),
    Family("olmo2", "olmo2", "half", hf_model=True, q8_0_stages=True),
    Family("granite", "granite", "interleaved", hf_model=True, q8_0_stages=True),
    Family("yarn", "qwen3", "half", hf_model=True, q8_0_stages=True, gpu_graph=True),
    Family("llama32", "llama", "interleaved", hf_model=True, q8_0_stages=True, gpu_graph=True),
    Family("phi4", "phi3", "half", hf_model=True, q8_0_stages=True, gpu_graph=True),
    Family("qwen35", "qwen35", "half", recurrent=True, hf_model=True, q8_0_stages=True),
    Family("qwen35moe", "qwen35moe", "half", experts=True, recurrent=True, hf_model=True, q8_0_stages=True),
    Family("qwen3next", "qwen3next", "half", experts=True, recurrent=True, hf_model=True, q8_0_stages=True),
    Family("gptoss", "gpt-oss", "half", experts=True, window=True, hf_model=True, q8_0_stages=True, mxfp4=True),
    Family("deepseek3", "deepseek2", "interleaved", experts=True, hf_model=True, q8_0_stages=True, latent=True),
    Family("moonlight", "deepseek2", "interleaved", experts=True, hf_model=True, q8_0_stages=True, latent=True),
    Family("glm45", "glm4moe", "half", experts=True, hf_model=True, q8_0_stages=True),
)}

HF = {  # tests/data/tiny-NAME -> its architecture, and whether the GPU graph reproduces its decode step
    "llama": ("llama", True), "mistral": ("llama", True), "qwen2": ("qwen2", True), "qwen3": ("qwen3", True),
    "phi3": ("phi3", True), "gemma3": ("gemma3", True), "gpt2": ("gpt2", False)}


def names(**features):
    """The GGUF fixtures whose features are all as given: names(experts=True), names(hf_model=True, experts=False)."""
    return [f.name for f in GGUF.values() if all(getattr(f, k) == v for k, v in features.items())]
