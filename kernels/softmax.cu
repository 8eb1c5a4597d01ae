// Row-wise normalisers and losses over the last axis of a contiguous (rows, cols) array: one
// block per row (grid-stride over rows), its threads striding over the columns, with the row's
// maximum and sums reduced in shared memory (blockDim.x a power of two, at most 256). Each result
// is the generic rule's formula, operation for operation: x - max, exp, the sum, a division (or
// log and a subtraction). The maximum propagates nan, as the generic max does. `prev` may alias
// `acc`.

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

template <typename T>
__device__ T row_max(const T* row, long long cols) {
    T m = row[0];
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = larger(m, row[j]);
    return block_reduce(m, true);
}

// sum(exp(row - m)) for the row's maximum m.
template <typename T>
__device__ T row_sum_exp(const T* row, long long cols, T m) {
    T s = T(0);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += exp(row[j] - m);
    return block_reduce(s, false);
}

template <typename T>
__device__ T row_sum(const T* row, long long cols) {
    T s = T(0);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += row[j];
    return block_reduce(s, false);
}

#define FOR_EACH_ROW(r) for (long long r = blockIdx.x; r < rows; r += gridDim.x)
#define FOR_EACH_COLUMN(j) for (long long j = threadIdx.x; j < cols; j += blockDim.x)

// y = exp(x - max) / sum(exp(x - max))
template <typename T>
__global__ void softmax_fwd(const T* x, T* y, long long rows, long long cols) {
    FOR_EACH_ROW(r) {
        const T* xr = x + r * cols;
        const T m = row_max(xr, cols);
        const T s = row_sum_exp(xr, cols, m);
        FOR_EACH_COLUMN(j) y[r * cols + j] = exp(xr[j] - m) / s;
    }
}

// y = (x - max) - log(sum(exp(x - max)))
template <typename T>
__global__ void logsoftmax_fwd(const T* x, T* y, long long rows, long long cols) {
    FOR_EACH_ROW(r) {
        const T* xr = x + r * cols;
        const T m = row_max(xr, cols);
        const T log_s = log(row_sum_exp(xr, cols, m));
        FOR_EACH_COLUMN(j) y[r * cols + j] = (xr[j] - m) - log_s;
    }
}

// acc = prev + y * (g - sum(g * y)), y = softmax(x)
template <typename T>
__global__ void softmax_bwd_acc(const T* y, const T* g, const T* prev, T* acc, long long rows,
                                long long cols, int has_prev) {
    FOR_EACH_ROW(r) {
        const T* yr = y + r * cols;
        const T* gr = g + r * cols;
        T dot = T(0);
        FOR_EACH_COLUMN(j) dot += gr[j] * yr[j];
        dot = block_reduce(dot, false);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T c = yr[j] * (gr[j] - dot);
            acc[k] = has_prev ? prev[k] + c : c;
        }
    }
}

// acc = prev + (g - exp(y) * sum(g)), y = logsoftmax(x)
template <typename T>
__global__ void logsoftmax_bwd_acc(const T* y, const T* g, const T* prev, T* acc,
                                   long long rows, long long cols, int has_prev) {
    FOR_EACH_ROW(r) {
        const T* yr = y + r * cols;
        const T* gr = g + r * cols;
        const T total = row_sum(gr, cols);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T c = gr[j] - exp(yr[j]) * total;
            acc[k] = has_prev ? prev[k] + c : c;
        }
    }
}

// Per-row sums of the targets times logsoftmax(x): the loss is minus their sum (over rows, then
// divided by the rows for a mean), computed on the device. A zero target adds nothing, even
// against a class masked with a -inf logit (0 * -inf would be nan), as the generic forward.
template <typename T>
__global__ void logitcrossentropy_fwd(const T* x, const T* t, T* rowsum, long long rows,
                                      long long cols) {
    FOR_EACH_ROW(r) {
        const T* xr = x + r * cols;
        const T* tr = t + r * cols;
        const T m = row_max(xr, cols);
        const T log_s = log(row_sum_exp(xr, cols, m));
        T total = T(0);
        FOR_EACH_COLUMN(j) {
            if (tr[j] != T(0)) total += tr[j] * ((xr[j] - m) - log_s);
        }
        total = block_reduce(total, false);
        if (threadIdx.x == 0) rowsum[r] = total;
    }
}

// Its pullback: acc = prev + (softmax(x) * sum(t) - t) * (g / count), count the rows for a mean
// and 1 for a sum, with g read on the device. With `normalized` the targets each sum to one and
// sum(t) is not computed. The row's softmax is recomputed: nothing is kept between the passes.
template <typename T>
__global__ void logitcrossentropy_bwd_acc(const T* x, const T* t, const T* g, long long count,
                                          int normalized, const T* prev, T* acc, long long rows,
                                          long long cols, int has_prev) {
    const T scale = g[0] / T(count);
    FOR_EACH_ROW(r) {
        const T* xr = x + r * cols;
        const T* tr = t + r * cols;
        const T m = row_max(xr, cols);
        const T s = row_sum_exp(xr, cols, m);
        const T mass = normalized ? T(1) : row_sum(tr, cols);
        FOR_EACH_COLUMN(j) {
            const long long k = r * cols + j;
            const T p = exp(xr[j] - m) / s;
            const T c = ((normalized ? p : p * mass) - tr[j]) * scale;
            acc[k] = has_prev ? prev[k] + c : c;
        }
    }
}
