// Broadcast arithmetic pullbacks: the gradient of one operand (`side` 0 for x, 1 for y) of
// out = x op y, summed over the axes along which that operand was broadcast. Each partial is the
// generic rule's formula, operation for operation (pow's included: at x == 0 the exponent y - 1
// becomes 1 where y == 0 too, and log(x) becomes log(1) where y >= 0 too, so 0 ** 0 and 0 ** y
// give 0, not nan).
//
// The operand's elements are the "outputs" of the pullback; the positions of `out` that reduce
// into one of them are its "reduced" positions. `dims` describes both, axis by axis (the axes of
// each group merged where memory allows), with 4 numbers per axis: its length and the strides, in
// elements, of g (and out), x and y along it (0 where that array is broadcast). The first
// `kept_ndim` axes index the outputs, the next `reduced_ndim` the reduced positions; the last
// axis of each group varies fastest. `g_step` is 1 for a gradient of out's shape and 0 for a
// scalar gradient broadcast to it (as after a sum). `prev` may alias `acc`.

//
// An operand reaches `partial` as a pointer and an offset, and is read only where its formula
// needs it: the tape keeps only what the generic rule reads (nothing for add and subtract, the
// other operand for multiply), and passes g in place of an array it did not keep.
//
// Stored as S, computed in T (half.cuh): the slices' totals of a split reduction are kept in T.

#include "half.cuh"

template <typename S>
__device__ compute_t<S> partial(int op, int side, compute_t<S> g, const S* x, long long ox,
                                const S* y, long long oy, const S* out, long long oo) {
    typedef compute_t<S> T;
    switch (op) {
        case 0: return g;                                                       // add
        case 1: return side ? -g : g;                                           // subtract
        case 2: return side ? g * load(x[ox]) : g * load(y[oy]);                // multiply
        case 3: return side ? -g * load(out[oo]) / load(y[oy]) : g / load(y[oy]);  // divide
        default: {                                                              // pow
            const T xv = load(x[ox]);
            const T yv = load(y[oy]);
            if (side) return g * log(xv == T(0) && yv >= T(0) ? T(1) : xv) * load(out[oo]);
            return g * yv * pow(xv, yv == T(0) && xv == T(0) ? T(1) : yv - T(1));
        }
    }
}

// Offsets of g, x and y for position k of the axes dims[0 .. ndim) (4 numbers each).
__device__ void offsets(const long long* dims, int ndim, long long k, long long* o) {
    o[0] = o[1] = o[2] = 0;
    for (int a = ndim - 1; a >= 0; --a) {
        const long long* d = dims + 4 * a;
        const long long index = a ? k % d[0] : k;
        k = a ? k / d[0] : 0;
        o[0] += index * d[1];
        o[1] += index * d[2];
        o[2] += index * d[3];
    }
}

// The operand is not broadcast: one thread per element, no reduction.
#define BINARY_BWD(name, op)                                                                 \
    template <typename S>                                                                    \
    __global__ void name##_bwd_acc(const S* g, long long g_step, const S* x, const S* y,      \
                                   const S* out, const long long* dims, int ndim, int side,   \
                                   const S* prev, S* acc, long long n, int has_prev) {       \
        typedef compute_t<S> T;                                                              \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;          \
             i += (long long)blockDim.x * gridDim.x) {                                       \
            long long o[3];                                                                  \
            offsets(dims, ndim, i, o);                                                       \
            const T gi = load(g[o[0] * g_step]);                                             \
            const T c = partial(op, side, gi, x, o[1], y, o[2], out, o[0]);                  \
            acc[i] = store<S>(has_prev ? load(prev[i]) + c : c);                             \
        }                                                                                    \
    }

BINARY_BWD(add, 0)
BINARY_BWD(sub, 1)
BINARY_BWD(mul, 2)
BINARY_BWD(div, 3)
BINARY_BWD(pow, 4)

// The operand is broadcast: a parallel reduction. A block of 256 threads covers `out_lanes`
// outputs (a power of two) times 256 / out_lanes reduction lanes; `lanes_on_outputs` says which
// of the two varies fastest across a warp, so that neighbouring threads read neighbouring memory.
// The reduced positions are split into `parts` slices, one block each; a thread sums its strided
// share of a slice, the block sums its lanes in shared memory (a tree), and the slice's total goes
// to `acc` (one part: with `prev` added) or to `partials[part * outputs + output]`, which
// `reduce_finish` adds up in order. No atomics: the result does not depend on scheduling.
#define BINARY_REDUCE(name, op)                                                              \
    template <typename S>                                                                    \
    __global__ void name##_bwd_reduce(                                                       \
        const S* g, long long g_step, const S* x, const S* y, const S* out,                  \
        const long long* dims, int kept_ndim, int reduced_ndim, int side, long long outputs, \
        long long reduced, int out_lanes, int lanes_on_outputs, int parts,                   \
        compute_t<S>* partials, const S* prev, S* acc, int has_prev) {                       \
        typedef compute_t<S> T;                                                              \
        __shared__ T lanes[256];                                                             \
        const int red_lanes = blockDim.x / out_lanes;                                        \
        const int t = threadIdx.x;                                                           \
        const int out_lane = lanes_on_outputs ? t % out_lanes : t / red_lanes;               \
        const int red_lane = lanes_on_outputs ? t / out_lanes : t % red_lanes;               \
        const long long tiles = (outputs + out_lanes - 1) / out_lanes;                       \
        for (long long b = blockIdx.x; b < tiles * parts; b += gridDim.x) {                  \
            const long long i = (b % tiles) * out_lanes + out_lane;                          \
            const int part = (int)(b / tiles);                                               \
            T total = T(0);                                                                  \
            if (i < outputs) {                                                               \
                long long k[3], r[3];                                                        \
                offsets(dims, kept_ndim, i, k);                                              \
                for (long long j = (long long)part * red_lanes + red_lane; j < reduced;      \
                     j += (long long)parts * red_lanes) {                                    \
                    offsets(dims + 4 * kept_ndim, reduced_ndim, j, r);                       \
                    const long long at = k[0] + r[0];                                        \
                    total += partial(op, side, load(g[at * g_step]), x, k[1] + r[1], y,      \
                                     k[2] + r[2], out, at);                                  \
                }                                                                            \
            }                                                                                \
            lanes[red_lane * out_lanes + out_lane] = total;                                  \
            __syncthreads();                                                                 \
            for (int w = red_lanes / 2; w > 0; w /= 2) {                                     \
                if (red_lane < w)                                                            \
                    lanes[red_lane * out_lanes + out_lane] +=                                \
                        lanes[(red_lane + w) * out_lanes + out_lane];                        \
                __syncthreads();                                                             \
            }                                                                                \
            if (red_lane == 0 && i < outputs) {                                              \
                const T sum = lanes[out_lane];                                               \
                if (parts > 1)                                                               \
                    partials[(long long)part * outputs + i] = sum;                           \
                else                                                                         \
                    acc[i] = store<S>(has_prev ? load(prev[i]) + sum : sum);                 \
            }                                                                                \
            __syncthreads();                                                                 \
        }                                                                                    \
    }

BINARY_REDUCE(add, 0)
BINARY_REDUCE(sub, 1)
BINARY_REDUCE(mul, 2)
BINARY_REDUCE(div, 3)
BINARY_REDUCE(pow, 4)

// The slices' totals of each output, added in order: acc = prev + sum of partials[., i].
template <typename S>
__global__ void reduce_finish(const compute_t<S>* partials, long long outputs, int parts,
                              const S* prev, S* acc, int has_prev) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < outputs;
         i += (long long)blockDim.x * gridDim.x) {
        compute_t<S> sum = partials[i];
        for (int p = 1; p < parts; ++p) sum += partials[(long long)p * outputs + i];
        acc[i] = store<S>(has_prev ? load(prev[i]) + sum : sum);
    }
}
