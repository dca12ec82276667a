"""Tokenizer: a `tokenizers.Tokenizer` built from a GGUF's embedded vocabulary, with llama.cpp's rules.

Byte-level BPE ("gpt2" model) takes the pre-tokenizer that `tokenizer.ggml.pre` names; SentencePiece
("llama" model) becomes BPE with merges ranked by score and byte fallback, as llama.cpp tokenizes it.
"""

import math
import threading
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from .errors import RefllamaError, shown
from .safety import check_regular, read_json, read_regular

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), grouped by the `tokenizer.ggml.pre` names using each
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = ("gpt-2", "gpt2", "jais", "roberta-bpe")
_DIGITS_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva")
_REGEX = {**dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), _LLAMA3),
          **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2)}
# Texts llama.cpp's vocabulary loader (llama-vocab.cpp) recognises whatever type the file gives them: each is forced to
# control type (so matched in a text only when special tokens are parsed), and those of _EOG_TEXTS and the FIM pad,
# repo and file-separator tokens end generation. (llama.cpp keeps the first FIM token of each role it meets: for a
# vocabulary with two candidates of one role, refllama's end-of-generation set would hold both.)
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
              "<｜end▁of▁sentence｜>"}
_FIM_EOG_TEXTS = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
                  "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}
_FIM_TEXTS = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
              "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
              "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
              "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"}
_NORMAL_S_MARKERS = {"<|tool_response>", "<|plamo:eos|>"}  # one of these ends generation: "</s>" is normal (Gemma 4)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
STRING, INTEGERS, FLOATS = 8, (0, 1, 2, 3, 4, 5, 10, 11), (6, 12)  # GGUF value types


def _byte_level_pre_tokenizer(pre, path):
    if pre in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_GPT2:  # each digit alone, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in _REGEX:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_REGEX[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    known = ", ".join(sorted((*_GPT2, *_DIGITS_GPT2, *_REGEX)))
    raise RefllamaError(f"{path}: unsupported tokenizer.ggml.pre {shown(pre)} (supported: {known})")


def _spm_merges(tokens, scores):
    """BPE merges for a SentencePiece vocabulary: every split of a piece into two pieces, best score first."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                merges.append((score, ids[left], ids[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [(left, right) for _, _, _, left, right in merges]


def _vocabulary(g):
    """(model, tokens, types, vocab) of a GGUF's tokenizer fields, checked: equal lengths, known types, distinct
    tokens (llama.cpp asserts that too)."""
    model = g.string("tokenizer.ggml.model", required=True)
    tokens = g.array("tokenizer.ggml.tokens", (STRING,), "strings", required=True)
    if not tokens:
        raise RefllamaError(f"{g.path}: metadata field 'tokenizer.ggml.tokens' is empty")
    types = g.array("tokenizer.ggml.token_type", INTEGERS, "integers") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise RefllamaError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    bad = next((i for i, t in enumerate(types) if not 0 <= t <= BYTE), None)
    if bad is not None:
        raise RefllamaError(f"{g.path}: token {bad} has unknown token type {types[bad]}")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        seen = set()
        dup = next(i for i, t in enumerate(tokens) if t in seen or seen.add(t))
        raise RefllamaError(f"{g.path}: token {dup} {shown(tokens[dup])} appears twice in tokenizer.ggml.tokens")
    return model, tokens, types, vocab


def _bpe_merges(g, vocab):
    """tokenizer.ggml.merges as pairs, split at the first space after the first character as llama.cpp splits
    them; a merge of tokens the vocabulary lacks is a corrupt file."""
    merges = []
    for n, m in enumerate(g.array("tokenizer.ggml.merges", (STRING,), "strings", required=True)):
        cut = m.find(" ", 1)
        pair = (m[:cut], m[cut + 1:])
        if cut < 0 or not all(p in vocab for p in (*pair, pair[0] + pair[1])):
            raise RefllamaError(f"{g.path}: tokenizer.ggml.merges[{n}] {shown(m)} does not merge two tokens of "
                                "the vocabulary into a third")
        merges.append(pair)
    return merges


def from_gguf(g):
    """Tokenizer for the vocabulary embedded in an opened GGUFFile; a vocabulary that tokenizers cannot build
    is reported as the file's."""
    model, tokens, types, vocab = _vocabulary(g)
    n = len(tokens)
    roles = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")
    named = {vocab[t] for t in (_EOG_TEXTS | _FIM_EOG_TEXTS) & vocab.keys()}  # end generation by their text
    eog = named | {g.token_id(f"tokenizer.ggml.{k}_token_id", n) for k in roles} - {None}
    if "</s>" in vocab and {tokens[i] for i in eog} & _NORMAL_S_MARKERS:
        named.discard(vocab["</s>"])
        eog.discard(vocab["</s>"])
    forced = named | {vocab[t] for t in _FIM_TEXTS & vocab.keys()}
    types = [CONTROL if i in forced else t for i, t in enumerate(types)]
    try:
        if model == "gpt2":
            pre = g.string("tokenizer.ggml.pre", "default")
            tok = HFTokenizer(BPE(vocab, _bpe_merges(g, vocab), ignore_merges=_REGEX.get(pre) is _LLAMA3))
            tok.pre_tokenizer = _byte_level_pre_tokenizer(pre, g.path)
            tok.decoder = decoders.ByteLevel()
            add_bos_default = pre in _REGEX and _REGEX[pre] is _LLAMA3
        elif model == "llama":
            scores = g.array("tokenizer.ggml.scores", FLOATS, "floats", required=True)
            if len(scores) != n or not all(map(math.isfinite, scores)):
                raise RefllamaError(f"{g.path}: tokenizer.ggml.scores must be {n} finite numbers, one per token")
            unk = tokens[g.integer("tokenizer.ggml.unknown_token_id", 0, low=0, high=n - 1)]
            tok = HFTokenizer(BPE(vocab, _spm_merges(tokens, scores), unk_token=unk, byte_fallback=True,
                                  fuse_unk=True))
            space_prefix = g.flag("tokenizer.ggml.add_space_prefix", True)
            steps = [normalizers.Prepend("▁")] if space_prefix else []
            tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
            dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
            tok.decoder = decoders.Sequence([*dec, decoders.Strip(" ", 1, 0)] if space_prefix else dec)
            add_bos_default = True
        else:
            raise RefllamaError(f"{g.path}: unsupported tokenizer.ggml.model {shown(model)} (supported: gpt2, llama)")
        # control and user-defined tokens are matched whole in the text, as llama.cpp does
        tok.add_tokens([AddedToken(tokens[i], special=(t == CONTROL), normalized=False)
                        for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)])
    except (RefllamaError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # tokenizers' Exception, or on a Rust panic pyo3's PanicException (a BaseException)
        raise RefllamaError(f"{g.path}: corrupt vocabulary ({shown(str(e), 120)})") from None
    return Tokenizer(
        tok,
        bos_id=g.token_id("tokenizer.ggml.bos_token_id", n),
        eos_id=g.token_id("tokenizer.ggml.eos_token_id", n),
        add_bos=g.flag("tokenizer.ggml.add_bos_token", add_bos_default),
        add_eos=g.flag("tokenizer.ggml.add_eos_token", False),
        eog_ids=frozenset(eog),
    )


class Tokenizer:
    """Text <-> token ids with llama.cpp's conventions for BOS/EOS and special-token parsing."""

    def __init__(self, tok, bos_id, eos_id, add_bos, add_eos, eog_ids, post_processor=False):
        self.tok, self.lock = tok, threading.Lock()
        self.post_processor = post_processor  # tokenizer.json's own template adds special tokens
        self.bos_id, self.eos_id = bos_id, eos_id
        self.add_bos = add_bos and bos_id is not None
        self.add_eos = add_eos and eos_id is not None
        self.eog_ids = eog_ids  # generation ends at any of these
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text, add_special=True, parse_special=False):
        """Token ids; `parse_special` matches control-token text such as '<|im_start|>' as one token."""
        with self.lock:  # the flag below is the tokenizer's state: the server tokenizes on more than one thread
            self.tok.encode_special_tokens = not parse_special
            ids = self.tok.encode(text, add_special_tokens=add_special and self.post_processor).ids
        # llama.cpp adds BOS/EOS whatever the text holds; a tokenizer.json template may have added them already
        if add_special and self.add_bos and not (self.post_processor and ids[:1] == [self.bos_id]):
            ids = [self.bos_id] + ids
        if add_special and self.add_eos and not (self.post_processor and ids[-1:] == [self.eos_id]):
            ids = ids + [self.eos_id]
        return ids

    def decode(self, ids):
        self.check_ids(ids)
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_text(self, i):
        return self.tok.id_to_token(int(i))

    def check_ids(self, ids):
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise RefllamaError(f"token id {int(i)} is out of range for a vocabulary of {self.vocab_size}")

    def stream(self):
        """A fresh streaming decoder: feed ids one at a time, get text that never splits a UTF-8 character."""
        return TextStream(self.tok)


class TextStream:
    """Incremental detokenizer around tokenizers' DecodeStream: `step(id)` returns the new text ('' if none yet)."""

    def __init__(self, tok):
        self.tok = tok
        self.ds = decoders.DecodeStream(skip_special_tokens=False)

    def step(self, token_id):
        return self.ds.step(self.tok, int(token_id)) or ""


def _token_content(conf, name, path):
    """A special token in tokenizer_config.json: a string, {"content": "..."} or null."""
    value = conf.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise RefllamaError(f"{path}: field '{name}' must be a string or {{\"content\": string}}, got {shown(value)}")
    return value


def _chat_template(conf, path):
    """tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}] (the "default" one)."""
    template = conf.get("chat_template")
    if isinstance(template, list):
        if not all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template):
            raise RefllamaError(f"{path}: field 'chat_template' must be a string or a list of "
                                '{"name": ..., "template": string}')
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is not None and not isinstance(template, str):
        raise RefllamaError(f"{path}: field 'chat_template' must be a string, got {shown(template)}")
    return template


def from_hf_dir(directory, eos_ids=()):
    """(Tokenizer or None, chat template or None) from tokenizer.json, tokenizer_config.json and
    chat_template.jinja; `eos_ids` (from config.json and generation_config.json) end generation too."""
    d = Path(directory)
    conf_path = d / "tokenizer_config.json"
    conf = read_json(conf_path) if conf_path.exists() else {}
    template = _chat_template(conf, conf_path)
    if (d / "chat_template.jinja").exists():
        raw = read_regular(d / "chat_template.jinja", limit=1 << 20)
        try:
            template = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RefllamaError(f"{d / 'chat_template.jinja'}: not UTF-8 text ({e})") from None
    if not (d / "tokenizer.json").exists():
        return None, template
    check_regular(d / "tokenizer.json")
    try:
        tok = HFTokenizer.from_file(str(d / "tokenizer.json"))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # tokenizers' own Exception type, or pyo3's PanicException on a Rust panic
        raise RefllamaError(f"{d / 'tokenizer.json'}: cannot load ({shown(str(e), 120)})") from None
    ids = {name: tok.token_to_id(_token_content(conf, name, conf_path) or "") for name in ("bos_token", "eos_token")}
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    eog = {i for i in (*eos_ids, ids["eos_token"]) if i is not None}
    eog |= {tok.token_to_id(t) for t in specials & _EOG_TEXTS}
    flags = {k: conf.get(k, False) for k in ("add_bos_token", "add_eos_token")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise RefllamaError(f"{conf_path}: field '{k}' must be true or false, got {shown(v)}")
    return Tokenizer(tok, ids["bos_token"], ids["eos_token"], flags["add_bos_token"], flags["add_eos_token"],
                     frozenset(eog), post_processor=True), template
