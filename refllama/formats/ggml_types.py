"""GGUF's ids as refllama reads them: metadata value types; ggml's tensor types, their block sizes, and the named form
of a tensor kept quantized.

A table of its own so that the GGUF loader, the architectures and the numerics all import it and none imports another.
"""

from enum import IntEnum
from typing import NamedTuple


class GGUFValueType(IntEnum):
    """The type of a GGUF metadata value (gguf.h, `enum gguf_type`)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


V = GGUFValueType
SCALAR_DTYPES = {V.UINT8: "<u1", V.INT8: "<i1", V.UINT16: "<u2", V.INT16: "<i2", V.UINT32: "<u4", V.INT32: "<i4",
                 V.FLOAT32: "<f4", V.BOOL: "?", V.UINT64: "<u8", V.INT64: "<i8", V.FLOAT64: "<f8"}
INTEGERS = (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64)
FLOATS = (V.FLOAT32, V.FLOAT64)


class GGMLType(IntEnum):
    """ggml's ids of the tensor types refllama reads (ggml.h, `enum ggml_type`). gguf-py has them all, but
    importing its package loads every module of it and, where installed, SentencePiece: memory that the numba
    path, which calls no gguf-py function for the default model, would carry to the end.
    gguf-py is imported where one of its functions is needed: dequantizing, Q4_K's scales, naming a type
    refllama does not read. tests/test_gguf_loader.py checks this table against gguf-py's."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30
    MXFP4 = 39  # gpt-oss's experts: 32 E2M1 values under one E8M0 scale


SUPPORTED_TYPES = frozenset(GGMLType)
BLOCK_SIZES = {  # type: (values per block, bytes per block)
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.MXFP4: (32, 17),
}


def byte_shape(shape, qtype):  # numpy shape [..., K] of a supported type -> its bytes' shape [..., row bytes]
    block, type_size = BLOCK_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block * type_size)


def type_and_sizes(raw_type):
    """(type, (values per block, bytes per block)) for a raw type id: refllama's own for the types it reads,
    else gguf-py's, so that the error names the type when a tensor of it is asked for; None if unknown."""
    if raw_type in BLOCK_SIZES:
        return GGMLType(raw_type), BLOCK_SIZES[raw_type]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        return None
    return qtype, GGML_QUANT_SIZES[qtype]


class QuantizedTensor(NamedTuple):
    """A matrix left in its file's bytes (a GGUF tensor of any type, a safetensors' F16/BF16) for a backend that
    multiplies by it as stored (refllama.numerics)."""

    raw: object  # [N, row bytes] uint8 (a memory map of the file)
    qtype: GGMLType
    shape: tuple  # numpy shape [N, K] (a vector converted by to_float32: [K])

    def rows(self, index):
        """These rows only (a slice or an index array), still in the file's form."""
        raw = self.raw[index]
        return QuantizedTensor(raw, self.qtype, (len(raw), self.shape[1]))

    def to_float32(self, out=None):  # -> [N, K] float32
        """The values in float32, written into `out` if given: F32, F16 and BF16 exactly (bfloat16 is the top half
        of a float32), the quantized types by gguf-py's dequantize, as the loaders convert them."""
        import numpy as np

        out = np.empty(self.shape, np.float32) if out is None else out
        if self.qtype == GGMLType.F32:
            np.copyto(out, self.raw.view(np.float32).reshape(self.shape))
        elif self.qtype == GGMLType.F16:
            np.copyto(out, self.raw.view(np.float16).reshape(self.shape))
        elif self.qtype == GGMLType.BF16:
            np.left_shift(self.raw.view(np.uint16).reshape(self.shape), 16, out=out.view(np.uint32), dtype=np.uint32)
        else:
            from gguf.quants import dequantize

            with np.errstate(all="ignore"):  # a corrupt scale dequantizes to inf/NaN: the file's values, not an error
                out[...] = dequantize(self.raw, self.qtype).reshape(self.shape)
        return out

    def split(self, sizes):
        """Row blocks of `sizes` rows each (a fused matrix's parts, or a 3-D tensor's experts [E, N, K] as E blocks of
        N rows); rows are whole blocks, so bytes split too."""
        out, start = [], 0
        for n in sizes:
            out.append(QuantizedTensor(self.raw[start:start + n], self.qtype, (n, self.shape[-1])))
            start += n
        return out
