// Sums of squares, with the scalar g read on the device (never copied to the host): the pullback
// of sum(abs2, x), acc = prev + x * (g * 2), and of the mean (or summed) squared error. Each is
// the generic rule's formula, operation for operation. One thread per element, grid-stride.
// `prev` may alias `acc` (an in-place add).

template <typename T>
__global__ void sumsq_bwd_acc(const T* x, const T* g, const T* prev, T* acc, long long n,
                              int has_prev) {
    const T scale = g[0] * T(2);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const T c = x[i] * scale;
        acc[i] = has_prev ? prev[i] + c : c;
    }
}

// Squared error: acc = prev + (yhat - y) * (g * factor) for yhat (side 0), (y - yhat) * (...)
// for y (side 1); factor is 2 / n for a mean over n elements, 2 for a sum.
template <typename T>
__global__ void mse_bwd_acc(const T* yhat, const T* y, const T* g, T factor, int side,
                            const T* prev, T* acc, long long n, int has_prev) {
    const T scale = g[0] * factor;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const T c = (side ? y[i] - yhat[i] : yhat[i] - y[i]) * scale;
        acc[i] = has_prev ? prev[i] + c : c;
    }
}
