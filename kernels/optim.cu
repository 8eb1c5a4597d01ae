// Optimiser steps: one launch per parameter, reading the parameter, its gradient and its state
// and writing the new parameter and state to fresh buffers (an update never mutates the old
// model or state). Scalars are passed by value. One thread per element, grid-stride.

#define FOR_EACH(i)                                                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
         i += (long long)blockDim.x * gridDim.x)

// x -= eta * dx
template <typename T>
__global__ void descent_step(const T* x, const T* dx, T* x_out, long long n, T eta) {
    FOR_EACH(i) { x_out[i] = x[i] - eta * dx[i]; }
}

// v = rho * v + eta * dx; x -= v
template <typename T>
__global__ void momentum_step(const T* x, const T* dx, const T* v, T* x_out, T* v_out,
                              long long n, T eta, T rho) {
    FOR_EACH(i) {
        const T velocity = rho * v[i] + eta * dx[i];
        v_out[i] = velocity;
        x_out[i] = x[i] - velocity;
    }
}

// Optimisers.jl's Nesterov: x -= (1 + rho) * eta * dx - rho^2 * v; v = rho * v - eta * dx
template <typename T>
__global__ void nesterov_step(const T* x, const T* dx, const T* v, T* x_out, T* v_out,
                              long long n, T eta, T rho) {
    FOR_EACH(i) {
        x_out[i] = x[i] - ((T(1) + rho) * eta * dx[i] - rho * rho * v[i]);
        v_out[i] = rho * v[i] - eta * dx[i];
    }
}

// Adam and AdamW: the moments and the parameter in one pass. bias1 = 1 - beta1^t and
// bias2 = 1 - beta2^t fold the bias corrections into scalars (Kingma & Ba, end of section 2).
// With `couple`, x -= eta * (adam + decay * x); without, x -= eta * adam + decay * x.
template <typename T>
__global__ void adam_step(const T* x, const T* dx, const T* m, const T* v, T* x_out, T* m_out,
                          T* v_out, long long n, T eta, T beta1, T beta2, T epsilon, T bias1,
                          T bias2, T decay, int couple) {
    const T root_bias2 = sqrt(bias2);
    FOR_EACH(i) {
        const T g = dx[i];
        const T m1 = beta1 * m[i] + (T(1) - beta1) * g;
        const T v1 = beta2 * v[i] + (T(1) - beta2) * g * g;
        const T adam = m1 / (sqrt(v1) + epsilon * root_bias2) * (root_bias2 / bias1);
        const T delta = couple ? eta * (adam + decay * x[i]) : eta * adam + decay * x[i];
        m_out[i] = m1;
        v_out[i] = v1;
        x_out[i] = x[i] - delta;
    }
}
