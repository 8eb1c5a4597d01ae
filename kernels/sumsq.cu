// Sums of squares. sum(abs2, x): the pullback acc = prev + 2 * x * g, and the mean squared error,
// with the scalar g read on the device (never copied to the host). One thread per element,
// grid-stride. `prev` may alias `acc` (an in-place add).

template <typename T>
__global__ void sumsq_bwd_acc(const T* x, const T* g, const T* prev, T* acc, long long n,
                              int has_prev) {
    const T scale = 2 * g[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const T base = has_prev ? prev[i] : T(0);
        acc[i] = base + scale * x[i];
    }
}

// Mean (or summed) squared error pullback: acc = prev + sign * 2 * (yhat - y) * g / count, with
// count the number of elements for a mean and 1 for a sum; sign is +1 for yhat, -1 for y. One
// thread per element.
template <typename T>
__global__ void mse_bwd_acc(const T* yhat, const T* y, const T* g, long long count, int sign,
                            const T* prev, T* acc, long long n, int has_prev) {
    const T scale = T(2 * sign) * g[0] / T(count);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        acc[i] = (has_prev ? prev[i] : T(0)) + scale * (yhat[i] - y[i]);
    }
}
