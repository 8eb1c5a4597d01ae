// Row-wise normalisers and losses over the last axis of a contiguous (rows, cols) array: one
// block per row (grid-stride over rows), its threads striding over the columns, with the row's
// maximum and sums reduced in shared memory (blockDim.x a power of two, at most 256). Each result
// is the generic rule's formula, operation for operation: x - max, exp, the sum, a division (or
// log and a subtraction). The maximum propagates nan, as the generic max does. `prev` may alias
// `acc`. Stored as S, computed in T (half.cuh): a row's maximum, sums and the cross-entropy's
// per-row sums are kept in T.

#include "half.cuh"

template <typename T>
__device__ T larger(T a, T b) {
    return (a != a || a > b) ? a : b;  // nan wins, as in the generic max
}

// The block's maximum (take_max) or sum of one value per thread; every thread gets it.
template <typename T>
__device__ T block_reduce(T value, bool take_max) {
    __shared__ T lanes[256];
    const int t = threadIdx.x;
    lanes[t] = value;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (t < w) lanes[t] = take_max ? larger(lanes[t], lanes[t + w]) : lanes[t] + lanes[t + w];
        __syncthreads();
    }
    const T result = lanes[0];
    __syncthreads();  // lanes is reused by the next reduction
    return result;
}

template <typename S>
__device__ compute_t<S> row_max(const S* row, long long cols) {
    compute_t<S> m = load(row[0]);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = larger(m, load(row[j]));
    return block_reduce(m, true);
}

// sum(exp(row - m)) for the row's maximum m.
template <typename S>
__device__ compute_t<S> row_sum_exp(const S* row, long long cols, compute_t<S> m) {
    compute_t<S> s = 0;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += exp(load(row[j]) - m);
    return block_reduce(s, false);
}

template <typename S>
__device__ compute_t<S> row_sum(const S* row, long long cols) {
    compute_t<S> s = 0;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += load(row[j]);
    return block_reduce(s, false);
}

#define FOR_EACH_ROW(r) for (long long r = blockIdx.x; r < rows; r += gridDim.x)
#define FOR_EACH_COLUMN(j) for (long long j = threadIdx.x; j < cols; j += blockDim.x)

// y = exp(x - max) / sum(exp(x - max))
template <typename S>
__global__ void softmax_fwd(const S* x, S* y, long long rows, long long cols) {
    typedef compute_t<S> T;
    FOR_EACH_ROW(r) {
        const S* xr = x + r * cols;
        const T m = row_max(xr, cols);
        const T s = row_sum_exp(xr, cols, m);
        FOR_EACH_COLUMN(j) y[r * cols + j] = store<S>(exp(load(xr[j]) - m) / s);
    }
}

// y = (x - max) - log(sum(exp(x - max)))
template <typename S>
__global__ void logsoftmax_fwd(const S* x, S* y, long long rows, long long cols) {
    typedef compute_t<S> T;
    FOR_EACH_ROW(r) {
        const S* xr = x + r * cols;
        const T m = row_max(xr, cols);
        const T log_s = log(row_sum_exp(xr, cols, m));
        FOR_EACH_COLUMN(j) y[r * cols + j] = store<S>((load(xr[j]) - m) - log_s);
    }
}

// acc = prev + y * (g - sum(g * y)), y = softmax(x)
template <typename S>
__global__ void softmax_bwd_acc(const S* y, const S* g, const S* prev, S* acc, long long rows,
                                long long cols, int has_prev) {
    typedef compute_t<S> T;
    FOR_EACH_ROW(r) {
        const S* yr = y + r * cols;
        const S* gr = g + r * cols;
        T dot = T(0);
        FOR_EACH_COLUMN(j) dot += load(gr[j]) * load(yr[j]);
        dot = block_reduce(dot, false);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T c = load(yr[j]) * (load(gr[j]) - dot);
            acc[k] = store<S>(has_prev ? load(prev[k]) + c : c);
        }
    }
}

// acc = prev + (g - exp(y) * sum(g)), y = logsoftmax(x)
template <typename S>
__global__ void logsoftmax_bwd_acc(const S* y, const S* g, const S* prev, S* acc,
                                   long long rows, long long cols, int has_prev) {
    typedef compute_t<S> T;
    FOR_EACH_ROW(r) {
        const S* yr = y + r * cols;
        const S* gr = g + r * cols;
        const T total = row_sum(gr, cols);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T c = load(gr[j]) - exp(load(yr[j])) * total;
            acc[k] = store<S>(has_prev ? load(prev[k]) + c : c);
        }
    }
}

// One-hot targets from integer class labels, a row per label: out[r, j] = (labels[r] == j),
// and a row of nan where the label lies outside [0, cols), so the loss is nan, as the generic
// rule's unchecked form (`rules/losses.py`) gives it.
template <typename S>
__global__ void onehot_fwd(const long long* labels, S* out, long long rows, long long cols) {
    typedef compute_t<S> T;
    const T nan = T(__longlong_as_double(0x7ff8000000000000LL));
    FOR_EACH_ROW(r) {
        const long long label = labels[r];
        const bool valid = label >= 0 && label < cols;
        FOR_EACH_COLUMN(j) out[r * cols + j] = store<S>(valid ? T(label == j) : nan);
    }
}

// Per-row sums of the targets times logsoftmax(x): the loss is minus their sum (over rows, then
// divided by the rows for a mean), computed on the device. A zero target adds nothing, even
// against a class masked with a -inf logit (0 * -inf would be nan), as the generic forward.
template <typename S>
__global__ void logitcrossentropy_fwd(const S* x, const S* t, compute_t<S>* rowsum,
                                      long long rows, long long cols) {
    typedef compute_t<S> T;
    FOR_EACH_ROW(r) {
        const S* xr = x + r * cols;
        const S* tr = t + r * cols;
        const T m = row_max(xr, cols);
        const T log_s = log(row_sum_exp(xr, cols, m));
        T total = T(0);
        FOR_EACH_COLUMN(j) {
            const T tj = load(tr[j]);
            if (tj != T(0)) total += tj * ((load(xr[j]) - m) - log_s);
        }
        total = block_reduce(total, false);
        if (threadIdx.x == 0) rowsum[r] = total;
    }
}

// Its pullback: acc = prev + (softmax(x) * sum(t) - t) * (g / count), count the rows for a mean
// and 1 for a sum, with g read on the device. With `normalized` the targets each sum to one and
// sum(t) is not computed. The row's softmax is recomputed: nothing is kept between the passes.
template <typename S>
__global__ void logitcrossentropy_bwd_acc(const S* x, const S* t, const S* g, long long count,
                                          int normalized, const S* prev, S* acc, long long rows,
                                          long long cols, int has_prev) {
    typedef compute_t<S> T;
    const T scale = load(g[0]) / T(count);
    FOR_EACH_ROW(r) {
        const S* xr = x + r * cols;
        const S* tr = t + r * cols;
        const T m = row_max(xr, cols);
        const T s = row_sum_exp(xr, cols, m);
        const T mass = normalized ? T(1) : row_sum(tr, cols);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T p = exp(load(xr[j]) - m) / s;
            const T c = ((normalized ? p : p * mass) - load(tr[j])) * scale;
            acc[k] = store<S>(has_prev ? load(prev[k]) + c : c);
        }
    }
}
