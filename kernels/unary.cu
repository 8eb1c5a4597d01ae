// Elementwise unary pullbacks: acc = prev + g * f'(x), reusing the saved output y where the
// maths allows. One thread per element, grid-stride. `prev` may alias `acc`. `g_step` is 1 for a
// gradient of x's shape and 0 for a scalar gradient broadcast to it (as after a sum).

#define UNARY_BWD(name, derivative)                                                         \
    template <typename T>                                                                    \
    __global__ void name##_bwd_acc(const T* x, const T* y, const T* g, long long g_step,      \
                                   const T* prev, T* acc, long long n, int has_prev) {       \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;          \
             i += (long long)blockDim.x * gridDim.x) {                                       \
            const T xi = x[i], yi = y[i];                                                    \
            (void)xi;                                                                        \
            (void)yi;                                                                        \
            const T base = has_prev ? prev[i] : T(0);                                        \
            acc[i] = base + g[i * g_step] * (derivative);                                    \
        }                                                                                    \
    }

UNARY_BWD(tanh, T(1) - yi * yi)
UNARY_BWD(sigmoid, yi * (T(1) - yi))
UNARY_BWD(relu, yi > T(0) ? T(1) : T(0))
UNARY_BWD(exp, yi)
UNARY_BWD(log, T(1) / xi)
UNARY_BWD(sqrt, T(0.5) / yi)
UNARY_BWD(sin, cos(xi))
UNARY_BWD(cos, -sin(xi))
UNARY_BWD(square, T(2) * xi)
UNARY_BWD(abs, xi >= T(0) ? T(1) : T(-1))
