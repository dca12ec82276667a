"""llama.cpp's CPU arithmetic (`numerics="ggml"`), written out in NumPy: the readable emulation.

llama.cpp does not multiply a quantized weight by float32 activations. Before each product it rounds the
activations to the weight type's "vec-dot type" and sums integers within a block, floats across blocks; a float16
matrix (the KV cache, F16 weights) rounds its float32 operand to float16 likewise. The jobs, a module each:
  ggml_quantize   the integers: activations to 8-bit codes (x86's and ARM's rules), a GGUF matrix as IntWeights,
                  their exact block sums;
  ggml_x86        x86's product forms (vec_dot, tiled, repacked gemv/gemm) and which one a product takes;
  ggml_arm        ARM's (its repacked forms, i8mm's two-row vec_dots, tinyBLAS_Q0_ARM), likewise;
  ggml_float      the float steps of each CPU path (expf, softmax, SiLU, GELU's table, RoPE, float16 and F32 sums);
  this module     GgmlMatrix (`x @ w.T` as llama.cpp on a path), the F16 and F32 matrices, the placement and the
                  operations table.
The block sums are exact (integers below 2^24 summed in float32 by BLAS), so only the float steps after them can
differ from llama.cpp, and those in the order of float32 additions. refllama.numerics.ggml_kernels does the same faster.
"""

from functools import partial

import numpy as np

from ..errors import RefllamaError
from ..formats.ggml_types import GGMLType as QT
from ..formats.ggml_types import QuantizedTensor
from ..layers import Ops, linear, rms_norm
from ..xp import Placement
from . import ggml_arm, ggml_x86
from .cpu_paths import TYPES
from .ggml_float import (
    AVX512,
    I8MM,
    LANES,
    NEON,
    ROPE,
    ROPE_ARM,
    attention_mix,
    attention_scores,
    attention_weights,
    f16_dots,
    f32_dots,
    fma,
    gated_delta_net,
    geglu,
    gelu,
    l2_norm,
    layer_norm,
    rope_cos_sin,
    sigmoid,
    silu,
    softcap,
    softmax,
    softplus,
    ssm_conv,
    swiglu,
    swiglu_oai,
)
from .ggml_quantize import GROUP, VEC_DOT_TYPE, IntWeights, block_sums, dequantize, int_weights
from .ggml_tables import round_f16
from .matrices import WeightMatrix, mul_mat_id

# llama.cpp repacks these at load into interleaved forms on these paths, if their rows are a multiple of the form's
# (ggml_repack_get_optimal_repack_type): type -> {path: (form, rows)}
REPACK = {QT.Q4_0: {AVX512: ("q4_0_8x8_q8_0", 8), "avx2": ("q4_0_8x8_q8_0", 8), NEON: ("q4_0_4x4_q8_0", 4),
                    I8MM: ("q4_0_4x8_q8_0", 4)},
          QT.Q4_K: {AVX512: ("q4_K_8x8_q8_K", 8), "avx2": ("q4_K_8x8_q8_K", 8), NEON: ("q4_K_8x4_q8_K", 8),
                    I8MM: ("q4_K_8x8_q8_K", 8)},
          QT.Q5_K: {NEON: ("q5_K_8x4_q8_K", 8), I8MM: ("q5_K_8x8_q8_K", 8)},
          QT.Q6_K: {NEON: ("q6_K_8x4_q8_K", 8), I8MM: ("q6_K_8x8_q8_K", 8)},
          QT.Q2_K: {AVX512: ("q2_K_8x8_q8_K", 8)}, QT.Q8_0: {NEON: ("q8_0_4x4_q8_0", 4), I8MM: ("q8_0_4x8_q8_0", 4)},
          QT.MXFP4: {AVX512: ("mxfp4_8x8_q8_0", 8), "avx2": ("mxfp4_8x8_q8_0", 8)}}


def repacked(qtype, shape, path=AVX512):
    """The interleaved form llama.cpp's CPU backend on a path (its CPU_REPACK buffers on) multiplies this matrix in,
    or None."""
    form = REPACK.get(qtype, {}).get(path)
    return form[0] if form is not None and shape[0] % form[1] == 0 else None


class GgmlMatrix(WeightMatrix):
    """A quantized [N, K] matrix that multiplies as llama.cpp's CPU backend does on a path: `x @ w.T` quantizes x
    to the type's vec-dot type and sums as that CPU family's form for the product (ggml_x86 or ggml_arm: a
    vec_dot, a tiled kernel, or with `repack`, the repacked form's gemv/gemm); `w[rows]` dequantizes rows (llama.cpp's
    get_rows)."""

    ROWS_PER_PASS = 1 << 22  # lane sums per pass: the [K/4, T, N] sums of one pass stay under 16 MB

    def __init__(self, raw, qtype, shape, xp=np, repack=True, path=AVX512):
        self.qtype, self.shape, self.xp = qtype, tuple(shape), xp
        self.form = repacked(qtype, shape, path) if repack else None
        self.repacked = self.form is not None
        self.forms, self.llamafile = ggml_arm if path.startswith("neon") else ggml_x86, LANES[path].llamafile
        w = int_weights(raw, qtype, shape)
        group = GROUP.get(qtype, 32)
        N, K = shape
        self.group = group
        self.codes_t = xp.asarray(w.codes.astype(np.float32).reshape(N, K // group, group).transpose(1, 2, 0))
        self.w = IntWeights(qtype, None, *(None if a is None else xp.asarray(a) for a in w[2:]))

    def matmul(self, x):  # [T, K] f32 -> [T, N] f32
        return self.forms.matmul(self, x)

    def matmul_id(self, x):  # [T, K] f32 -> [T, N] f32: llama.cpp's mul_mat_id for one expert's rows
        return self.forms.matmul_id(self, x)

    def pass_rows(self):  # tokens a pass, so that its lane sums stay under ROWS_PER_PASS
        N, K = self.shape
        return max(1, self.ROWS_PER_PASS // (N * K // 4))

    def in_passes(self, x, product):  # [T, K] -> [T, N]: product(rows of x) a pass at a time
        step = self.pass_rows()
        return self.xp.concatenate([product(x[t:t + step]) for t in range(0, len(x), step)])

    def dot_blocks(self, xq, dx, fused=True, sx=None):  # blocks of 32 x Q8_0 or Q8_1 (sx) [T, K] -> [T, N]
        """x86's repacked ggml_gemv/gemm_q4_0_8x8_q8_0 (and ARM's q8_0_4x4): each block's exact integer sum, rounded
        to float32 once, acc = fma(isum, d_w * d_x, acc) block by block (the gemm's activations are Q8_0's own).
        Not `fused`: acc + isum * (d_w * d_x), product rounded first (ARM's 4x4 gemm and i8mm's two-row vec_dots:
        GCC keeps vmlaq_f32 unfused). Q8_1's offsets (Q4_1's two-row vec_dot): m_w s_x summed block by block apart,
        added at the end."""
        xp, w = self.xp, self.w
        sums = block_sums(xq, self.codes_t, 32)  # [K/32, T, N]
        acc = xp.zeros(sums.shape[1:], np.float32)
        summs = xp.zeros(sums.shape[1:], np.float32)
        for b in range(len(sums)):
            scale = w.d[None, :, b] * dx[:, b, None]
            acc = fma(sums[b], scale, acc) if fused else acc + sums[b] * scale
            if sx is not None:
                summs = summs + w.m[None, :, b] * sx[:, b, None]
        return acc if sx is None else acc + summs

    def isum(self, sums, g):  # [K/group, T, N] block sums, a slice of groups -> [T, N] f32
        """The groups' code products times their sub-block scales: an exact integer (float64), rounded once."""
        return (sums[g].astype(np.float64) * self.w.sc.T[g, None, :]).sum(axis=0).astype(np.float32)

    def msum(self, xs, g):  # [T, K/group'] x's sums of each min's sub-block (float64), a slice -> [T, N] f32
        """x's sums times the sub-blocks' mins: an exact integer, rounded once."""
        return (xs[:, g] @ self.w.m[:, g].T.astype(np.float64)).astype(np.float32)

    def __getitem__(self, rows):  # [T] -> [T, K] f32, dequantized
        N, K = self.shape
        rows = self.xp.asarray(rows).reshape(-1)
        codes = self.codes_t[:, :, rows].transpose(2, 0, 1).reshape(len(rows), K).astype(np.int8)
        sub = IntWeights(self.qtype, codes, *(None if a is None else a[rows] for a in self.w[2:]))
        return dequantize(sub)


class F16Matrix(WeightMatrix):
    """A float16 matrix: llama.cpp rounds the float32 operand to float16 and sums the (exact) products in its CPU
    path's order (f16_dots: tinyBLAS for a batch whose K fills whole vectors, ggml_vec_dot_f16 otherwise); on cupy
    in float32 by cuBLAS."""

    def __init__(self, w, xp=np, path=AVX512):
        self.w, self.xp, self.path = xp.asarray(w, dtype=np.float16), xp, path
        self.shape = self.w.shape

    def matmul(self, x, batch=True):
        x = round_f16(x)
        if self.xp is not np:
            return x @ self.w.T.astype(np.float32)
        x = np.asarray(x, np.float32).reshape(-1, self.shape[1])
        out = np.empty((len(x), self.shape[0]), np.float32)
        step = max(1, (1 << 22) // (len(x) * self.shape[1]))  # rows a pass: T x step x K products at a time
        for a in range(0, self.shape[0], step):
            w = self.w[a:a + step].astype(np.float32)
            out[:, a:a + step] = f16_dots(x[:, None, :], w[None], len(x) if batch else 1, False, self.path)
        return out

    def matmul_id(self, x):  # [T, K] -> [T, N]: mul_mat_id's products, ggml_vec_dot_f16 a row at a time
        return self.matmul(x, batch=False)

    def __getitem__(self, rows):
        return self.w[rows].astype(np.float32)


def id_product(rows, w):  # [n, K], an expert's matrix -> [n, N]: as llama.cpp's mul_mat_id multiplies them
    return w.matmul_id(rows) if hasattr(w, "matmul_id") else linear(rows, w)


class F32Matrix(WeightMatrix):
    """A float32 matrix (a router, an F32 file's matrices): its products summed in llama.cpp's order on a CPU path
    (f32_dots)."""

    def __init__(self, w, path=AVX512):
        self.w, self.path = np.asarray(w, dtype=np.float32), path
        self.shape = self.w.shape

    def matmul(self, x, batch=True):
        return f32_dots(np.asarray(x, dtype=np.float32).reshape(-1, self.shape[1]), self.w, self.path, batch)

    def matmul_id(self, x):  # [T, K] -> [T, N]: mul_mat_id's products, ggml_vec_dot_f32 a row at a time
        return self.matmul(x, batch=False)

    def __getitem__(self, rows):
        return self.w[rows]


class GgmlPlacement(Placement):
    """Weights for `numerics="ggml"` on numpy (or cupy): quantized matrices as GgmlMatrix, float16 ones as
    F16Matrix, float32 ones as F32Matrix (numpy), vectors as they are."""

    keep = frozenset(VEC_DOT_TYPE) | {QT.F16}

    def __init__(self, xp=np, repack=True, path=AVX512):
        super().__init__(xp)
        self.repack, self.path = repack, path

    def prepare(self, qtypes, cfg):
        keep = (self.keep | {QT.F32}) if self.path not in TYPES else {QT[name] for name in TYPES[self.path]}
        unsupported = {t for t in qtypes if t not in keep}
        if unsupported:
            names = ", ".join(sorted(t.name for t in unsupported))
            on = f" on the {self.path} path" if self.path in TYPES else ""
            raise RefllamaError(f"numerics 'ggml' has no emulation of {names} matrices{on} (it has "
                                f"{', '.join(sorted(t.name for t in keep))})")

    def unrepacked(self, a):
        """llama.cpp repacks a matrix its MUL_MAT reads as 2-D, or its MUL_MAT_ID as experts; a 3-D tensor MUL_MAT
        multiplies a matrix per head (DeepSeek's k_b and v_b) stays in its blocks."""
        repack, self.repack = self.repack, False
        try:
            return self(a)
        finally:
            self.repack = repack

    def __call__(self, a):
        if isinstance(a, QuantizedTensor):
            if a.qtype == QT.F16:
                from gguf.quants import dequantize as deq

                return F16Matrix(deq(a.raw, a.qtype).reshape(a.shape), self.xp, self.path)
            return GgmlMatrix(a.raw, a.qtype, a.shape, self.xp, self.repack, self.path)
        if getattr(a, "ndim", 0) == 2 and self.xp is np:
            return F32Matrix(a, self.path)
        return super().__call__(a)


# numerics "ggml" on numpy (and cupy): RMSNorm is refllama.layers' own, which sums as ggml does
OPS = Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=rope_cos_sin, attention_scores=attention_scores,
          attention_weights=attention_weights, attention_mix=attention_mix, swiglu=swiglu, gelu=gelu, geglu=geglu,
          softcap=softcap, kv_f16=True, q_first=True, mla_absorbed=True, softmax=softmax,
          silu=silu, mul_mat_id=partial(mul_mat_id, product=id_product), layer_norm=layer_norm, sigmoid=sigmoid,
          softplus=softplus, l2_norm=l2_norm, ssm_conv=ssm_conv, gated_delta_net=gated_delta_net,
          swiglu_oai=swiglu_oai)


def path_ops(path):
    """OPS on a CPU path (LANES): its float steps' lanes and expf."""
    steps = (attention_scores, attention_weights, attention_mix, swiglu, softmax, silu, layer_norm, gated_delta_net,
             ssm_conv)
    if path == AVX512:
        return OPS
    return OPS._replace(**{f.__name__: partial(f, path=path) for f in steps},
                        **({"rope": ROPE_ARM} if path.startswith("neon") else {}))
