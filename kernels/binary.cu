// Broadcast arithmetic pullbacks: the gradient of one operand of out = x op y, summed over the
// axes along which that operand was broadcast, inside the kernel (no product of the full size is
// materialised). One thread per element of the operand; each loops over its broadcast positions.
//
// meta (int64, on the device) describes the broadcast over `ndim` axes of `out` (contiguous):
//   meta[0 .. ndim)          out's shape
//   meta[ndim .. 2 ndim)     x's strides in elements (0 on axes where x is broadcast)
//   meta[2 ndim .. 3 ndim)   y's strides
//   meta[3 ndim .. 4 ndim)   1 on the axes this operand keeps, 0 on the axes it is summed over
// `side` is 0 for the gradient of x, 1 for y. `prev` may alias `acc`. `g_step` is 1 for a gradient
// of out's shape and 0 for a scalar gradient broadcast to it (as after a sum).

template <typename T>
__device__ T partial(int op, int side, T g, T x, T y, T out) {
    switch (op) {
        case 0: return g;                                              // add
        case 1: return side ? -g : g;                                  // subtract
        case 2: return side ? g * x : g * y;                           // multiply
        case 3: return side ? -g * out / y : g / y;                    // divide
        default: return side ? g * log(x) * out : g * y * pow(x, y - T(1));  // pow
    }
}

template <typename T>
__device__ T sum_broadcast(int op, int side, const T* g, long long g_step, const T* x, const T* y,
                           const T* out, const long long* meta, int ndim, long long i) {
    const long long* shape = meta;
    const long long* xs = meta + ndim;
    const long long* ys = meta + 2 * ndim;
    const long long* kept = meta + 3 * ndim;
    long long reduced = 1;
    for (int a = 0; a < ndim; ++a) reduced *= kept[a] ? 1 : shape[a];
    T total = T(0);
    for (long long r = 0; r < reduced; ++r) {
        long long rest_i = i, rest_r = r, flat = 0, xo = 0, yo = 0, stride = 1;
        for (int a = ndim - 1; a >= 0; --a) {
            long long idx;
            if (kept[a]) {
                idx = rest_i % shape[a];
                rest_i /= shape[a];
            } else {
                idx = rest_r % shape[a];
                rest_r /= shape[a];
            }
            flat += idx * stride;
            stride *= shape[a];
            xo += idx * xs[a];
            yo += idx * ys[a];
        }
        total += partial(op, side, g[flat * g_step], x[xo], y[yo], out[flat]);
    }
    return total;
}

#define BINARY_BWD(name, op)                                                                 \
    template <typename T>                                                                    \
    __global__ void name##_bwd_acc(const T* g, long long g_step, const T* x, const T* y,      \
                                   const T* out, const long long* meta, const T* prev,        \
                                   T* acc, int ndim, int side, long long n, int has_prev) {   \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;          \
             i += (long long)blockDim.x * gridDim.x) {                                       \
            const T base = has_prev ? prev[i] : T(0);                                        \
            acc[i] = base + sum_broadcast(op, side, g, g_step, x, y, out, meta, ndim, i);    \
        }                                                                                    \
    }

BINARY_BWD(add, 0)
BINARY_BWD(sub, 1)
BINARY_BWD(mul, 2)
BINARY_BWD(div, 3)
BINARY_BWD(pow, 4)
