// Optimiser steps: one launch per parameter, reading the parameter, its gradient and its state
// and writing the new parameter and state to fresh buffers (an update never mutates the old
// model or state). Each is the generic rule's formula, operation for operation, with the same
// scalars (computed once on the host in double precision and passed by value). One thread per
// element, grid-stride. Stored as S, computed in T (half.cuh), the scalars passed as T. No two
// buffers overlap (the outputs are fresh), as `__restrict__` tells the compilers: the host's
// (`cuda/native.py`) vectorises the loops only so.

#include "half.cuh"

#define FOR_EACH(i)                                                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
         i += (long long)blockDim.x * gridDim.x)

// x - dx * eta
template <typename S>
__global__ void descent_step(const S* __restrict__ x, const S* __restrict__ dx,
                             S* __restrict__ x_out, long long n, compute_t<S> eta) {
    FOR_EACH(i) { x_out[i] = store<S>(load(x[i]) - load(dx[i]) * eta); }
}

// v = v * rho + dx * eta; x - v
template <typename S>
__global__ void momentum_step(const S* __restrict__ x, const S* __restrict__ dx,
                              const S* __restrict__ v, S* __restrict__ x_out,
                              S* __restrict__ v_out, long long n, compute_t<S> eta,
                              compute_t<S> rho) {
    FOR_EACH(i) {
        const compute_t<S> velocity = load(v[i]) * rho + load(dx[i]) * eta;
        v_out[i] = store<S>(velocity);
        x_out[i] = store<S>(load(x[i]) - velocity);
    }
}

// Optimisers.jl's Nesterov: x - (dx * ((1 + rho) * eta) - v * rho^2); v = v * rho - dx * eta
template <typename S>
__global__ void nesterov_step(const S* __restrict__ x, const S* __restrict__ dx,
                              const S* __restrict__ v, S* __restrict__ x_out,
                              S* __restrict__ v_out, long long n, compute_t<S> eta,
                              compute_t<S> rho, compute_t<S> lead, compute_t<S> rho_squared) {
    FOR_EACH(i) {
        const compute_t<S> xi = load(x[i]), dxi = load(dx[i]), vi = load(v[i]);
        x_out[i] = store<S>(xi - (dxi * lead - vi * rho_squared));
        v_out[i] = store<S>(vi * rho - dxi * eta);
    }
}

// Adam and AdamW, the moments and the parameter in one pass:
//   m = (dx - m) * (1 - beta1) + m;  v = (dx * dx - v) * (1 - beta2) + v
//   direction = m / (sqrt(v) + epsilon * sqrt(1 - beta2^t))
// and with scale = sqrt(1 - beta2^t) / (1 - beta1^t) (the bias corrections folded into scalars,
// Kingma & Ba, end of section 2), the step is
//   mode 0 (Adam):           direction * (eta * scale)
//   mode 1 (AdamW, coupled): (direction * scale + x * decay) * eta
//   mode 2 (AdamW):          direction * scale * eta + x * decay
template <typename S>
__global__ void adam_step(const S* __restrict__ x, const S* __restrict__ dx,
                          const S* __restrict__ m, const S* __restrict__ v,
                          S* __restrict__ x_out, S* __restrict__ m_out,
                          S* __restrict__ v_out, long long n, compute_t<S> one_minus_beta1,
                          compute_t<S> one_minus_beta2, compute_t<S> epsilon_term,
                          compute_t<S> scale, compute_t<S> eta, compute_t<S> eta_scale,
                          compute_t<S> decay, int mode) {
    typedef compute_t<S> T;
    FOR_EACH(i) {
        const T g = load(dx[i]), mi = load(m[i]), vi = load(v[i]), xi = load(x[i]);
        const T m1 = (g - mi) * one_minus_beta1 + mi;
        const T v1 = (g * g - vi) * one_minus_beta2 + vi;
        const T direction = m1 / (sqrt(v1) + epsilon_term);
        T delta;
        if (mode == 0)
            delta = direction * eta_scale;
        else if (mode == 1)
            delta = (direction * scale + xi * decay) * eta;
        else
            delta = direction * scale * eta + xi * decay;
        m_out[i] = store<S>(m1);
        v_out[i] = store<S>(v1);
        x_out[i] = store<S>(xi - delta);
    }
}

// The loss scaler's check (`precision.finite_flag`): whether every element of up to eight arrays
// of one storage type is finite, each block writing whether its share of them is into
// partial[blockIdx.x] (the caller reduces the partials). Array k is x_k of n_k elements (n_k = 0
// for a slot not used). A value v is finite exactly when v - v is 0 (inf - inf and nan are nan).
template <typename S>
__global__ void finite_partials(const S* x0, const S* x1, const S* x2, const S* x3, const S* x4,
                                const S* x5, const S* x6, const S* x7, long long n0,
                                long long n1, long long n2, long long n3, long long n4,
                                long long n5, long long n6, long long n7,
                                unsigned char* partial) {
    typedef compute_t<S> T;
    __shared__ int lanes[256];
    const S* xs[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
    const long long ns[8] = {n0, n1, n2, n3, n4, n5, n6, n7};
    int finite = 1;
    for (int k = 0; k < 8; ++k) {
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < ns[k];
             i += (long long)blockDim.x * gridDim.x) {
            const T v = load(xs[k][i]);
            finite &= (v - v == T(0));
        }
    }
    const int t = threadIdx.x;
    lanes[t] = finite;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (t < w) lanes[t] &= lanes[t + w];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = (unsigned char)lanes[0];
}
