// Sums of squares, with the scalar g read on the device (never copied to the host): the pullback
// of sum(abs2, x), acc = prev + x * (g * 2), and of the mean (or summed) squared error. Each is
// the generic rule's formula, operation for operation. One thread per element, grid-stride.
// `prev` may alias `acc` (an in-place add). Stored as S, computed in T (half.cuh).

#include "half.cuh"

template <typename S>
__global__ void sumsq_bwd_acc(const S* x, const S* g, const S* prev, S* acc, long long n,
                              int has_prev) {
    typedef compute_t<S> T;
    const T scale = load(g[0]) * T(2);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const T c = load(x[i]) * scale;
        acc[i] = store<S>(has_prev ? load(prev[i]) + c : c);
    }
}

// Squared error: acc = prev + (yhat - y) * (g * factor) for yhat (side 0), (y - yhat) * (...)
// for y (side 1); factor is 2 / n for a mean over n elements, 2 for a sum.
template <typename S>
__global__ void mse_bwd_acc(const S* yhat, const S* y, const S* g, compute_t<S> factor, int side,
                            const S* prev, S* acc, long long n, int has_prev) {
    typedef compute_t<S> T;
    const T scale = load(g[0]) * factor;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const T yh = load(yhat[i]), yi = load(y[i]);
        const T c = (side ? yi - yh : yh - yi) * scale;
        acc[i] = store<S>(has_prev ? load(prev[i]) + c : c);
    }
}
