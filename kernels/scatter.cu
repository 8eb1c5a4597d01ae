// Scatter-add in a fixed order: z[sorted[k]] += values[order[k]], the elements of each position
// added in the order `order` lists them, one rounding each, as NumPy's add.at adds (the
// pullback of indexing by integer arrays: an embedding's gradient). `sorted` holds the flat
// positions in a stable order and `order` the element of `values` each one came from. The thread
// at the first element of a run of equal positions adds up the whole run, so each element of z
// is written by one thread: no atomics, and the sums do not depend on how the threads are
// scheduled (CuPy's own scatter-add adds with atomics, in whatever order they land).

#include "half.cuh"

template <typename S>
__global__ void scatter_add_ordered(const long long* sorted, const long long* order,
                                    const S* values, S* z, long long n) {
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
         k += (long long)blockDim.x * gridDim.x) {
        const long long p = sorted[k];
        if (k > 0 && sorted[k - 1] == p)
            continue;
        S acc = z[p];
        for (long long j = k; j < n && sorted[j] == p; ++j)
            acc = store<S>(load(acc) + load(values[order[j]]));
        z[p] = acc;
    }
}
