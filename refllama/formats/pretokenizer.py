"""llama.cpp's BPE pre-tokenizer: the regexes each `tokenizer.ggml.pre` names, applied as llama.cpp applies them.

llama.cpp (unicode.cpp, `unicode_regex_split`) runs each regex of a list in turn over the pieces the previous one
left, keeping matches and the gaps between them as pieces. Its regex engine is C++'s std::regex, which knows no
Unicode classes, so a regex using \\p{..} runs on a "collapsed" text: every code point above 127 becomes one byte
standing for its category (whitespace, number, letter, punctuation, mark, symbol, other), and each \\p{..} becomes
a class of that byte and its ASCII members. A regex without \\p{..} runs on the code points, non-ASCII whitespace
replaced by a vertical tab. Python's `re` does the same here: the same texts, the same rewritten regexes, the same
backtracking semantics. The categories are Unicode 15.1's, llama.cpp 0.3.36's tables (unicodedata2 pins them).

(llama.cpp hand-codes the GPT-2, Llama 3, Qwen 2 and Qwen 3.5 regexes; those functions follow the regexes and the
tokenizer suite checks they agree.)
"""

import re

import unicodedata2

# One list of regexes per pre-tokenizer, with llama.cpp's `tokenizer.ggml.pre` names for it (llama-vocab.cpp)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LETTERS = (
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376"
    "\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-"
    "\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00"
    "-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
    "\U000118df\U0001e900-\U0001e943")
_TABLE = [
    # (names, regexes, ignore_merges: a word that is a token is taken whole)
    (("default",), [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], False),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "exaone4", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
      "granite-docling"), [_GPT2], False),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     [r"\p{N}", _GPT2], False),
    (("falcon",), [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"], False),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     [_LLAMA3], True),
    (("dbrx", "smaug-bpe"), [_LLAMA3], False),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
     [_QWEN2], False),
    (("qwen35",), [_QWEN35], False),
    (("deepseek-llm",), ["[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+",
                         "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$", _CJK, r"\p{N}+"],
     False),
    (("deepseek-coder",), ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"], False),
    (("poro-chat", "bloom", "gpt3-finnish"), [" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"], False),
    (("viking",), [" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"], False),
]
PRE = {name: (regexes, ignore) for names, regexes, ignore in _TABLE for name in names}
ADD_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}
NEWLINES = ["[^\n]+|[\n]+"]  # Gemma 4: SentencePiece-style BPE, split only at newlines

WHITESPACE = frozenset((*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                        0x202F, 0x205F, 0x3000))  # Unicode's White_Space, as llama.cpp lists it
_CATEGORY_BYTE = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}  # other categories: "\xd0"
_CLASS = {"N": "\xd10-9", "L": "\xd2A-Za-z", "P": "\xd3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", "M": "\xd4",
          "S": "\xd5\\$\\+<->^`\\|~"}  # a category's byte and its ASCII members
_UCAT = re.compile(r"\\p\{(N|L|P|M|S|Lu|Ll|Lt|Lm|Lo)\}")
_collapsed_char = {}


def category_byte(c):
    """The collapsed text's character for code point c: itself if ASCII, else its category's stand-in."""
    b = _collapsed_char.get(c)
    if b is None:
        if ord(c) in WHITESPACE:
            b = "\x0b"
        else:
            cat = unicodedata2.category(c)
            b = "\xd0" if cat == "Cn" else _CATEGORY_BYTE.get(cat[0], "\xd0")
        _collapsed_char[c] = b
    return b


def collapse(text):
    return "".join(c if c < "\x80" else category_byte(c) for c in text)


def compile_regex(expr):
    """(compiled regex, runs on the collapsed text?) for one of llama.cpp's regexes, rewritten as llama.cpp
    rewrites it: each \\p{..} becomes its class ([..] outside a class, its members inside one); $ is the end of
    the text (ECMAScript), and \\s is ASCII whitespace (std::regex's C locale)."""
    collapsed = bool(_UCAT.search(expr))
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif c == "]" and inside and expr[i - 1] != "\\":
            inside = False
        elif c == "$" and not inside and (i == 0 or expr[i - 1] != "\\"):
            c = r"\Z"
        elif collapsed and (m := _UCAT.match(expr, i)):
            members = _CLASS[m.group(1)[0]]
            out.append(members if inside else f"[{members}]")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return re.compile("".join(out), re.ASCII), collapsed


def compile_regexes(exprs):
    return [compile_regex(e) for e in exprs]


def split(text, regexes):
    """Pieces of `text`: each regex splits every piece so far into its matches and the text between them."""
    pieces = [(0, len(text))]
    collapsed = plain = None
    for rx, on_collapsed in regexes:
        if on_collapsed:
            collapsed = collapsed or collapse(text)
            subject = collapsed
        else:  # code points, non-ASCII whitespace as \v (std::wregex's \s is ASCII only)
            plain = plain or "".join("\x0b" if c >= "\x80" and ord(c) in WHITESPACE else c for c in text)
            subject = plain
        out = []
        for start, end in pieces:
            at = start
            for m in rx.finditer(subject[start:end]):
                s, e = start + m.start(), start + m.end()
                if s > at:
                    out.append((at, s))
                out.append((s, e))
                at = e
            if at < end:
                out.append((at, end))
        pieces = out
    return [text[s:e] for s, e in pieces]
