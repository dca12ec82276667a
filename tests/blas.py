"""Float32 products through BLAS. OpenBLAS picks its kernels, and with them the order of each dot product's
additions, by the matrix's shape and by the CPU: a row's product can differ in its last bits with the rows around it
(on AVX2 hosts; AVX-512 ones here happen to agree). Where refllama computes float32 through BLAS, tests hold two
such products of the same rows to the rounding bound of a float32 dot product, not to their bits."""

import numpy as np

U = 2.0 ** -24  # float32's unit roundoff


def assert_float32_products_close(got, want, x, w):
    """got and want: x @ w.T ([T, K] x [N, K]) summed in two orders. Each is within K u sum_k |x_k w_k| of the exact
    dot product (recursive summation's bound; BLAS's blocked sums do better), so they are within twice that of each
    other. A wrong row, a wrong block or a missing one misses it by orders of magnitude."""
    exact_scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)  # [T, N]
    bound = 2 * x.shape[-1] * U * exact_scale
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= bound), f"{int((err > bound).sum())} products past 2 K u sum|x w| (worst {err.max():.3g})"
