"""The GPU's own kernels (CUDA C, compiled by CuPy) for a decode step and for 16-bit weights, each beside its NumPy
mirror: the same arithmetic on NumPy arrays, written into the same output buffers. The mirrors are what the CPU
tests run (a decode step built from them is held to refllama.layers' forward); on a GPU each kernel is held to its
mirror (tests/test_gpu.py, tools/gpu_check.py). Hand-written because a decode step of one token is a few hundred
small launches that CuPy's array operations cannot fuse or put in a CUDA graph without allocating.

Shape letters as refllama.layers; QKV = (H + 2 KVH) HD, a layer's q, k and v projections side by side; R the
rotated dims of a head. `pos` and `token` are one-element int32 arrays on the device, so that a captured graph
reads the step's position and token rather than baking them in.
"""

from importlib import resources

import numpy as np

from .. import layers
from ..formats.ggml_types import BLOCK_SIZES, GGMLType, QuantizedTensor
from ..xp import Placement, array_module, to_numpy
from .matrices import SCRATCH_VALUES, Scratch, WeightMatrix

WARPS = 8  # a gemv block's warps, one output row each
HALF = {GGMLType.F16: "f16", GGMLType.BF16: "bf16"}  # the 16-bit types kept as stored on the GPU
QUANT = {t: t.name.lower() for t in GGMLType if BLOCK_SIZES[t][0] >= 32}  # blocks of 32 or 256 values
STORED = {**HALF, **QUANT}  # every type a matrix stays in on the GPU, by its kernels' name
KIND = {kind: qtype for qtype, kind in STORED.items()}

# each quantized type as X(kind, values a block, bytes a block), for the kernels made per type (cuda/dequant.cuh's dq_)
DQ_TYPES = "#define DQ_TYPES(X) " + " ".join(f"X({kind}, {BLOCK_SIZES[t][0]}, {BLOCK_SIZES[t][1]})"
                                             for t, kind in QUANT.items())

CUDA = resources.files(__package__) / "cuda"  # kernels.cu, which includes dequant.cuh
DEQUANT = (CUDA / "dequant.cuh").read_text(encoding="utf-8")
SOURCE = DQ_TYPES + "\n" + (CUDA / "kernels.cu").read_text(encoding="utf-8").replace('#include "dequant.cuh"', DEQUANT)

NULL = np.uint64(0)  # a null pointer argument


def widen_numpy(raw, kind, out=None):  # [..., stored] -> [..., K] float32
    """A matrix's (or a row's) stored values as float32, as the loaders convert a file's: 16-bit bits exactly, the
    quantized types' blocks by gguf-py's dequantize."""
    qtype = KIND[kind]
    block, size = BLOCK_SIZES[qtype]
    return QuantizedTensor(raw, qtype, (*raw.shape[:-1], raw.shape[-1] * raw.itemsize // size * block)).to_float32(out)


def stored(w):  # a weight -> (its array, its kind: "f32", or a key of KIND)
    return (w.raw, w.kind) if isinstance(w, GpuMatrix) else (w, "f32")


class NumpyKernels:
    """The mirrors: each kernel's arithmetic on NumPy arrays, writing its output buffer in place."""

    xp = np

    def gemv(self, w, x, out, bias=None, res=None):  # [N, K] . [K] (+ bias, + res) -> out [N]
        a, kind = stored(w)
        y = (widen_numpy(a, kind) if kind != "f32" else a) @ x
        if bias is not None:
            y = y + bias
        out[...] = y if res is None else res + y

    def widen(self, raw, kind, out):
        widen_numpy(raw, kind, out)

    def rms_norm(self, x, w, eps, out, res=None):  # [rows, D] (+ res) -> out
        y = layers.rms_norm(x, w, eps)
        out[...] = y if res is None else res + y

    def rope_store(self, qkv, cos, sin, pos, q_out, k_cache, v_cache, qn, kn, eps, heads, layout):
        H, KVH, HD = heads
        p = int(pos[0])
        q, k, v = np.split(qkv.reshape(H + 2 * KVH, HD), (H, H + KVH))  # [H, HD], [KVH, HD], [KVH, HD]
        if qn is not None:
            q, k = layers.rms_norm(q, qn, eps), layers.rms_norm(k, kn, eps)
        rope = layers.ROPE[layout]
        q_out[...] = rope(q[None], cos[p:p + 1], sin[p:p + 1]).reshape(-1)
        k_cache[:, p] = rope(k[None], cos[p:p + 1], sin[p:p + 1])[0]
        v_cache[:, p] = v

    def attention(self, q, k_cache, v_cache, pos, scores, out, scale, heads, window):
        H, KVH, HD = heads
        p = int(pos[0])
        lo = max(0, p - window + 1) if window else 0
        kq = layers.attention_scores(q.reshape(1, H, HD), k_cache[:, lo:p + 1])  # [H, 1, S]
        probs = layers.softmax(kq * np.float32(scale))
        scores[:, lo:p + 1] = probs[:, 0]
        out[...] = layers.attention_mix(probs, v_cache[:, lo:p + 1]).reshape(-1)

    def swiglu(self, g, u, out):  # [n], [n] -> out [n]
        out[...] = layers.swiglu(g, u)

    def geglu(self, g, u, out):  # [n], [n] -> out [n]
        out[...] = layers.geglu(g, u)

    def scale(self, x, s):  # x [n] *= s, in place
        x *= np.float32(s)

    def softcap(self, x, cap):  # x [n] -> cap tanh(x / cap), in place
        x[...] = layers.softcap(x, cap)

    def softmax_rows(self, x, mask, scale, out):  # [H, T, S], [T, S] -> out [H, T, S]
        out[...] = layers.attention_weights(x, mask, scale)

    def rope(self, x, cos, sin, layout, out):  # [T, n, HD], [T, R/2] -> out [T, n, HD]
        out[...] = layers.ROPE[layout](x, cos, sin)

    def embed(self, token, w, out):  # the row of token[0] -> out [D]
        a, kind = stored(w)
        row = a[int(token[0])]
        out[...] = widen_numpy(row, kind) if kind != "f32" else row


class CudaKernels:
    """The kernels, compiled once a process by CuPy (NVRTC) from SOURCE, launched on the current stream."""

    def __init__(self):
        import cupy

        self.xp = cupy
        self.module = cupy.RawModule(code=SOURCE, options=("--std=c++17",))
        self.fn = {}

    def _f(self, name):
        if name not in self.fn:
            self.fn[name] = self.module.get_function(name)
        return self.fn[name]

    def gemv(self, w, x, out, bias=None, res=None):
        a, kind = stored(w)
        N, K = w.shape
        self._f(f"gemv_{kind}")(((N + WARPS - 1) // WARPS,), (32 * WARPS,),
                                (a, x, NULL if bias is None else bias, NULL if res is None else res, out,
                                 np.int32(N), np.int32(K)))

    def widen(self, raw, kind, out, token=None):  # token: widen that row of raw only (an embedding)
        if kind in QUANT.values():
            n = out.size // 8  # runs of 8 values
            self._f(f"widen_{kind}")(((n + 255) // 256,), (256,), (raw, NULL if token is None else token, out,
                                                                    np.int64(n), np.int32(out.shape[-1])))
        else:
            n = raw.size
            self._f(f"widen_{kind}")(((n + 255) // 256,), (256,), (raw, out, np.int64(n)))

    def rms_norm(self, x, w, eps, out, res=None):
        D = x.shape[-1]
        self._f("rms_norm")((x.size // D,), (min(1024, 32 * ((D + 31) // 32)),), (
            x, w, NULL if res is None else res, out, np.int32(D), np.float32(eps)))

    def rope_store(self, qkv, cos, sin, pos, q_out, k_cache, v_cache, qn, kn, eps, heads, layout):
        H, KVH, HD = heads
        self._f("rope_store")((H + 2 * KVH,), (32 * ((HD + 31) // 32),), (
            qkv, cos, sin, pos, q_out, k_cache, v_cache, NULL if qn is None else qn, NULL if kn is None else kn,
            np.float32(eps), np.int32(H), np.int32(KVH), np.int32(HD), np.int32(2 * cos.shape[1]),
            np.int32(k_cache.shape[1]), np.int32(layout == "half")))

    def attention(self, q, k_cache, v_cache, pos, scores, out, scale, heads, window):
        H, KVH, HD = heads
        self._f("attention")((H,), (256,), (q, k_cache, v_cache, pos, scores, out, np.float32(scale), np.int32(H),
                                            np.int32(KVH), np.int32(HD), np.int32(k_cache.shape[1]),
                                            np.int32(window or 0)))

    def swiglu(self, g, u, out):
        n = out.size
        self._f("swiglu")(((n + 255) // 256,), (256,), (g, u, out, np.int64(n)))

    def geglu(self, g, u, out):
        n = out.size
        self._f("geglu")(((n + 255) // 256,), (256,), (g, u, out, np.int64(n)))

    def scale(self, x, s):
        n = x.size
        self._f("scale")(((n + 255) // 256,), (256,), (x, np.float32(s), np.int64(n)))

    def softcap(self, x, cap):
        n = x.size
        self._f("softcap")(((n + 255) // 256,), (256,), (x, np.float32(cap), np.int64(n)))

    def rope(self, x, cos, sin, layout, out):
        T, n, HD = x.shape
        self._f("rope")((T * n,), (32 * ((HD + 31) // 32),), (x, cos, sin, out, np.int32(n), np.int32(HD),
                                                               np.int32(2 * cos.shape[1]), np.int32(layout == "half")))

    def softmax_rows(self, x, mask, scale, out):
        n, T = x.shape[-1], mask.shape[0]
        self._f("softmax_rows")((x.size // n,), (min(1024, 32 * ((n + 31) // 32)),), (
            x, mask, out, np.int32(n), np.int32(T), np.float32(scale)))

    def embed(self, token, w, out):
        a, kind = stored(w)
        if kind in QUANT.values():
            return self.widen(a, kind, out, token)
        D = a.shape[1]
        self._f(f"embed_{kind}")(((D + 255) // 256,), (256,), (token, a, out, np.int32(D)))


_CUDA = []


def kernels(xp):
    """The kernel set of an array module: the mirrors for NumPy, the CUDA kernels (compiled once) for CuPy."""
    if xp is np:
        return NumpyKernels()
    if not _CUDA:
        _CUDA.append(CudaKernels())
    return _CUDA[0]


def contiguous(x):
    return array_module(x).ascontiguousarray(x, dtype=np.float32)


def rms_norm(x, w, eps):  # [..., D], [D] -> [..., D]: layers.rms_norm as one kernel
    x = contiguous(x)
    out = array_module(x).empty_like(x)
    kernels(array_module(x)).rms_norm(x, contiguous(w), eps, out)
    return out


def gated(unit):
    def product(gate, up):  # [T, F], [T, F] -> [T, F]: layers.swiglu or layers.geglu as one kernel
        gate = contiguous(gate)
        out = array_module(gate).empty_like(gate)
        getattr(kernels(array_module(gate)), unit)(gate, contiguous(up), out)
        return out

    return product


def attention_weights(kq, mask, scale, sinks=None):  # [H, T, S], [T, S], [H] -> [H, T, S]
    """layers.attention_weights as one kernel (with gpt-oss's sinks: its array operations)."""
    if sinks is not None:
        return layers.attention_weights(kq, mask, scale, sinks)
    kq = contiguous(kq)
    out = array_module(kq).empty_like(kq)
    kernels(array_module(kq)).softmax_rows(kq, contiguous(mask), scale, out)
    return out


def rope_in(layout):
    def rope(x, cos, sin):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]: layers.ROPE[layout] as one kernel
        x = contiguous(x)
        out = array_module(x).empty_like(x)
        kernels(array_module(x)).rope(x, contiguous(cos), contiguous(sin), layout, out)
        return out

    return rope


# the cupy backend's steps in float32: a prefill's norms, RoPE, softmax and gated unit one kernel each, where CuPy's
# array operations take several
OPS = layers.FLOAT32._replace(rms_norm=rms_norm, rope={layout: rope_in(layout) for layout in layers.ROPE},
                              swiglu=gated("swiglu"), geglu=gated("geglu"), attention_weights=attention_weights)


class GpuMatrix(WeightMatrix):
    """A [N, K] weight kept on the device as stored: float16/bfloat16 bits (`raw` [N, K] uint16) or GGUF's quantized
    blocks (`raw` [N, row bytes] uint8), a fraction of a float32 copy's memory and reads. One token's product (decode)
    reads them in the gemv kernel, each value unpacked exactly to its float32 value and accumulated in float32; a
    product of several tokens widens blocks of rows into the scratch and multiplies them there (cuBLAS): the values
    multiplied are those of a float32 copy either way."""

    def __init__(self, raw, kind, scratch):
        self.raw, self.kind, self.scratch = raw, kind, scratch
        block, size = BLOCK_SIZES[KIND[kind]]
        self.shape = (raw.shape[0], raw.shape[1] * raw.itemsize // size * block)
        self.xp = scratch.xp
        self.k = kernels(self.xp)

    @property
    def array_module(self):
        return self.xp

    @property
    def nbytes(self):
        return self.raw.nbytes

    def rows(self, a, b):  # rows a:b, still as stored (a view)
        return GpuMatrix(self.raw[a:b], self.kind, self.scratch)

    def float32(self, a, b, out=None):  # rows a:b -> [b - a, K] float32
        out = self.scratch.take((b - a, self.shape[1])) if out is None else out
        self.k.widen(self.raw[a:b], self.kind, out)
        return out

    def matmul(self, x):  # [T, K] -> [T, N]
        xp, (N, K) = self.xp, self.shape
        x = xp.ascontiguousarray(x, dtype=xp.float32)
        if len(x) == 1:
            out = xp.empty((1, N), xp.float32)
            self.k.gemv(self, x[0], out[0])
            return out
        block = max(1, min(N, SCRATCH_VALUES // K))
        out = xp.empty((len(x), N), xp.float32)
        for a in range(0, N, block):
            b = min(a + block, N)
            out[:, a:b] = x @ self.float32(a, b).T
        return out

    def __getitem__(self, rows):  # embedding rows: [T] -> [T, K] float32
        raw = self.raw[self.xp.asarray(self.row_ids(to_numpy(rows)))]
        out = self.xp.empty((len(raw), self.shape[1]), self.xp.float32)
        self.k.widen(raw, self.kind, out)
        return out


class GpuPlacement(Placement):
    """Weights for the cupy backend: float32 arrays on the device, but for float16/bfloat16 and quantized matrices,
    which stay as stored (GpuMatrix) unless `in_file` is False: then they are widened to float32 on the device, where
    it is fast, not on the CPU. The products are the same either way."""

    def __init__(self, xp, in_file=None):
        super().__init__(xp)
        self.keep = frozenset(STORED)
        self.in_file = in_file is not False
        self.scratch = Scratch(xp)

    def __call__(self, a):
        if not isinstance(a, QuantizedTensor):
            return self.xp.asarray(a)
        raw = np.ascontiguousarray(a.raw)
        m = GpuMatrix(self.xp.asarray(raw.view(np.uint16) if a.qtype in HALF else raw).reshape(len(raw), -1),
                      STORED[a.qtype], self.scratch)
        return m if self.in_file else m.float32(0, m.shape[0], self.xp.empty(m.shape, self.xp.float32))
