"""LLVM IR helpers for the hot loops that Numba's own loops vectorize poorly: types, loads from addresses, a splat,
a horizontal sum and a counted loop that carries values from one pass to the next."""

import types

from llvmlite import ir
from numba import njit

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
V32I8, V32F32 = ir.VectorType(I8, 32), ir.VectorType(F32, 32)


def compile_features():
    """The CPU features Numba compiles for (LLVM's names): NUMBA_CPU_FEATURES where set (say, with
    NUMBA_CPU_NAME=haswell, "+avx2,+fma,+f16c" to compile as for an AVX2-only host), else the host's, as Numba
    takes them."""
    import llvmlite.binding as llvm  # here: LLVM's library maps ~60 MB, which numerics float32 on numpy never needs
    import numba

    if numba.config.CPU_FEATURES is not None:
        return {f[1:] for f in numba.config.CPU_FEATURES.split(",") if f.startswith("+")}
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


def specialize(fn, name, parallel=True, **constants):
    """A Numba kernel (parallel unless told) compiled from a copy of fn whose globals add `constants` (an intrinsic,
    a size), under a name of its own: each copy is cached apart by Numba, which cannot key its cache on closure
    variables."""
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, **constants}, name)
    copy.__qualname__ = name
    return njit(parallel=parallel, cache=True)(copy)


def splat(builder, value, vtype):
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(ir.VectorType(I32, vtype.count),
                                                                                  [0] * vtype.count))


def load(builder, addr, ty):
    return builder.load(builder.inttoptr(addr, ty.as_pointer()), align=1)


def load_f16(builder, addr):  # a float16 at addr -> float
    return builder.fpext(builder.bitcast(load(builder, addr, I16), ir.HalfType()), F32)


def lanes(builder, v, start, n):  # <m x T> -> <n x T>: lanes start .. start + n - 1
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(start, start + n))))


def hsum(builder, v):  # <n x float> -> float, n a power of 2: the high half added to the low one until one lane is
    n = v.type.count  # left (_mm512_reduce_add_ps's order for 16)
    while n > 1:
        n //= 2
        v = builder.fadd(lanes(builder, v, 0, n), lanes(builder, v, n, n))
    return builder.extract_element(v, ir.Constant(I32, 0))


def counted_loop(builder, n, initial, body):
    """IR of `for i in range(n)` (n >= 1: the body runs before the test) carrying values from one pass to the next:
    `initial` are their first values, body(i, values) returns their next ones (it may emit loops of its own);
    returns their values after the last pass."""
    entry, loop, done = builder.block, builder.append_basic_block("loop"), builder.append_basic_block("done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i, values = builder.phi(I64), [builder.phi(v.type) for v in initial]
    new = body(i, values)
    i1, tail = builder.add(i, ir.Constant(I64, 1)), builder.block
    for phi, first, nxt in [(i, ir.Constant(I64, 0), i1), *zip(values, initial, new, strict=True)]:
        phi.add_incoming(first, entry)
        phi.add_incoming(nxt, tail)
    builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
    builder.position_at_end(done)
    return new


def loop_of(builder, n, initial, body):
    """counted_loop for any n >= 0: its values unchanged where n is 0."""
    entry, run, after = builder.block, builder.append_basic_block("run"), builder.append_basic_block("after")
    builder.cbranch(builder.icmp_signed(">", n, ir.Constant(I64, 0)), run, after)
    builder.position_at_end(run)
    new = counted_loop(builder, n, initial, body)
    end = builder.block
    builder.branch(after)
    builder.position_at_end(after)
    values = []
    for first, last in zip(initial, new, strict=True):
        phi = builder.phi(first.type)
        phi.add_incoming(first, entry)
        phi.add_incoming(last, end)
        values.append(phi)
    return values


def declare(builder, name, ret, *params):  # an LLVM intrinsic of this signature, declared in the builder's module
    return builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ret, list(params)))


def prefetch(builder, addr):
    """A hint to bring the cache line at addr into the L2 cache ahead of its use (prefetcht1): the hardware
    prefetchers alone keep the kernels' reads well below the memory's bandwidth, and hints into L1 (prefetcht0)
    cost more than they bring (a 255 MB product: 18 GB/s with them, 31-35 with these, AMD EPYC, 2 threads)."""
    ptr = ir.IntType(8).as_pointer()
    fn = builder.module.globals.get("llvm.prefetch.p0i8") or ir.Function(
        builder.module, ir.FunctionType(ir.VoidType(), [ptr, I32, I32, I32]), "llvm.prefetch.p0i8")
    builder.call(fn, [builder.inttoptr(addr, ptr), ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])
