// Sums of squares, with the scalar g read on the device (never copied to the host): the pullback
// of sum(abs2, x), acc = prev + x * (g * 2), and of the mean (or summed) squared error. Each is
// the generic rule's formula, operation for operation. TG_PER_THREAD elements per thread and
// pass, grid-stride.
// `prev` may alias `acc` (an in-place add). Stored as S, computed in T (half.cuh).

#include "half.cuh"

template <typename S>
__global__ void sumsq_bwd_acc(const S* x, const S* g, const S* prev, S* acc, long long n,
                              int has_prev) {
    typedef compute_t<S> T;
    const T scale = load(g[0]) * T(2);
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x; first < n;
         first += stride * TG_PER_THREAD) {
        T xs[TG_PER_THREAD] = {}, ps[TG_PER_THREAD] = {};
        for (int k = 0; k < TG_PER_THREAD; ++k) {
            const long long i = first + k * stride;
            if (i < n) {
                xs[k] = load(x[i]);
                if (has_prev) ps[k] = load(prev[i]);
            }
        }
        for (int k = 0; k < TG_PER_THREAD; ++k) {
            const long long i = first + k * stride;
            if (i < n) {
                const T c = xs[k] * scale;
                acc[i] = store<S>(has_prev ? ps[k] + c : c);
            }
        }
    }
}

// Squared error: acc = prev + (yhat - y) * (g * factor) for yhat (side 0), (y - yhat) * (...)
// for y (side 1); factor is 2 / n for a mean over n elements, 2 for a sum.
template <typename S>
__global__ void mse_bwd_acc(const S* yhat, const S* y, const S* g, compute_t<S> factor, int side,
                            const S* prev, S* acc, long long n, int has_prev) {
    typedef compute_t<S> T;
    const T scale = load(g[0]) * factor;
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x; first < n;
         first += stride * TG_PER_THREAD) {
        T yhs[TG_PER_THREAD] = {}, ys[TG_PER_THREAD] = {}, ps[TG_PER_THREAD] = {};
        for (int k = 0; k < TG_PER_THREAD; ++k) {
            const long long i = first + k * stride;
            if (i < n) {
                yhs[k] = load(yhat[i]);
                ys[k] = load(y[i]);
                if (has_prev) ps[k] = load(prev[i]);
            }
        }
        for (int k = 0; k < TG_PER_THREAD; ++k) {
            const long long i = first + k * stride;
            if (i < n) {
                const T c = (side ? ys[k] - yhs[k] : yhs[k] - ys[k]) * scale;
                acc[i] = store<S>(has_prev ? ps[k] + c : c);
            }
        }
    }
}
