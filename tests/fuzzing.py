"""Seeded mutators for hostile-input fuzzing: GGUF files, HF model directories, chat templates and server requests,
each mutant with a one-line description. tests/test_fuzz.py runs a budget of them; tools/fuzz.py runs thousands.

Every mutant must end in one of three ways: a clean load (and forward pass) of a file that is still valid, a
RefllamaError whose message is one line, or, for templates, rendered text. Anything else is a bug.
"""

import json
import math
import os
import shutil
import struct
from pathlib import Path

import numpy as np

import refllama
from refllama.formats.chat import render

# GGUF value types and their struct formats
FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
INTS = [0, 1, -1, 2, 3, 7, 255, 2 ** 16, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 62, 2 ** 63 - 1, -2 ** 63]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-45, 5e-324, 1e38, 3.4e38, 1e300, 0.5]
STRINGS = ["", "x" * 300, "llama", "gpt2", "qwen2", "phi3", "none", "linear", "line\nbreak\x1b[31m", "\x00",
           "<|im_end|>", "Ġ", "a b", "\u2028"]


def _range(vtype):
    fmt = FORMATS[vtype]
    if fmt[1] in "fd?":
        return None
    bits = struct.calcsize(fmt) * 8
    return (0, 2 ** bits - 1) if fmt[1].isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


class GGUF:
    """A GGUF file taken apart: metadata [key, vtype, value, item type], tensors [name, dims, type, offset], the
    data section; `write()` puts it back together. Overrides let a mutant lie about counts."""

    def __init__(self, buf):
        self.pos, self.buf = 0, buf
        assert self.take(4) == b"GGUF"
        self.version, n_tensors, n_kv = self.scalar(4), self.scalar(10), self.scalar(10)
        self.kv = []
        for _ in range(n_kv):
            key, vtype = self.string(), self.scalar(4)
            if vtype == ARRAY:
                item, n = self.scalar(4), self.scalar(10)
                self.kv.append([key, ARRAY, [self.value(item) for _ in range(n)], item])
            else:
                self.kv.append([key, vtype, self.value(vtype), None])
        self.tensors = []
        for _ in range(n_tensors):
            name, n_dims = self.string(), self.scalar(4)
            dims = [self.scalar(10) for _ in range(n_dims)]
            self.tensors.append([name, dims, self.scalar(4), self.scalar(10), None])
        align = next((v for k, t, v, _ in self.kv if k == "general.alignment"), 32)
        self.data = buf[(self.pos + align - 1) // align * align:]
        self.data_start = len(buf) - len(self.data)
        self.counts = None  # (n_tensors, n_kv) written instead of the real ones
        del self.buf, self.pos

    def take(self, n):
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype):
        fmt = FORMATS[vtype]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.scalar(10)).decode("utf-8", "surrogateescape")

    def value(self, vtype):
        return self.string() if vtype == STRING else self.scalar(vtype)

    @staticmethod
    def pack(vtype, v):
        if vtype == STRING:
            b = v.encode("utf-8", "surrogateescape")
            return struct.pack("<Q", len(b)) + b
        if FORMATS[vtype] == "<f":
            with np.errstate(over="ignore"):
                return np.array(v, dtype="<f4").tobytes()
        if _range(vtype):
            lo, hi = _range(vtype)
            v = min(max(int(v), lo), hi)
        return struct.pack(FORMATS[vtype], v)

    def write(self, path, sparse_to=None):
        """Write the file, return its header's length; `sparse_to`: a hole of this size instead of the data."""
        out = [b"GGUF", struct.pack("<I", self.version)]
        n_tensors, n_kv = self.counts or (len(self.tensors), len(self.kv))
        out.append(struct.pack("<QQ", n_tensors, n_kv))
        for key, vtype, value, item in self.kv:
            out += [self.pack(STRING, key), struct.pack("<I", vtype)]
            if vtype == ARRAY:
                out.append(struct.pack("<IQ", item, len(value)))
                out += [self.pack(item, x) for x in value]
            else:
                out.append(self.pack(vtype, value))
        for name, dims, ttype, offset, n_dims in self.tensors:
            out += [self.pack(STRING, name), struct.pack("<I", len(dims) if n_dims is None else n_dims)]
            out += [struct.pack("<Q", d) for d in dims] + [struct.pack("<IQ", ttype, offset)]
        head = b"".join(out)
        align = next((v for k, t, v, _ in self.kv if k == "general.alignment" and t == 4), 32) or 32
        head += bytes(-len(head) % align if align < 1 << 20 else 0)
        with open(path, "wb") as f:
            f.write(head)
            if sparse_to is None:
                f.write(self.data)
            else:
                f.truncate(len(head) + sparse_to)
        return len(head)


def _any_value(rng):
    """(vtype, value, item type) of a random value of a random type."""
    kind = rng.integers(5)
    if kind == 0:
        vtype = int(pick(rng, [0, 1, 2, 3, 4, 5, 10, 11]))
        lo, hi = _range(vtype)
        v = int(pick(rng, INTS))
        return vtype, min(max(v, lo), hi), None
    if kind == 1:
        return int(pick(rng, [6, 12])), float(pick(rng, FLOATS)), None
    if kind == 2:
        return STRING, str(pick(rng, STRINGS)), None
    if kind == 3:
        return 7, bool(rng.integers(2)), None
    item = int(pick(rng, [4, 5, 6, STRING]))
    n = int(pick(rng, [0, 1, 3, 300]))
    values = [str(pick(rng, STRINGS)) for _ in range(n)] if item == STRING else (
        [float(pick(rng, FLOATS)) for _ in range(n)] if item == 6 else [int(rng.integers(0, 100)) for _ in range(n)])
    return ARRAY, values, item


def _same_type_value(rng, vtype, value, item):
    """A hostile value of the field's own type (a count of 0, a huge one, NaN, an id out of range...)."""
    if vtype == ARRAY:
        value = list(value)
        op = rng.integers(4)
        if op == 0 and value:
            del value[int(rng.integers(len(value)))]
        elif op == 1:
            value.append(value[-1] if value else "" if item == STRING else 0)
        elif op == 2 and value and item == STRING:
            i = int(rng.integers(len(value)))
            s = value[i]
            j = int(rng.integers(len(s) + 1))
            value[i] = s[:j] + chr(int(rng.integers(32, 0x2000))) + s[j + 1:]
        elif value and item != STRING:
            i = int(rng.integers(len(value)))
            value[i] = float(pick(rng, FLOATS)) if item in (6, 12) else int(pick(rng, [0, -1, 7, 200, 2 ** 31 - 1]))
            if _range(item):
                lo, hi = _range(item)
                value[i] = int(min(max(value[i], lo), hi)) if not isinstance(value[i], float) else value[i]
        return value
    if vtype == STRING:
        return str(pick(rng, STRINGS))
    if vtype in (6, 12):
        return float(pick(rng, FLOATS))
    if vtype == 7:
        return not value
    lo, hi = _range(vtype)
    return int(min(max(int(pick(rng, INTS + [value + 1, value - 1, value * 2])), lo), hi))


def mutate_gguf(g, rng):
    """Apply one random mutation to GGUF g in place; returns its description."""
    op = int(rng.integers(12))
    if op in (0, 1) and g.kv:  # a field gets a hostile value of its own type, or another type
        kv = g.kv[int(rng.integers(len(g.kv)))]
        if op == 0:
            kv[2] = _same_type_value(rng, kv[1], kv[2], kv[3])
            return f"field {kv[0]} = {str(kv[2])[:60]!r}"
        kv[1], kv[2], kv[3] = _any_value(rng)
        return f"field {kv[0]} retyped {kv[1]}/{kv[3]} = {str(kv[2])[:60]!r}"
    if op == 2 and g.kv:
        i = int(rng.integers(len(g.kv)))
        if rng.integers(2):
            key = g.kv.pop(i)[0]
            return f"field {key} deleted"
        g.kv.insert(i, list(g.kv[i]))
        return f"field {g.kv[i][0]} duplicated"
    if op == 3:  # a metadata field llama.cpp reads, set to a hostile number
        arch = next((v for k, t, v, _ in g.kv if k == "general.architecture"), "llama")
        key = str(pick(rng, [f"{arch}.{k}" for k in (
            "attention.head_count", "attention.head_count_kv", "block_count", "embedding_length", "context_length",
            "rope.dimension_count", "rope.freq_base", "attention.layer_norm_rms_epsilon", "feed_forward_length",
            "attention.key_length", "vocab_size", "rope.scaling.factor", "attention.sliding_window")] + [
            "general.alignment", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id"]))
        vtype, value = (int(pick(rng, [4, 5, 10])), int(pick(rng, [0, 1, 3, 7, 64, 2 ** 31 - 1]))) \
            if rng.integers(2) else (6, float(pick(rng, FLOATS)))
        g.kv = [kv for kv in g.kv if kv[0] != key] + [[key, vtype, value, None]]
        return f"field {key} = {value!r}"
    if op in (4, 5, 6, 7) and g.tensors:
        t = g.tensors[int(rng.integers(len(g.tensors)))]
        if op == 4:
            t[4] = int(pick(rng, [0, 5, 8, 2 ** 16, 2 ** 31, 2 ** 32 - 1])) if rng.integers(2) else len(t[1]) ^ (
                1 << int(rng.integers(32)))
            return f"tensor {t[0]} n_dims = {t[4]}"
        if op == 5:
            i = int(rng.integers(len(t[1])))
            t[1][i] = int(pick(rng, [0, 1, 2, 3, 255, 257, 2 ** 31, 2 ** 40, 2 ** 63 - 1, 2 ** 64 - 1]))
            return f"tensor {t[0]} dims = {t[1]}"
        if op == 6:
            t[2] = int(pick(rng, [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 30, 39, 40, 1000]))
            return f"tensor {t[0]} type = {t[2]}"
        t[3] = int(pick(rng, [0, 1, 16, 31, 32, t[3] + 1, t[3] + 32, max(t[3] - 32, 0), 2 ** 40, 2 ** 64 - 1]))
        return f"tensor {t[0]} offset = {t[3]}"
    if op == 8 and g.tensors:
        i = int(rng.integers(len(g.tensors)))
        if rng.integers(2):
            g.tensors.insert(i, [*g.tensors[i][:4], None])
            return f"tensor {g.tensors[i][0]} duplicated"
        old = g.tensors[i][0]
        g.tensors[i][0] = old[:-1] + "x" if rng.integers(2) else "x" * 100
        return f"tensor {old} renamed"
    if op == 9:
        n_tensors, n_kv = len(g.tensors), len(g.kv)
        g.counts = (n_tensors + int(pick(rng, [-1, 1, 2 ** 40])), n_kv) if rng.integers(2) else (
            n_tensors, n_kv + int(pick(rng, [-1, 1, 2 ** 40])))
        return f"counts = {g.counts}"
    if op == 10:  # a vocabulary inconsistency
        i = next((i for i, kv in enumerate(g.kv) if kv[0] == "tokenizer.ggml.token_type" and kv[1] == ARRAY
                  and kv[3] != STRING), None)  # an earlier mutation may have made it an array of strings
        if i is not None:
            g.kv[i][2] = g.kv[i][2] + [1] * int(rng.integers(1, 4))
            return "token_type longer than tokens"
    if op == 11:
        key = str(pick(rng, ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"]))
        kv = next((kv for kv in g.kv if kv[0] == key and kv[1] == ARRAY and kv[3] == STRING), None)
        if kv and kv[2]:
            i = int(rng.integers(len(kv[2])))
            s = kv[2][i]
            kv[2] = list(kv[2])
            kv[2][i] = (s[:-1] + "\x01") if s else "\x01"
            return f"{key}[{i}] corrupted"
    return "no change"


def gguf_mutant(source, path, rng, sparse=False):
    """Write a mutant of GGUF file `source` to `path`: one or two structural mutations, or raw damage (bit flips in
    the header, a truncation); returns its description. `sparse`: the data section is a hole of the same size, for
    big files whose header is what is being fuzzed."""
    g = GGUF(_head(source) if sparse else Path(source).read_bytes())
    hole = os.path.getsize(source) - g.data_start if sparse else None
    if rng.integers(4):
        what = "; ".join(mutate_gguf(g, rng) for _ in range(int(rng.integers(1, 3))))
        g.write(path, sparse_to=hole)
        return what
    head = g.write(path, sparse_to=hole)
    with open(path, "r+b") as f:
        if rng.integers(3):
            header = bytearray(f.read(head))
            for _ in range(int(rng.integers(1, 4))):
                header[int(rng.integers(8, head))] ^= 1 << int(rng.integers(8))
            f.seek(0)
            f.write(header)
            return "bit flips in the header"
        cut = int(rng.integers(0, os.path.getsize(path)))
        f.truncate(cut)
        return f"truncated at byte {cut}"


def _head(path, limit=8 << 20):
    """The first bytes of a big GGUF file, enough for its header (the default model's is about 3 MB)."""
    with open(path, "rb") as f:
        return f.read(limit)


def check_error(e):
    msg = str(e)
    assert "\n" not in msg and "\x1b" not in msg and "\r" not in msg, f"message not one line: {msg!r}"
    return "refused"


def load_outcome(path, tokens=(1, 2, 3)):
    """'loaded' (and ran two greedy steps) or 'refused' (a one-line RefllamaError); anything else raises."""
    try:
        m = refllama.load(path)
        ids = [t % m.config.vocab_size for t in tokens]
        list(m.generate(ids, max_tokens=2, temperature=0))
        if m.tokenizer is not None:
            m.tokenize("Hello world")
        return "loaded"
    except refllama.RefllamaError as e:
        return check_error(e)


def header_outcome(path):
    """What loading does with a GGUF file's header alone (metadata, config, vocabulary), for big files."""
    from refllama import arch as archs
    from refllama.formats.gguf_loader import GGUFFile
    from refllama.formats.tokenizer import from_gguf

    try:
        g = GGUFFile(path)
        archs.for_gguf(g.string("general.architecture", required=True), g.path).config_from_gguf(g)
        from_gguf(g).encode("Hello world")
        return "loaded"
    except refllama.RefllamaError as e:
        return check_error(e)


# ---------------------------------------------------------------- HF directories

CONFIG_VALUES = [None, 0, -1, 1, 2 ** 31, 10 ** 30, 0.5, "x", "linear", [], [1, 2, 3], {}, {"rope_type": "linear"},
                 {"rope_type": "llama3", "factor": 8.0}, {"rope_type": "longrope", "short_factor": [1.0]}, True, False]


def hf_mutant(source, d, rng):
    """Copy HF directory `source` to `d` and damage it once; returns the description."""
    shutil.copytree(source, d)
    op = int(rng.integers(10))
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if op in (0, 1):
        key = str(pick(rng, sorted(cfg) + ["rope_scaling", "rope_parameters", "head_dim", "partial_rotary_factor",
                                           "tie_word_embeddings"]))
        value = CONFIG_VALUES[int(rng.integers(len(CONFIG_VALUES)))]
        cfg[key] = value
        if op == 1 and isinstance(cfg.get("rope_parameters"), dict):
            cfg["rope_parameters"]["rope_type"] = str(pick(rng, ["linear", "llama3", "longrope", "yarn", 3]))
        cfg_path.write_text(json.dumps(cfg))
        return f"config {key} = {value!r}"
    if op == 2:
        text = str(pick(rng, ['[]', '"x"', '1', '{"a": NaN}', "[" * 5000 + "]" * 5000, '{"x": ' + "9" * 5000 + '}',
                               '{"vocab_size": 1e999}', "{", "\xff\xfe"]))
        cfg_path.write_text(text, encoding="utf-8", errors="surrogateescape")
        return f"config.json = {text[:40]!r}"
    st = d / "model.safetensors"
    raw = bytearray(st.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    if op in (3, 4):
        name = str(pick(rng, [k for k in header if k != "__metadata__"]))
        e = header[name]
        field = str(pick(rng, ["data_offsets", "dtype", "shape"]))
        e[field] = {"data_offsets": [None, [0], [0, 1, 2], [e["data_offsets"][1], e["data_offsets"][0]],
                                     [e["data_offsets"][0] + 1, e["data_offsets"][1] + 1], "x"],
                    "dtype": ["F64", "I8", "BOOL", 1, "Q4"],
                    "shape": [[], [0], [2 ** 40], [-1, 4], "x", [e["shape"][-1]] + e["shape"][:-1]]}[field][
            int(rng.integers(5))]
        body = json.dumps(header).encode()
        raw = struct.pack("<Q", len(body)) + body + raw[8 + n:]
        st.write_bytes(raw)
        return f"safetensors {name}.{field} = {e[field]!r}"
    if op == 5:
        delta = int(pick(rng, [-1, 1, -8, 8, 2 ** 40]))
        st.write_bytes(struct.pack("<Q", max(n + delta, 0)) + raw[8:])
        return f"safetensors header length {delta:+d}"
    if op == 6:
        body = str(pick(rng, ['[]', '"x"', '{"a": 1}', '{"__metadata__": {"a": 1}}', "{" * 3000])).encode()
        st.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
        return f"safetensors header = {body[:30]!r}"
    if op == 7:  # a shard index naming files it must not
        names = [k for k in header if k != "__metadata__"]
        target = str(pick(rng, ["../outside.safetensors", "/etc/passwd", "sub/../../x", "fifo", "dir", "link",
                                 "missing.safetensors", "model.safetensors", "loop"]))
        (d / "fifo").exists() or os.mkfifo(d / "fifo")
        (d / "loop").is_symlink() or os.symlink("loop", d / "loop")  # a link to itself
        (d / "dir").mkdir(exist_ok=True)
        (d / "link").exists() or os.symlink(Path(source).resolve().parent, d / "link")
        st.rename(d / "model-1.safetensors")
        weight_map = {k: "model-1.safetensors" for k in names}
        weight_map[str(pick(rng, names))] = target
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return f"shard index names {target!r}"
    if op == 8:
        key = str(pick(rng, ["eos_token", "bos_token", "chat_template", "add_bos_token"]))
        value = CONFIG_VALUES[int(rng.integers(len(CONFIG_VALUES)))]
        (d / "tokenizer_config.json").write_text(json.dumps({key: value}))
        return f"tokenizer_config {key} = {value!r}"
    victim = str(pick(rng, ["config.json", "model.safetensors", "generation_config.json"]))
    (d / victim).unlink(missing_ok=True)
    if rng.integers(2):
        (d / victim).mkdir()
        return f"{victim} is a directory"
    os.mkfifo(d / victim)
    return f"{victim} is a FIFO"


# ---------------------------------------------------------------- chat templates

HOSTILE_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}", "{{ 'x'|center(3000000000) }}", "{{ '%999999999d'|format(1) }}",
    "{% set s = 'ab' * 1000 %}{{ s|replace('', s)|replace('', s) }}", "{% include 'x' %}", "{% import 'x' as y %}",
    "{% extends 'x' %}", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{{ 10 ** 10 ** 10 }}",
    "{{ raise_exception('no') }}", "{{ '\\ud800' }}", "{% for %}", "{{ x.y.z }}", "{{ messages[99].content }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}", "{{ cycler.__init__.__globals__ }}", "{{ 1 / 0 }}",
    "{{ messages|map(attribute='role')|join(', ' * 1000000) }}", "{{ range(10)|list * 100000000 }}",
    "{{ strftime_now('%Y' * 1000000) }}", "{% set x = namespace(a=1) %}{% for i in range(10**6) %}"
    "{% set x.a = x.a ~ 'aaaaaaaaaa' %}{% endfor %}{{ x.a }}", "{{ '{:>999999999}'.format('x') }}",
    "{{ 'x'|wordwrap(1)|indent(1000000000) }}", "{{ messages[0]['content'] * 10**9 }}", "{{ lipsum(10**9) }}",
]
PIECES = ["{{ messages[0].content }}", "{% for m in messages %}{{ m.role }}{% endfor %}", "{{ bos_token }}",
          "{% if add_generation_prompt %}<|assistant|>{% endif %}", "{{ 'a' * 100 }}", "{{ range(1000)|join }}",
          "{{ 9 ** 99 }}", "{% for i in range(1000) %}{{ i }}{% endfor %}", "{{ undefined_name }}", "{% raw %}",
          "{{ messages|tojson }}", "{{ (messages * 1000)|length }}", "{{ eos_token|upper }}", "{%- if x -%}"]


def template_mutant(rng):
    """A hostile template: one of the known families, or random pieces joined."""
    if rng.integers(2):
        return HOSTILE_TEMPLATES[int(rng.integers(len(HOSTILE_TEMPLATES)))]
    return "".join(PIECES[int(i)] for i in rng.integers(len(PIECES), size=int(rng.integers(1, 6))))


def template_outcome(template, timeout=2.0):
    """'rendered' or 'refused' (a one-line RefllamaError); anything else raises."""
    try:
        text = render(template, [{"role": "user", "content": "hi"}], "<s>", "</s>", timeout=timeout)
        assert isinstance(text, str)
        return "rendered"
    except refllama.RefllamaError as e:
        return check_error(e)


# ---------------------------------------------------------------- server requests

CHAT_MSG = [{"role": "user", "content": "hi"}]
FIELDS = {"messages": [CHAT_MSG, [], "x", [{"role": 1}], [{"role": "user", "content": ["a"]}], None],
          "prompt": ["hello", "", 5, ["a"], "x" * 3000, None], "max_tokens": [1, 0, -1, 2 ** 70, 3.5, "3", None],
          "temperature": [0, 0.7, 2.5, -0.1, 5e-324, "x", None, True], "top_p": [0, 0.5, 1, 2, None],
          "top_k": [0, 5, -1, 2 ** 40], "min_p": [0, 0.5, 1.5], "seed": [0, 1, -1, 2 ** 64, 2 ** 63, "s"],
          "stop": ["\n", ["a", "b"], [1], ["a"] * 5, ""], "stream": [True, False, "yes"],
          "stream_options": [{"include_usage": True}, [], None], "n": [1, 2], "logprobs": [True, 3, False],
          "repeat_penalty": [0, 1.1, -1], "frequency_penalty": [3, -2, 0.5], "presence_penalty": [-3, 1],
          "model": ["llama-q8_0", "other", 5]}


def request_mutant(rng):
    """(path, body) of a valid request with up to three fields given random values, valid or not."""
    chat = bool(rng.integers(2))
    body = {"messages": CHAT_MSG} if chat else {"prompt": "Hello"}
    body.update(max_tokens=4, temperature=float(pick(rng, [0, 0.8])), stream=bool(rng.integers(2)))
    for key in rng.permutation(sorted(FIELDS))[:int(rng.integers(4))]:
        body[str(key)] = pick(rng, FIELDS[str(key)])
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def request_outcome(client, url, path, body):
    """'answered' (200, a stream ending in [DONE]) or 'refused' (a 4xx in OpenAI's shape); anything else raises."""
    with client.stream("POST", url + path, json=body) as r:
        text = r.read().decode()
    assert r.status_code < 500, (body, text)
    if r.status_code >= 400:
        assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}, text
        return "refused"
    if r.headers["content-type"].startswith("text/event-stream"):
        assert text.rstrip().endswith("data: [DONE]"), (body, text[-200:])
    return "answered"


def pick(rng, values):
    """One of `values`, as it is (numpy's choice would turn big ints into floats)."""
    return values[int(rng.integers(len(values)))]


def rng_for(seed):
    return np.random.default_rng(seed)
