// Optimiser steps: one launch per parameter, reading the parameter, its gradient and its state
// and writing the new parameter and state to fresh buffers (an update never mutates the old
// model or state). Each is the generic rule's formula, operation for operation, with the same
// scalars (computed once on the host in double precision and passed by value). One thread per
// element, grid-stride.

#define FOR_EACH(i)                                                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
         i += (long long)blockDim.x * gridDim.x)

// x - dx * eta
template <typename T>
__global__ void descent_step(const T* x, const T* dx, T* x_out, long long n, T eta) {
    FOR_EACH(i) { x_out[i] = x[i] - dx[i] * eta; }
}

// v = v * rho + dx * eta; x - v
template <typename T>
__global__ void momentum_step(const T* x, const T* dx, const T* v, T* x_out, T* v_out,
                              long long n, T eta, T rho) {
    FOR_EACH(i) {
        const T velocity = v[i] * rho + dx[i] * eta;
        v_out[i] = velocity;
        x_out[i] = x[i] - velocity;
    }
}

// Optimisers.jl's Nesterov: x - (dx * ((1 + rho) * eta) - v * rho^2); v = v * rho - dx * eta
template <typename T>
__global__ void nesterov_step(const T* x, const T* dx, const T* v, T* x_out, T* v_out,
                              long long n, T eta, T rho, T lead, T rho_squared) {
    FOR_EACH(i) {
        x_out[i] = x[i] - (dx[i] * lead - v[i] * rho_squared);
        v_out[i] = v[i] * rho - dx[i] * eta;
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
template <typename T>
__global__ void adam_step(const T* x, const T* dx, const T* m, const T* v, T* x_out, T* m_out,
                          T* v_out, long long n, T one_minus_beta1, T one_minus_beta2,
                          T epsilon_term, T scale, T eta, T eta_scale, T decay, int mode) {
    FOR_EACH(i) {
        const T g = dx[i];
        const T m1 = (g - m[i]) * one_minus_beta1 + m[i];
        const T v1 = (g * g - v[i]) * one_minus_beta2 + v[i];
        const T direction = m1 / (sqrt(v1) + epsilon_term);
        T delta;
        if (mode == 0)
            delta = direction * eta_scale;
        else if (mode == 1)
            delta = (direction * scale + x[i] * decay) * eta;
        else
            delta = direction * scale * eta + x[i] * decay;
        m_out[i] = m1;
        v_out[i] = v1;
        x_out[i] = x[i] - delta;
    }
}
