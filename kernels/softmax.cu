// Row-wise normalisers and losses over the last axis of a contiguous (rows, cols) array: one
// thread per row, looping over the columns (small models: tens to thousands of classes).
// Forwards are numerically stable (the row maximum is subtracted). `prev` may alias `acc`.

template <typename T>
__device__ T row_max(const T* row, long long cols) {
    T m = row[0];
    for (long long j = 1; j < cols; ++j) m = row[j] > m ? row[j] : m;
    return m;
}

// sum(exp(row - m)) for the row's maximum m: softmax is exp(row - m) / this, which keeps its
// relative error at the float's epsilon (exp(row - logsumexp) would not, for large rows).
template <typename T>
__device__ T row_sum_exp(const T* row, long long cols, T m) {
    T s = T(0);
    for (long long j = 0; j < cols; ++j) s += exp(row[j] - m);
    return s;
}

#define FOR_EACH_ROW(r)                                                                      \
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows;           \
         r += (long long)blockDim.x * gridDim.x)

template <typename T>
__global__ void softmax_fwd(const T* x, T* y, long long rows, long long cols) {
    FOR_EACH_ROW(r) {
        const T m = row_max(x + r * cols, cols);
        const T s = row_sum_exp(x + r * cols, cols, m);
        for (long long j = 0; j < cols; ++j) y[r * cols + j] = exp(x[r * cols + j] - m) / s;
    }
}

template <typename T>
__global__ void logsoftmax_fwd(const T* x, T* y, long long rows, long long cols) {
    FOR_EACH_ROW(r) {
        const T m = row_max(x + r * cols, cols);
        const T log_s = log(row_sum_exp(x + r * cols, cols, m));
        for (long long j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] - m - log_s;
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
        for (long long j = 0; j < cols; ++j) dot += gr[j] * yr[j];
        for (long long j = 0; j < cols; ++j) {
            const long long k = r * cols + j;
            acc[k] = (has_prev ? prev[k] : T(0)) + yr[j] * (gr[j] - dot);
        }
    }
}

// acc = prev + g - exp(y) * sum(g), y = logsoftmax(x)
template <typename T>
__global__ void logsoftmax_bwd_acc(const T* y, const T* g, const T* prev, T* acc,
                                   long long rows, long long cols, int has_prev) {
    FOR_EACH_ROW(r) {
        const T* yr = y + r * cols;
        const T* gr = g + r * cols;
        T total = T(0);
        for (long long j = 0; j < cols; ++j) total += gr[j];
        for (long long j = 0; j < cols; ++j) {
            const long long k = r * cols + j;
            acc[k] = (has_prev ? prev[k] : T(0)) + gr[j] - exp(yr[j]) * total;
        }
    }
}

// Per-row cross-entropy of logits against targets shaped like them (one-hot or probabilities):
// loss[r] = sum_j t[r, j] * (logsumexp(x[r]) - x[r, j]).
template <typename T>
__global__ void logitcrossentropy_fwd(const T* x, const T* t, T* loss, long long rows,
                                      long long cols) {
    FOR_EACH_ROW(r) {
        const T* xr = x + r * cols;
        const T* tr = t + r * cols;
        const T m = row_max(xr, cols);
        const T lse = m + log(row_sum_exp(xr, cols, m));
        T total = T(0);
        for (long long j = 0; j < cols; ++j) total += tr[j] * (lse - xr[j]);
        loss[r] = total;
    }
}

// Its pullback, scaled by the scalar g / count read on the device (count: the rows for a mean,
// 1 for a sum): acc = prev + g / count * (softmax(x) * sum(t) - t); with `normalized` the targets
// each sum to one and sum(t) is not computed. The row's softmax is recomputed: nothing is kept
// between the passes.
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
        T mass = T(1);
        if (!normalized) {
            mass = T(0);
            for (long long j = 0; j < cols; ++j) mass += tr[j];
        }
        for (long long j = 0; j < cols; ++j) {
            const long long k = r * cols + j;
            acc[k] = (has_prev ? prev[k] : T(0)) + scale * (exp(xr[j] - m) / s * mass - tr[j]);
        }
    }
}
