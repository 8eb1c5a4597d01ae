// Comparisons, maximum, minimum and clip by one bound in generated kernels, as the library of
// the arrays computes them, so that a fused expression agrees with the generic path on the
// whole domain. Generated code writes a comparison TG_DAZ(a) < TG_DAZ(b), maximum and minimum
// TG_MAXIMUM(a, b) and TG_MINIMUM(a, b) (the _FIRST forms for float16 in tg.compile's regions),
// and a clip by one bound TG_CLIP_LO(x, lo) or TG_CLIP_HI(x, hi) (_FIRST for float16); a
// kernel over a storage type S (tg.broadcast's) writes TG_MAXIMUM_OF(S, a, b), and the sign of
// x TG_ZERO_OF_SIGN(S, x, sign).
//
// The NVRTC build computes CuPy's arrays, as CuPy does. CuPy compiles every kernel, these too,
// with -ftz=true: a float operation reads a subnormal operand as a zero of its sign. Its
// comparisons (a kernel each) do; a comparison inside a fused expression may not, as ptxas
// drops the flush from `x < 0` where it makes integer code of a selection of two constants. So
// TG_DAZ flushes a float operand itself, by its bits (doubles are never flushed). CuPy's
// maximum is nan where either operand is, else fmax (fmin for minimum), which orders -0 below
// +0: a tie of +0 and -0 gives +0 for maximum and -0 for minimum, on either side; float16 and
// bfloat16 are computed in float, as CuPy computes them. A clip by one bound (the Array API's,
// which CuPy's arrays take from array_api_compat) keeps x unless it is below lo (above hi).
//
// The host build computes NumPy's arrays, as NumPy does: no flush; maximum keeps its first
// operand where it is greater or nan, else the second (so the second on a tie of +0 and -0), as
// NumPy's float32 and float64 loops and ml_dtypes' bfloat16; the _FIRST forms keep the first
// on a tie, as NumPy's float16 loops. A clip by one bound is NumPy's maximum (minimum).

#ifndef TG_COMPARE_CUH
#define TG_COMPARE_CUH

// NumPy computes `array ** 0.5`, `** 2` and `** -1` by sqrt, a square and a reciprocal (its
// fast scalar powers, which differ from pow at -inf and -0.0); CuPy by pow.
#ifdef __CUDACC__
#define TG_FAST_POWERS 0
#else
#define TG_FAST_POWERS 1
#endif

#ifdef __CUDACC__
__device__ __forceinline__ float tg_daz(float x) {
    const unsigned int bits = __float_as_uint(x);
    return (bits & 0x7f800000u) ? x : __uint_as_float(bits & 0x80000000u);
}

__device__ __forceinline__ double tg_daz(double x) { return x; }

#define TG_DAZ(x) tg_daz(x)
#define TG_MAXIMUM(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : fmax(TG_DAZ(a), TG_DAZ(b)))
#define TG_MINIMUM(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : fmin(TG_DAZ(a), TG_DAZ(b)))
#define TG_MAXIMUM_FIRST(a, b) TG_MAXIMUM(a, b)
#define TG_MINIMUM_FIRST(a, b) TG_MINIMUM(a, b)
#define TG_CLIP_LO(x, lo) (TG_DAZ(x) < TG_DAZ(lo) ? (lo) : (x))
#define TG_CLIP_HI(x, hi) (TG_DAZ(x) > TG_DAZ(hi) ? (hi) : (x))
#define TG_CLIP_LO_FIRST(x, lo) TG_CLIP_LO(x, lo)
#define TG_CLIP_HI_FIRST(x, hi) TG_CLIP_HI(x, hi)
#define TG_MAXIMUM_OF(S, a, b) TG_MAXIMUM(a, b)
#define TG_MINIMUM_OF(S, a, b) TG_MINIMUM(a, b)
#define TG_ZERO_OF_SIGN(S, x, sign) (sign)
#else
#define TG_DAZ(x) (x)
#define TG_MAXIMUM(a, b) ((a) > (b) || (a) != (a) ? (a) : (b))
#define TG_MINIMUM(a, b) ((a) < (b) || (a) != (a) ? (a) : (b))
#define TG_MAXIMUM_FIRST(a, b) ((a) >= (b) || (a) != (a) ? (a) : (b))
#define TG_MINIMUM_FIRST(a, b) ((a) <= (b) || (a) != (a) ? (a) : (b))
#define TG_CLIP_LO(x, lo) TG_MAXIMUM(x, lo)
#define TG_CLIP_HI(x, hi) TG_MINIMUM(x, hi)
#define TG_CLIP_LO_FIRST(x, lo) TG_MAXIMUM_FIRST(x, lo)
#define TG_CLIP_HI_FIRST(x, hi) TG_MINIMUM_FIRST(x, hi)
// In a kernel over the storage type S (tg.broadcast's): the _FIRST rule for float16's
// and ml_dtypes' bfloat16 sign keeps the sign of a zero (NumPy's types give +0)
template <typename S> struct tg_ties_first { enum { value = 0 }; };
template <typename S> struct tg_signed_zero_sign { enum { value = 0 }; };
#ifdef TG_HALF_CUH
template <> struct tg_ties_first<tg_half> { enum { value = 1 }; };
template <> struct tg_signed_zero_sign<tg_bfloat16> { enum { value = 1 }; };
#endif
#define TG_ZERO_OF_SIGN(S, x, sign) (tg_signed_zero_sign<S>::value && (x) == 0 ? (x) : (sign))
#define TG_MAXIMUM_OF(S, a, b) \
    (tg_ties_first<S>::value ? TG_MAXIMUM_FIRST(a, b) : TG_MAXIMUM(a, b))
#define TG_MINIMUM_OF(S, a, b) \
    (tg_ties_first<S>::value ? TG_MINIMUM_FIRST(a, b) : TG_MINIMUM(a, b))
#endif

#endif
