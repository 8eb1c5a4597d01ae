// Elementwise unary pullbacks: acc = prev + contribution(g, x, y), y the saved output. Each
// contribution is the generic rule's formula, operation for operation, so the two agree on the
// whole domain (zeros, signed zeros, inf, nan): masks select rather than multiply (relu passes 0,
// never inf * 0), and a first contribution is stored as it is (-0 stays -0). TG_PER_THREAD
// elements per thread and pass, grid-stride. `prev` may alias `acc`. `g_step` is 1 for a
// gradient of x's shape and 0 for a scalar gradient broadcast to it (as after a sum). Stored as
// S, computed in T (half.cuh).

#include "half.cuh"

#define UNARY_BWD(name, contribution)                                                       \
    template <typename S>                                                                    \
    __global__ void name##_bwd_acc(const S* x, const S* y, const S* g, long long g_step,      \
                                   const S* prev, S* acc, long long n, int has_prev) {       \
        typedef compute_t<S> T;                                                              \
        const long long stride = (long long)blockDim.x * gridDim.x;                          \
        for (long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x; first < n;  \
             first += stride * TG_PER_THREAD) {                                              \
            T xs[TG_PER_THREAD] = {}, ys[TG_PER_THREAD] = {}, gs[TG_PER_THREAD] = {},        \
              ps[TG_PER_THREAD] = {};                                                        \
            for (int k = 0; k < TG_PER_THREAD; ++k) {                                        \
                const long long i = first + k * stride;                                      \
                if (i < n) {                                                                 \
                    xs[k] = load(x[i]);                                                      \
                    ys[k] = load(y[i]);                                                      \
                    gs[k] = load(g[i * g_step]);                                             \
                    if (has_prev) ps[k] = load(prev[i]);                                     \
                }                                                                            \
            }                                                                                \
            for (int k = 0; k < TG_PER_THREAD; ++k) {                                        \
                const long long i = first + k * stride;                                      \
                if (i < n) {                                                                 \
                    const T xi = xs[k], yi = ys[k], gi = gs[k];                              \
                    (void)xi;                                                                \
                    (void)yi;                                                                \
                    const T c = (contribution);                                              \
                    acc[i] = store<S>(has_prev ? ps[k] + c : c);                             \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

UNARY_BWD(tanh, gi * (T(1) - yi * yi))
UNARY_BWD(sigmoid, gi * yi * (T(1) - yi))
UNARY_BWD(relu, yi <= T(0) ? T(0) : gi)
UNARY_BWD(exp, gi * yi)
UNARY_BWD(log, gi / xi)
UNARY_BWD(sqrt, gi / (yi * T(2)))
UNARY_BWD(sin, gi * cos(xi))
UNARY_BWD(cos, -gi * sin(xi))
UNARY_BWD(square, gi * (xi * T(2)))
UNARY_BWD(abs, xi > T(0) ? gi : (xi < T(0) ? -gi : T(0)))  // sign(x) * g: 0 at +-0 and nan
