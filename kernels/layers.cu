// The hot parts of layers: the statistics of the normalisation layers and an LSTM cell's gates,
// each the generic rule's formula, operation for operation (tracker_gpu/rules/nn.py).
//
// normalise: x is a contiguous (outer, groups, inner) array and each group k is normalised over
// its outer * inner members, (outer, inner) in row-major order: LayerNorm and GroupNorm have
// outer = 1, BatchNorm has its batch outside the channels and the positions inside. One block
// per group (grid-stride over the groups), its threads striding over the members, the sums
// reduced in shared memory (blockDim.x a power of two, at most 256). `prev` may alias `acc`.

template <typename T>
__device__ T block_sum(T value) {
    __shared__ T lanes[256];
    const int t = threadIdx.x;
    lanes[t] = value;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (t < w) lanes[t] = lanes[t] + lanes[t + w];
        __syncthreads();
    }
    const T result = lanes[0];
    __syncthreads();  // lanes is reused by the next sum
    return result;
}

#define FOR_EACH_GROUP(k) for (long long k = blockIdx.x; k < groups; k += gridDim.x)
#define FOR_EACH_MEMBER(i, k)                                                       \
    for (long long j = threadIdx.x, i = 0; j < outer * inner; j += blockDim.x)      \
        if ((i = (j / inner * groups + k) * inner + j % inner), true)

// The group's mean and sqrt(mean((x - mean)^2) + eps), each sum divided by the count.
template <typename T>
__device__ void moments(const T* x, long long outer, long long groups, long long inner,
                        long long k, T eps, T* mean, T* sigma) {
    const T count = T(outer * inner);
    T s = T(0);
    FOR_EACH_MEMBER(i, k) s += x[i];
    const T m = block_sum(s) / count;
    T q = T(0);
    FOR_EACH_MEMBER(i, k) {
        const T c = x[i] - m;
        q += c * c;
    }
    *mean = m;
    *sigma = sqrt(block_sum(q) / count + eps);
}

// y = (x - mean) / sigma
template <typename T>
__global__ void normalise_fwd(const T* x, T* y, long long outer, long long groups,
                              long long inner, T eps) {
    FOR_EACH_GROUP(k) {
        T m, sigma;
        moments(x, outer, groups, inner, k, eps, &m, &sigma);
        FOR_EACH_MEMBER(i, k) y[i] = (x[i] - m) / sigma;
    }
}

// acc = prev + ((g - mean(g)) - y * mean(g * y)) / sigma, sigma recomputed from x
template <typename T>
__global__ void normalise_bwd_acc(const T* x, const T* y, const T* g, const T* prev, T* acc,
                                  long long outer, long long groups, long long inner, T eps,
                                  int has_prev) {
    const T count = T(outer * inner);
    FOR_EACH_GROUP(k) {
        T m, sigma;
        moments(x, outer, groups, inner, k, eps, &m, &sigma);
        T sg = T(0), sgy = T(0);
        FOR_EACH_MEMBER(i, k) {
            sg += g[i];
            sgy += g[i] * y[i];
        }
        const T mean_g = block_sum(sg) / count;
        const T mean_gy = block_sum(sgy) / count;
        FOR_EACH_MEMBER(i, k) {
            const T c = ((g[i] - mean_g) - y[i] * mean_gy) / sigma;
            acc[i] = has_prev ? prev[i] + c : c;
        }
    }
}

// An LSTM cell: z (rows, 4h) holds the pre-activations of the gates input, forget, cell and
// output; c (rows, h) the cell state, its rows `c_stride` elements apart (the cell state of the
// step before is the second half of that step's out); out (rows, 2h) gets [h', c']. One thread
// per (row, unit).
#define FOR_EACH_UNIT(n)                                                                  \
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < rows * hidden; \
         n += (long long)blockDim.x * gridDim.x)

// sigmoid as the generic rule computes it: e = exp(-|x|), then 1 / (1 + e) or e / (1 + e)
template <typename T>
__device__ T sigmoid_of(T x) {
    const T e = exp(-fabs(x));
    return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}

// c' = f * c + i * tanh(u), h' = o * tanh(c')
template <typename T>
__global__ void lstm_fwd(const T* z, const T* c, T* out, long long rows, long long hidden,
                         long long c_stride) {
    FOR_EACH_UNIT(n) {
        const long long r = n / hidden, j = n % hidden;
        const T* zr = z + r * 4 * hidden;
        const T i = sigmoid_of(zr[j]), f = sigmoid_of(zr[hidden + j]);
        const T o = sigmoid_of(zr[3 * hidden + j]);
        const T c_new = f * c[r * c_stride + j] + i * tanh(zr[2 * hidden + j]);
        out[r * 2 * hidden + j] = o * tanh(c_new);
        out[r * 2 * hidden + hidden + j] = c_new;
    }
}

// From g (rows, 2h), the gradient of [h', c']: with t = tanh(c') and u = tanh(z_cell),
//   dc' = g_c + g_h * o * (1 - t * t)
//   dz = [dc' * u * (i * (1 - i)), dc' * c * (f * (1 - f)), dc' * i * (1 - u * u),
//         g_h * t * (o * (1 - o))],  dc = dc' * f
// added to prev_z and prev_c (each may alias its acc; both contiguous) where want_z and want_c
// say so.
template <typename T>
__global__ void lstm_bwd_acc(const T* z, const T* c, const T* out, const T* g, const T* prev_z,
                             T* acc_z, const T* prev_c, T* acc_c, long long rows,
                             long long hidden, long long c_stride, int want_z, int has_prev_z,
                             int want_c, int has_prev_c) {
    FOR_EACH_UNIT(n) {
        const long long r = n / hidden, j = n % hidden;
        const T* zr = z + r * 4 * hidden;
        const T i = sigmoid_of(zr[j]), f = sigmoid_of(zr[hidden + j]);
        const T o = sigmoid_of(zr[3 * hidden + j]);
        const T u = tanh(zr[2 * hidden + j]);
        const T t = tanh(out[r * 2 * hidden + hidden + j]);
        const T g_h = g[r * 2 * hidden + j], g_c = g[r * 2 * hidden + hidden + j];
        const T d_c = g_c + g_h * o * (T(1) - t * t);
        if (want_z) {
            const T old = c[r * c_stride + j];
            const T parts[4] = {d_c * u * (i * (T(1) - i)), d_c * old * (f * (T(1) - f)),
                                d_c * i * (T(1) - u * u), g_h * t * (o * (T(1) - o))};
            for (int q = 0; q < 4; ++q) {
                const long long k = r * 4 * hidden + q * hidden + j;
                acc_z[k] = has_prev_z ? prev_z[k] + parts[q] : parts[q];
            }
        }
        if (want_c) acc_c[n] = has_prev_c ? prev_c[n] + d_c * f : d_c * f;
    }
}
