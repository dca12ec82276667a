"""Loading a model file: a GGUF file or an HF directory read through refllama.formats, its architecture module
(refllama.arch) reading the config and the weights table. Here, above both, so that no file reader depends on the
architectures."""

import math
from pathlib import Path

from . import arch as archs
from .arch.tables import read_weights
from .config import Loaded
from .errors import RefllamaError, shown
from .formats.gguf_loader import GGUFFile
from .formats.hf_loader import Checkpoint, Config, eos_ids
from .formats.safety import check_memory
from .formats.tokenizer import from_gguf, from_hf_dir
from .xp import Placement


def load_gguf(path, placement=None):
    """Loaded(config, weights, tokenizer, chat template, notices) for a GGUF file: the architecture module its
    `general.architecture` names reads the config and the weights table. Each tensor goes to `placement`
    (refllama.xp.Placement; default: NumPy) as it is read: float32, or for matrices of its `keep` types their
    GGUF bytes (QuantizedTensor)."""
    g = GGUFFile(path)
    arch = archs.for_gguf(g.string("general.architecture", required=True), g.path)
    cfg = arch.config_from_gguf(g)
    tokenizer = from_gguf(g)
    template = g.string("tokenizer.chat_template") or getattr(arch, "CHAT_TEMPLATE", None)
    # the tokenizer holds the vocabulary now: free its ~100k Python strings before the weights arrive
    g.fields = {k: v for k, v in g.fields.items() if not k.startswith("tokenizer.ggml.")}
    placement = placement or Placement()
    placement.plan(sum(4 * math.prod(t.shape) for t in g.tensors.values()))
    placement.prepare({t.tensor_type for t in g.tensors.values() if len(t.shape) in (2, 3)}, cfg)
    kept = [t for t in g.tensors.values() if not (len(t.shape) in (2, 3) and t.tensor_type in placement.keep)]
    check_memory(sum(4 * math.prod(t.shape) for t in kept), f"{g.path}: the weights in float32",
                 "use a smaller model, or --backend numba, which keeps quantized weights as they are")
    weights = read_weights(arch, cfg, "gguf", lambda name, shape: g.tensor(name, shape, placement.keep),
                           lambda name: name in g.tensors, placement)
    types = ", ".join(sorted(g.fallbacks))
    notices = [f"no {{backend}} kernel for {types}: those tensors are dequantized to float32"] if types else []
    converted = ", ".join(sorted(placement.converted))
    if converted:
        notices.append(f"no {{backend}} kernel for {converted}: those matrices are converted to float32 as each "
                       "product runs")
    return Loaded(cfg, weights, tokenizer, template, notices)


def load_hf(directory, placement=None):
    """Loaded(config, weights, tokenizer, chat template, notices) for an HF model directory; each tensor goes to
    `placement` (refllama.xp.Placement; default: NumPy) as it is read."""
    d = Path(directory)
    c = Config(d / "config.json")
    names = c.get("architectures", kind=(list,))
    if not names:
        raise RefllamaError(f"{c.path}: missing field 'architectures'")
    arch = archs.for_hf(names[0], c.path)
    text, prefix = c, ""  # a multimodal checkpoint: its text model's config and tensors, the rest left unread
    if names[0] in getattr(arch, "HF_MULTIMODAL", ()):
        text, prefix = c.nested("text_config"), "model.language_model."
    try:
        cfg, rope = arch.config_from_hf(text)
    except (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
        # the fields each family reads are checked by name; this names any value that slipped past those checks
        raise RefllamaError(f"{c.path}: invalid config ({type(e).__name__}: {shown(str(e))})") from None
    cfg.checked(text.path)
    ck = Checkpoint(d)
    place = placement or Placement()
    place.plan(ck.float32_bytes(frozenset()))
    check_memory(ck.float32_bytes(place.keep), f"{d}: the weights in float32",
                 "use a smaller model or a 16-bit one (kept as stored on numpy and numba)")
    def named(name):  # the text model's `model.` tensors under the multimodal checkpoint's prefix
        return prefix + name.removeprefix("model.") if prefix and name.startswith("model.") else name

    weights = read_weights(arch, cfg, "hf", lambda name, shape: ck.tensor(named(name), shape, place.keep),
                           lambda name: named(name) in ck, place,
                           lambda name, shape: ck.tensor(named(name), shape, packed=True))
    weights.update(rope())
    tokenizer, template = from_hf_dir(d, eos_ids(c, d))
    return Loaded(cfg, weights, tokenizer, template, [])
