// Storage types and compute types. A kernel written as `template <typename S>` is instantiated
// for a storage type S: float, double, tg_half (IEEE binary16, NumPy's float16) or tg_bfloat16
// (the top 16 bits of a float, ml_dtypes' bfloat16). It computes in `compute_t<S>`: S itself for
// float and double, float for the two half types. `load(p[i])` widens a stored element (exact),
// `store<S>(v)` rounds a computed value to the storage type, to nearest even, once: subnormals
// are kept, values past the largest finite round to infinity, nan stays nan.
//
// The half types are plain 2-byte structs, the same on the device and the host, so the text
// needs no include path. On the device the conversions are the hardware's `cvt` instructions
// (what CUDA's __half and __nv_bfloat16 use; bfloat16's needs sm_80); on the host they are the
// integer definitions below, checked bit for bit against NumPy and ml_dtypes.

#ifndef TG_HALF_CUH
#define TG_HALF_CUH

struct tg_half { unsigned short bits; };
struct tg_bfloat16 { unsigned short bits; };

template <typename S> struct Compute { typedef S type; };
template <> struct Compute<tg_half> { typedef float type; };
template <> struct Compute<tg_bfloat16> { typedef float type; };
template <typename S> using compute_t = typename Compute<S>::type;

// Elements of a memory-bound elementwise loop per thread and pass, their loads issued before
// any of them is used: with one element per thread, too few bytes are in flight to fill the
// memory bandwidth of an H100 or H200 (by Little's law, about 1 of the 3 MB it needs). Such a
// kernel is launched with a quarter of the threads (`per_thread` in cuda/fused.py).
#define TG_PER_THREAD 4

#ifdef __CUDA_ARCH__
__device__ __forceinline__ float tg_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short tg_float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float tg_bfloat16_to_float(unsigned short b) {
    return __uint_as_float((unsigned int)b << 16);
}

__device__ __forceinline__ unsigned short tg_float_to_bfloat16(float f) {
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}
#else
#include <cstring>

static inline unsigned int tg_bits_of(float f) {
    unsigned int u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

static inline float tg_float_of(unsigned int u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

#if defined(__F16C__) && defined(__FLT16_MAX__)
// The compiler's _Float16, where the host build is made for an x86 CPU with F16C (the fused
// loops of tg.compile, built with -march=native): its conversions are F16C's instructions, the
// same correctly rounded conversions as the integer definitions below (nan widened quiet too),
// in one instruction each.
static inline float tg_half_to_float(unsigned short h) {
    _Float16 v;
    std::memcpy(&v, &h, sizeof v);
    return (float)v;
}

static inline unsigned short tg_float_to_half(float f) {
    const _Float16 v = (_Float16)f;  // to nearest even
    unsigned short h;
    std::memcpy(&h, &v, sizeof h);
    return h;
}
#else
// A nan is widened quiet, as the hardware's conversions give it: the C++ library's pow treats a
// signalling nan as no nan (pow(nan, 0) is 1 on the device and in NumPy, nan here otherwise).
static inline float tg_half_to_float(unsigned short h) {
    const unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
    const unsigned int exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1fu && mantissa) return tg_float_of(sign | 0x7fc00000u | mantissa << 13);
    if (exponent == 0x1fu) return tg_float_of(sign | 0x7f800000u);  // inf
    if (exponent) return tg_float_of(sign | (exponent + 112u) << 23 | mantissa << 13);
    const float magnitude = (float)mantissa * 5.9604644775390625e-8f;  // subnormal: m 2^-24
    return sign ? -magnitude : magnitude;
}

static inline unsigned short tg_float_to_half(float f) {
    const unsigned int u = tg_bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | (a >> 13 & 0x3ffu));  // nan
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf
    if (a >= 0x38800000u) {  // a normal half (>= 2^-14): rebias, round the 13 bits dropped
        const unsigned int r = a - 0x38000000u;
        return (unsigned short)(sign | (r + 0xfffu + (r >> 13 & 1u)) >> 13);
    }
    // subnormal or zero: adding 0.5 leaves the multiple of 2^-24 nearest |f| (ties to even)
    // in the low bits, by the float addition's own rounding
    const float shifted = tg_float_of(a) + 0.5f;
    return (unsigned short)(sign | (tg_bits_of(shifted) - 0x3f000000u));
}
#endif

static inline float tg_bfloat16_to_float(unsigned short b) {
    const unsigned int u = (unsigned int)b << 16;
    return tg_float_of((u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u);  // nan: quiet
}

static inline unsigned short tg_float_to_bfloat16(float f) {
    const unsigned int u = tg_bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(u >> 16 | 0x40u);  // quiet nan
    return (unsigned short)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}
#endif

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ double load(double v) { return v; }
__device__ __forceinline__ float load(tg_half v) { return tg_half_to_float(v.bits); }
__device__ __forceinline__ float load(tg_bfloat16 v) { return tg_bfloat16_to_float(v.bits); }

template <typename S>
__device__ __forceinline__ S store(compute_t<S> v) {
    return v;
}

template <>
__device__ __forceinline__ tg_half store<tg_half>(float v) {
    return tg_half{tg_float_to_half(v)};
}

template <>
__device__ __forceinline__ tg_bfloat16 store<tg_bfloat16>(float v) {
    return tg_bfloat16{tg_float_to_bfloat16(v)};
}

#endif
