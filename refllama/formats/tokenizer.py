"""Tokenizers. A GGUF's embedded vocabulary is tokenized exactly as llama.cpp 0.3.36 tokenizes it (llama-vocab.cpp):
special tokens cut out first, then SentencePiece ("llama" model) or byte-pair encoding ("gpt2", "gemma4") with the
pre-tokenizer `tokenizer.ggml.pre` names (pretokenizer.py). An HF directory's tokenizer.json runs in `tokenizers`.
"""

import codecs
import heapq
import math
import re
import threading
from array import array
from bisect import bisect_left
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from ..errors import RefllamaError, shown
from .ggml_types import FLOATS, INTEGERS
from .ggml_types import GGUFValueType as V
from .pretokenizer import ADD_BOS, NEWLINES, PRE, compile_regexes, split
from .safety import check_regular, read_json, read_regular

# Texts llama.cpp's vocabulary loader recognises whatever type the file gives them: these end generation and are
# forced to control type (so matched in a text only when special tokens are parsed); so are the FIM roles' below.
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
              "<｜end▁of▁sentence｜>"}
_NORMAL_S_MARKERS = {"<|tool_response>", "<|plamo:eos|>"}  # one of these ends generation: "</s>" is normal (Gemma 4)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


# llama.cpp's token attributes (llama.h): a GGUF token type sets one; name rules below add others
A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER_DEFINED, A_BYTE = 1, 2, 4, 8, 16, 32
A_LSTRIP, A_RSTRIP = 128, 256
_ATTR_OF_TYPE = {UNKNOWN: A_UNKNOWN, UNUSED: A_UNUSED, NORMAL: A_NORMAL, CONTROL: A_CONTROL,
                 USER_DEFINED: A_USER_DEFINED, BYTE: A_BYTE}
_FIM_ROLES = {  # role: texts llama.cpp takes for that role's token when the file names none
    "fim_pre": {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"},
    "fim_suf": {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"},
    "fim_mid": {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"},
    "fim_pad": {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    "fim_rep": {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    "fim_sep": {"<|file_sep|>"},
}
_FIM_OLD_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}  # deprecated key names
_ALWAYS_RENDERED = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}  # gpt-oss: user-defined
_SPACE = " \t\n\v\f\r"  # C's isspace: what lstrip/rstrip remove beside a special token
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate: no UTF-8 for it


def _bytes_to_unicode():
    """GPT-2's map from each byte to a printable character (byte-level BPE spells bytes with these)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b if b in keep else next(extra)) for b in range(256)}


BYTE_CHAR = _bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def _vocabulary(g):
    """(model, tokens, types) of a GGUF's tokenizer fields, checked: equal lengths, known types, distinct tokens
    (llama.cpp asserts that too). An empty token is named "[EMPTY_<id>]", as llama.cpp names it."""
    model = g.string("tokenizer.ggml.model", required=True)
    tokens = g.array("tokenizer.ggml.tokens", (V.STRING,), "strings", required=True)
    if not tokens:
        raise RefllamaError(f"{g.path}: metadata field 'tokenizer.ggml.tokens' is empty")
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    types = g.array("tokenizer.ggml.token_type", INTEGERS, "integers") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise RefllamaError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    bad = next((i for i, t in enumerate(types) if not 0 <= t <= BYTE), None)
    if bad is not None:
        raise RefllamaError(f"{g.path}: token {bad} has unknown token type {types[bad]}")
    if len(set(tokens)) != len(tokens):
        seen = set()
        dup = next(i for i, t in enumerate(tokens) if t in seen or seen.add(t))
        raise RefllamaError(f"{g.path}: token {dup} {shown(tokens[dup])} appears twice in tokenizer.ggml.tokens")
    return model, tokens, types


class MergeRanks:
    """tokenizer.ggml.merges ("left right", split at the first space after the first character) as llama.cpp reads
    them: `rank(left, right)` is the pair's index, the first of a repeated pair kept. Pairs of tokens are kept as
    sorted int64 keys (left id << 32 | right id) beside their ranks, 12 bytes a merge (a dict of the pairs
    takes several times that); a pair naming text that is no token (none in a sound file) in a dict."""

    def __init__(self, merges, vocab):
        pairs, self.odd = {}, {}
        for n, m in enumerate(merges):
            cut = m.find(" ", 1)
            if cut > 0:
                a, b = vocab.get(m[:cut]), vocab.get(m[cut + 1:])
                if a is None or b is None:
                    self.odd.setdefault((m[:cut], m[cut + 1:]), n)
                else:
                    pairs.setdefault(a << 32 | b, n)
        self.keys, self.ranks = array("q", sorted(pairs)), array("q")
        self.ranks.extend(pairs[k] for k in self.keys)
        self.vocab = vocab

    def rank(self, left, right):
        a, b = self.vocab.get(left), self.vocab.get(right)
        if a is None or b is None:
            return self.odd.get((left, right)) if self.odd else None
        i = bisect_left(self.keys, a << 32 | b)
        return self.ranks[i] if i < len(self.keys) and self.keys[i] == a << 32 | b else None

    def pairs(self):  # (left id, right id) of the token pairs, by rank
        return [(k >> 32, k & 0xFFFFFFFF) for _, k in sorted(zip(self.ranks, self.keys, strict=True))]


def _attributes(g, tokens, types, vocab):
    """(attrs, end-of-generation ids): llama.cpp's attribute of each token and its eog set, with the rules its
    vocabulary loader applies by token text and model name (llama-vocab.cpp). Where a file names no token for a
    FIM role and several texts qualify, llama.cpp keeps the first its hash map yields; every one is taken here."""
    n = len(tokens)
    attrs = [_ATTR_OF_TYPE.get(t, 0) for t in types]
    ids = {k: g.token_id(f"tokenizer.ggml.{k}_token_id", n) for k in ("eos", "eot", "eom")}
    eog = {vocab[t] for t in _EOG_TEXTS & vocab.keys()}  # forced to control type below, as the FIM roles' tokens
    forced = set(eog)
    for role, texts in _FIM_ROLES.items():
        old = _FIM_OLD_KEYS.get(role)
        named = g.token_id(f"tokenizer.ggml.{role}_token_id", n)
        named = named if named is not None or old is None else g.token_id(f"tokenizer.ggml.{old}_token_id", n)
        found = {named} if named is not None else {vocab[t] for t in texts & vocab.keys()}
        forced |= found - {named}
        if role in ("fim_pad", "fim_rep", "fim_sep"):
            eog |= found
    for i in forced:
        attrs[i] |= A_CONTROL
    for t in _ALWAYS_RENDERED & vocab.keys():
        attrs[vocab[t]] = A_USER_DEFINED
    eog |= {i for i in ids.values() if i is not None}
    texts = {tokens[i]: i for i in eog}
    calls = texts.keys() & {"<|call|>", "<|calls|>"}
    if "<|end|>" in texts and calls and texts.keys() & {"<|return|>", "<|flush|>"}:
        eog.discard(texts["<|end|>"])  # o200k_harmony, solar-open: <|end|> ends a message, not the generation
        attrs[texts["<|end|>"]] = A_USER_DEFINED
    if "</s>" in texts and texts.keys() & _NORMAL_S_MARKERS:
        eog.discard(texts["</s>"])  # Gemma 4, PLaMo: "</s>" is a normal token
        attrs[texts["</s>"]] = A_NORMAL
    specials = [i for i, a in enumerate(attrs) if a & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)]
    name = g.string("general.name", "").lower()
    pre, arch = g.string("tokenizer.ggml.pre", ""), g.string("general.architecture", "")
    strip = {}
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        strip = {"<mask>": A_LSTRIP}
    elif "phi-3" in name or "phi3" in name:  # every special token, and </s>, eats the spaces after it
        for i in specials:
            attrs[i] |= A_RSTRIP
        strip = {"</s>": A_RSTRIP, "<unk>": -A_RSTRIP, "<s>": -A_RSTRIP, "<|endoftext|>": -A_RSTRIP}
    elif "modern-bert" in name:
        strip = {"[MASK]": A_LSTRIP}
    for text, bit in strip.items():
        if text in vocab:
            i = vocab[text]
            attrs[i] = attrs[i] | bit if bit > 0 else attrs[i] & ~-bit
    return attrs, frozenset(eog)


def from_gguf(g):
    """llama.cpp's tokenizer for the vocabulary embedded in an opened GGUFFile."""
    model, tokens, types = _vocabulary(g)
    n, vocab = len(tokens), {t: i for i, t in enumerate(tokens)}
    attrs, eog = _attributes(g, tokens, types, vocab)
    pre = g.string("tokenizer.ggml.pre", "default") or "default"
    if model == "llama":
        scores = g.array("tokenizer.ggml.scores", FLOATS + INTEGERS, "numbers", required=True)
        if len(scores) < n or not all(map(math.isfinite, scores)):
            raise RefllamaError(f"{g.path}: tokenizer.ggml.scores must be {n} finite numbers, one per token")
        algo = Spm([float(s) for s in scores])
        bos, eos, add_bos, space_prefix = 1, 2, True, True
    elif model in ("gpt2", "gemma4"):
        if model == "gemma4":
            regexes, ignore, byte_level, bos, eos, add_bos = NEWLINES, False, False, None, None, True
        elif pre in PRE:
            (regexes, ignore), byte_level, bos, eos, add_bos = PRE[pre], True, 11, 11, pre in ADD_BOS
        else:
            known = ", ".join(sorted(PRE))
            raise RefllamaError(f"{g.path}: unsupported tokenizer.ggml.pre {shown(pre)} (supported: {known})")
        merges = MergeRanks(g.array("tokenizer.ggml.merges", (V.STRING,), "strings", required=True), vocab)
        algo = Bpe(merges, regexes, ignore, byte_level, model == "gemma4")
        space_prefix = False
    else:
        raise RefllamaError(f"{g.path}: unsupported tokenizer.ggml.model {shown(model)} (supported: gpt2, llama, "
                            "gemma4)")
    bos = g.token_id("tokenizer.ggml.bos_token_id", n) if g.has("tokenizer.ggml.bos_token_id") else bos
    eos = g.token_id("tokenizer.ggml.eos_token_id", n) if g.has("tokenizer.ggml.eos_token_id") else eos
    bos, eos = (i if i is not None and i < n else None for i in (bos, eos))
    add_bos = g.flag("tokenizer.ggml.add_bos_token", add_bos) or model == "gemma4"
    return GgufTokenizer(tokens, vocab, attrs, algo, bos_id=bos, eos_id=eos, add_bos=add_bos,
                         add_eos=g.flag("tokenizer.ggml.add_eos_token", False),
                         space_prefix=g.flag("tokenizer.ggml.add_space_prefix", space_prefix), eog_ids=eog)


def _byte_token(vocab, b):
    """The token of byte b: "<0xXX>", else the byte as a one-character token (llama.cpp's byte_to_token)."""
    i = vocab.get(f"<0x{b:02X}>", vocab.get(chr(b)) if b < 0x80 else None)
    if i is None:
        raise RefllamaError(f"the vocabulary has no token for byte 0x{b:02X} (neither <0x{b:02X}> nor the byte)")
    return i


def merge_pairs(sym, priority, same_text):
    """The symbols left when adjacent pairs are merged lowest `priority(left, right)` first, leftmost on ties, until
    no pair has one (None): llama.cpp's bigram queue over a linked list. A queued pair whose symbols have changed
    since is skipped: its BPE compares their text (`same_text`), its SentencePiece only their length."""
    prev, nxt = list(range(-1, len(sym) - 1)), [*range(1, len(sym)), -1]  # merged-away symbols become ""
    heap = []

    def push(left, right):
        if left >= 0 and right >= 0 and (p := priority(sym[left], sym[right])) is not None:
            heapq.heappush(heap, (p, left, right, sym[left] + sym[right]))

    for i in range(1, len(sym)):
        push(i - 1, i)
    while heap:
        _, left, right, text = heapq.heappop(heap)
        a, b = sym[left], sym[right]
        if not a or not b or (a + b != text if same_text else len(a) + len(b) != len(text)):
            continue
        sym[left], sym[right] = a + b, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    return [x for x in sym if x]


class Spm:
    """SentencePiece as llama.cpp runs it (llm_tokenizer_spm): merge the adjacent pair whose merged text is the
    best-scoring token, leftmost first on equal scores; pieces that are no token become byte tokens.
    By hand, not `tokenizers`: its merge ranks break ties by token id, llama.cpp by position."""

    def __init__(self, scores):
        self.scores = scores

    def __call__(self, text, vocab):
        def priority(left, right):
            i = vocab.get(left + right)
            return None if i is None else -self.scores[i]

        sym = merge_pairs(list(text), priority, same_text=False)
        out = []
        for s in sym:
            i = vocab.get(s)
            out += [i] if i is not None else [_byte_token(vocab, b) for b in s.encode()]
        return out


class Bpe:
    """Byte-pair encoding as llama.cpp runs it (llm_tokenizer_bpe): the pre-tokenizer's words, each merged pair by
    pair, lowest merge rank first (leftmost on ties); a piece that is no token falls back to its bytes' tokens.
    By hand, not `tokenizers`: that keeps the last of a repeated merge and drops unknown characters."""

    def __init__(self, ranks, exprs, ignore_merges, byte_level, gemma4):
        self.ranks, self.exprs, self.regexes = ranks, exprs, compile_regexes(exprs)
        self.ignore_merges = ignore_merges
        self.byte_level, self.gemma4 = byte_level, gemma4
        self.cache = {}

    def __call__(self, text, vocab):
        out = []
        for word in split(text, self.regexes):
            if self.byte_level:
                word = "".join(BYTE_CHAR[b] for b in word.encode())
            ids = self.cache.get(word)
            if ids is None:
                ids = self.word(word, vocab)
                if len(self.cache) > 100_000:
                    self.cache.clear()
                self.cache[word] = ids
            out += ids
        return out

    def word(self, word, vocab):
        if word in vocab and (self.ignore_merges or (self.gemma4 and not word.strip("\n"))):
            return [vocab[word]]
        sym = merge_pairs(list(word), self.ranks.rank, same_text=True)
        out = []
        for s in sym:
            if s in vocab:
                out.append(vocab[s])
            else:  # each byte of the piece's text as a token, where one exists (llama.cpp drops the others)
                keys = (chr(b) if b < 0x80 else None for b in s.encode()) if self.byte_level else (
                    f"<0x{b:02X}>" for b in s.encode())
                out += [vocab[k] for k in keys if k in vocab]
        return out


class GgufTokenizer:
    """Text <-> token ids exactly as llama.cpp's llama_tokenize / llama_token_to_piece do them."""

    def __init__(self, tokens, vocab, attrs, algo, bos_id, eos_id, add_bos, add_eos, space_prefix, eog_ids):
        self.tokens, self.vocab, self.attrs, self.algo = tokens, vocab, attrs, algo
        self.bos_id, self.eos_id, self.eog_ids = bos_id, eos_id, eog_ids
        self.add_bos, self.add_eos = add_bos and bos_id is not None, add_eos and eos_id is not None
        self.space_prefix = space_prefix  # SentencePiece: a space before text that follows a special token
        self.vocab_size = len(tokens)
        # matched whole before the text is tokenized: longest text first (llama.cpp sorts by length, unstably)
        special = [i for i, a in enumerate(attrs) if a & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)]
        self.specials = sorted(special, key=lambda i: -len(tokens[i].encode()))
        self.lock = threading.Lock()  # the BPE word cache is shared by the server's threads

    def encode(self, text, add_special=True, parse_special=False):
        """Token ids; `parse_special` matches control-token text such as '<|im_start|>' as one token."""
        if bad := _SURROGATE.search(text):
            raise RefllamaError(f"text is not valid Unicode: a lone surrogate at character {bad.start()}")
        ids = [self.bos_id] if add_special and self.add_bos else []
        after_special = True
        with self.lock:
            for piece in self.partition(text, parse_special):
                if isinstance(piece, int):
                    ids.append(piece)
                    after_special = True
                    continue
                if isinstance(self.algo, Spm):
                    piece = (" " if self.space_prefix and after_special else "") + piece
                    ids += self.algo(piece.replace(" ", "▁"), self.vocab)
                else:
                    ids += self.algo(piece.replace(" ", "▁") if self.algo.gemma4 else piece, self.vocab)
                after_special = False
        return ids + [self.eos_id] if add_special and self.add_eos else ids

    def partition(self, text, parse_special):
        """The text cut at each special token's text (longest first), into strings and token ids. Without
        `parse_special` only user-defined tokens are cut out; lstrip/rstrip tokens take the spaces beside them."""
        pieces = [text]
        for i in self.specials:
            t, attr = self.tokens[i], self.attrs[i]
            if (not parse_special and attr & (A_CONTROL | A_UNKNOWN)) or t not in text:
                continue
            out = []
            for p in pieces:
                at = 0
                while isinstance(p, str) and (hit := p.find(t, at)) >= 0:
                    left = p[at:hit].rstrip(_SPACE) if attr & A_LSTRIP else p[at:hit]
                    out += [left, i] if left else [i]
                    at = hit + len(t)
                    if attr & A_RSTRIP:
                        at = len(p) - len(p[at:].lstrip(_SPACE))
                out += [p[at:]] if isinstance(p, str) and p[at:] else [] if isinstance(p, str) else [p]
            pieces = out
        return [p for p in pieces if p != ""]

    def piece(self, i):
        """Token i's bytes (llama_token_to_piece with special tokens rendered)."""
        t, attr = self.tokens[i], self.attrs[i]
        if attr & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            return t.encode()
        if attr & A_NORMAL:
            if isinstance(self.algo, Spm) or self.algo.gemma4:
                return t.replace("▁", " ").encode()
            return b"".join(bytes([CHAR_BYTE[c]]) if c in CHAR_BYTE else c.encode() for c in t)
        if attr & A_BYTE and len(t) == 6 and t.startswith("<0x"):
            return bytes([int(t[3:5], 16)])
        return b""

    def decode(self, ids):
        """Text of the ids; SentencePiece's space prefix is dropped from the first token, as llama.cpp does."""
        self.check_ids(ids)
        data = b"".join(self.piece(int(i)) for i in ids)
        if self.space_prefix and len(ids) and data[:1] == b" " and self.piece(int(ids[0]))[:1] == b" ":
            data = data[1:]
        return data.decode("utf-8", "replace")

    def token_text(self, i):
        return self.tokens[int(i)]

    def check_ids(self, ids):
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise RefllamaError(f"token id {int(i)} is out of range for a vocabulary of {self.vocab_size}")

    def stream(self):
        """A fresh streaming decoder: feed ids one at a time, get text that never splits a UTF-8 character."""
        return ByteStream(self)


class ByteStream:
    """Incremental detokenizer: token bytes through an incremental UTF-8 decoder (`step(id)` returns new text)."""

    def __init__(self, tok):
        self.tok, self.first = tok, True
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def step(self, token_id):
        self.tok.check_ids([token_id])
        data = self.tok.piece(int(token_id))
        if self.first and self.tok.space_prefix and data[:1] == b" ":
            data = data[1:]
        self.first = False
        return self.utf8.decode(data)


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
