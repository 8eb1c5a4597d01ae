// The special functions of tg.broadcast's generated kernels, as tg_<name>(x) for float and double.
//
// On the device (NVRTC), CUDA's math library where it has the function: erf, erfc, erfinv,
// erfcinv, erfcx, lgamma, tgamma, normcdf, normcdfinv, cyl_bessel_i0/i1, j0, j1, y0, y1, cbrt,
// exp2, sinpi, cospi. What CUDA lacks (digamma, polygamma of order 1 to 24, i0e, i1e) and what
// follows from those (expit, logit, xlogy, xlog1py, entr, log_ndtr, sinc) is written below, the
// same text for the device and the host. The host build (C++ on NumPy arrays) has the C++
// library's erf, erfc, lgamma, tgamma, cbrt, exp2 and glibc's Bessel functions; for the rest of
// CUDA's functions it uses the definitions in `namespace tg_host`, accurate to a few ulps in
// double. On the host the float versions compute in double and round once.
//
// Conventions are SciPy's (the generic path on NumPy): gammaln(-inf) = -inf,
// digamma(+-0) = -+inf, digamma at negative integers nan, polygamma(n, x) at the poles and at
// -inf (-1)^(n+1) inf, j0, j1, y0, y1, i0 and i1 nan at +-inf.

#ifndef TG_SPECIAL_CUH
#define TG_SPECIAL_CUH

#define TG_FN __device__ __forceinline__

#define TG_INF __longlong_as_double(0x7ff0000000000000LL)
#define TG_NAN __longlong_as_double(0x7ff8000000000000LL)
#define TG_PI 3.141592653589793
#define TG_PI_LO 1.2246467991473532e-16
#define TG_SQRT_PI 1.7724538509055159
#define TG_2_SQRT_PI 1.1283791670955126  // 2 / sqrt(pi)

#ifndef __CUDACC__
#include <cfloat>
#include <cmath>

namespace tg_host {
// sin(pi x) and cos(pi x): x reduced exactly to f in [-1/4, 1/4] and a quarter turn k, then
// pi f computed in two parts (hi + lo) so the argument is exact to about 2^-106.
static inline void quarter(double x, double* f, int* k) {
    const double n = std::rint(2.0 * x);  // exact: 2x is exact, and |x| < 2^52 here
    *f = x - 0.5 * n;
    double m = std::fmod(n, 4.0);
    if (m < 0) m += 4.0;
    *k = int(m);
}

static inline void pi_times(double f, double* hi, double* lo) {
    *hi = f * TG_PI;
    *lo = std::fma(f, TG_PI, -*hi) + f * TG_PI_LO;
}

static inline double sin_pi_reduced(double f) {
    double hi, lo;
    pi_times(f, &hi, &lo);
    return std::sin(hi) + std::cos(hi) * lo;
}

static inline double cos_pi_reduced(double f) {
    double hi, lo;
    pi_times(f, &hi, &lo);
    return std::cos(hi) - std::sin(hi) * lo;
}

static inline double sinpi(double x) {
    if (!std::isfinite(x)) return x - x;  // nan
    if (std::fabs(x) >= 4503599627370496.0) return x * 0.0;  // an integer: +-0
    double f;
    int k;
    quarter(x, &f, &k);
    double s = (k & 1) ? cos_pi_reduced(f) : sin_pi_reduced(f);
    s = (k & 2) ? -s : s;
    return s == 0 ? x * 0.0 : s;
}

static inline double cospi(double x) {
    if (!std::isfinite(x)) return x - x;
    if (std::fabs(x) >= 4503599627370496.0) return std::fmod(x, 2.0) == 0 ? 1.0 : -1.0;
    double f;
    int k;
    quarter(std::fabs(x), &f, &k);
    double c = (k & 1) ? sin_pi_reduced(-f) : cos_pi_reduced(f);
    c = (k & 2) ? -c : c;
    return c == 0 ? 0.0 : c;
}

// exp(x^2) erfc(x): erfc with x^2 = s + e exactly for moderate x, a continued product
// (the asymptotic series) beyond 26, where erfc underflows.
static inline double erfcx(double x) {
    if (x != x) return x;
    if (x < -26.7) return TG_INF;
    const double s = x * x, e = std::fma(x, x, -s);
    if (x < 0) return 2.0 * std::exp(s) * (1.0 + e) - erfcx(-x);
    if (x < 26.0) return std::exp(s) * std::erfc(x) * (1.0 + e);
    if (x > 1e8) return 1.0 / (x * TG_SQRT_PI);
    const double u = 1.0 / (2.0 * s);
    double term = 1.0, sum = 1.0;
    for (int k = 1; k < 14; ++k) {
        term *= -(2 * k - 1) * u;
        sum += term;
    }
    return sum / (x * TG_SQRT_PI);
}

// The root of erfc(x) = z for 0 < z <= 1/2 (x >= 0.47), by Newton's method on
// log(erfc(x)) = log(erfcx(x)) - x^2, which is concave: from sqrt(-log z), right of the root,
// the iterates decrease to it.
static inline double erfc_root(double z) {
    const double target = std::log(z);
    double x = std::sqrt(-target);
    for (int i = 0; i < 60; ++i) {
        const double r = erfcx(x);
        const double s = x * x, e = std::fma(x, x, -s);
        const double g = (std::log(r) - s - e) - target;
        const double step = g * r / TG_2_SQRT_PI;  // g / g', g' = -2/sqrt(pi) / erfcx
        x += step;
        if (std::fabs(step) <= 1e-9 * x) break;  // quadratic: the error is now ~step^2
    }
    return x;
}

// erf(x) = a for 0 < a <= 1/2, by Halley's method on erf (x <= 0.48, all well conditioned).
static inline double erf_root(double a) {
    double x = a * (TG_SQRT_PI / 2);
    for (int i = 0; i < 8; ++i) {
        const double u = (std::erf(x) - a) / (TG_2_SQRT_PI * std::exp(-x * x));
        x -= u / (1.0 + x * u);
    }
    return x;
}

static inline double erfinv(double y) {
    const double a = std::fabs(y);
    if (!(a <= 1.0)) return TG_NAN;
    if (a == 1.0) return std::copysign(TG_INF, y);
    if (a == 0.0) return y;
    return std::copysign(a <= 0.5 ? erf_root(a) : erfc_root(1.0 - a), y);  // 1 - a exact
}

static inline double erfcinv(double z) {
    if (!(z >= 0.0 && z <= 2.0)) return TG_NAN;
    if (z == 0.0) return TG_INF;
    if (z > 1.0) return -erfcinv(2.0 - z);  // exact
    if (z > 0.5) return erfinv(1.0 - z);    // exact
    return erfc_root(z);
}

// The standard normal distribution: erfc(-x / sqrt 2) / 2 with x / sqrt(2) in two parts.
static inline double normcdf(double x) {
    const double c = 0.7071067811865476, c_lo = -4.833646656726457e-17;
    const double p = x * c;
    const double t = -p, t_lo = -(std::fma(x, c, -p) + x * c_lo);
    if (!std::isfinite(t)) return 0.5 * std::erfc(t);
    return 0.5 * (std::erfc(t) - TG_2_SQRT_PI * std::exp(-t * t) * t_lo);
}

static inline double normcdfinv(double p) {
    const double r = erfcinv(2.0 * p);  // 2p exact
    if (!std::isfinite(r) || r == 0) return r == 0 ? 0.0 : -r;
    return -(1.4142135623730951 * r + -9.667293313452913e-17 * r);
}

// I0(x) and I1(x) / x as their power series in (x/2)^2 (positive terms, summed with
// compensation), for |x| <= 20.
static inline double bessel_i_series(double x, int order) {
    const double q = 0.25 * x * x;
    double term = order ? 0.5 : 1.0, sum = term, carry = 0.0;
    for (int k = 1; k < 200 && term > 1e-18 * sum; ++k) {
        term *= q / (double(k) * double(k + order));
        const double y = term - carry, t = sum + y;
        carry = (t - sum) - y;
        sum = t;
    }
    return sum;
}
}  // namespace tg_host
#endif

// exp(-|x|) I_order(|x|) for |x| > 20: the asymptotic series (Hankel's), every term until it
// stops shrinking.
TG_FN double tg_bessel_ie_asymptotic(double x, int order) {
    const double mu = 4.0 * order * order;
    double term = 1.0, sum = 1.0;
    for (int k = 1; k < 60; ++k) {
        const double next = term * ((2 * k - 1) * (2 * k - 1) - mu) / (8.0 * k * x);
        if (fabs(next) >= fabs(term) || !(fabs(next) > 1e-18 * sum)) break;
        term = next;
        sum += term;
    }
    return sum / (2.5066282746310002 * sqrt(x));  // sqrt(2 pi x), finite up to DBL_MAX
}

// --- digamma and polygamma
// The root of digamma (hi + lo) and digamma's Taylor coefficients there, c[k] = psi^(k+1)/(k+1)!.
#define TG_DIGAMMA_ROOT 1.4616321449683622
#define TG_DIGAMMA_ROOT_LO 9.549995429965697e-17
TG_FN double tg_digamma_near_root(double d) {
    const double c[40] = {
        0.9676722454476212, -0.4427631689835921, 0.258499760955651, -0.16394270544240652,
        0.10782405069126237, -0.07219956125645471, 0.04880428816414311, -0.03316112647484736,
        0.022597648232218104, -0.01542476590494896, 0.010538791616612175, -0.007204534386356869,
        0.004926781395729853, -0.003369801655439328, 0.002305126326734928,
        -0.0015769367714301972, 0.0010788252019162967, -0.0007380709389960052,
        0.000504953265834602, -0.0003454680251063077, 0.00023635601564027053,
        -0.00016170622091974803, 0.0001106337276874741, -7.569179582195066e-05,
        5.178575795222081e-05, -3.5430070947659604e-05, 2.424006611860132e-05,
        -1.6584242271854135e-05, 1.134638458466385e-05, -7.762817668462094e-06,
        5.3110609208898636e-06, -3.6336507898010456e-06, 2.486022733129538e-06,
        -1.7008538854332607e-06, 1.1636675363548843e-06, -7.96142543124197e-07,
        5.446941930669446e-07, -3.7266161283438227e-07, 2.549626552021554e-07,
        -1.7443695117727745e-07};
    double p = c[39];
    for (int k = 38; k >= 0; --k) p = p * d + c[k];
    return p * d;
}

TG_FN double tg_sinpi_d(double x);
TG_FN double tg_cospi_d(double x);

// digamma(x) for x >= 16: log x - 1/(2x) - sum of B_2k / (2k x^2k).
TG_FN double tg_digamma_asymptotic(double x) {
    const double b[7] = {1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240, 1.0 / 132,
                         -691.0 / 32760, 1.0 / 12};
    const double w = 1.0 / (x * x);
    double p = b[6];
    for (int k = 5; k >= 0; --k) p = p * w + b[k];
    return log(x) - 0.5 / x - p * w;
}

TG_FN double tg_digamma_d(double x) {
    if (x != x || x == TG_INF) return x;
    if (x == 0) return -1.0 / x;  // -inf at +0, +inf at -0 (SciPy)
    if (x < 0) {
        if (x == floor(x)) return TG_NAN;  // a pole (and -inf)
        // reflection: psi(x) = psi(1 - x) - pi cot(pi x)
        return tg_digamma_d(1.0 - x) - TG_PI * tg_cospi_d(x) / tg_sinpi_d(x);
    }
    if (x >= 16.0) return tg_digamma_asymptotic(x);
    // to y within 1/2 of the root, by psi(y + 1) = psi(y) + 1/y: exact steps (y - 1 and
    // 1 + y - 1 here), positive terms, little cancellation
    double sum = 0.0, y = x;
    if (y < 0.9616) {
        sum = -1.0 / y;
        y += 1.0;
    }
    while (y > 1.9616) {
        y -= 1.0;
        sum += 1.0 / y;
    }
    return tg_digamma_near_root((y - TG_DIGAMMA_ROOT) - TG_DIGAMMA_ROOT_LO) + sum;
}

// polygamma(n, x), 1 <= n <= 24: for x > 0 the recurrence up to x >= 20 + 2n, then the
// asymptotic series; for x < 0 the reflection psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1)
// P_n(cot pi x), with P_0(c) = c and P_(k+1)(c) = -(1 + c^2) P_k'(c).
#define TG_POLYGAMMA_MAX 24
TG_FN double tg_polygamma_d(int n, double x) {
    if (n == 0) return tg_digamma_d(x);
    if (n < 0 || n > TG_POLYGAMMA_MAX || x != x) return TG_NAN;
    const double sign = (n & 1) ? 1.0 : -1.0;  // (-1)^(n+1)
    if (x == TG_INF) return sign * 0.0;
    if (x <= 0 && x == floor(x)) return sign * TG_INF;  // poles, and -inf as SciPy
    if (x < 0) {
        double p[TG_POLYGAMMA_MAX + 2] = {0.0, 1.0};  // P_0(c) = c
        for (int k = 0; k < n; ++k) {  // degree k + 1 -> k + 2
            double q[TG_POLYGAMMA_MAX + 2] = {0.0};
            for (int j = 1; j <= k + 1; ++j) {  // -(1 + c^2) * j p_j c^(j-1)
                q[j - 1] -= j * p[j];
                q[j + 1] -= j * p[j];
            }
            for (int j = 0; j <= k + 2; ++j) p[j] = q[j];
        }
        const double c = tg_cospi_d(x) / tg_sinpi_d(x);
        double v = p[n + 1];
        for (int j = n; j >= 0; --j) v = v * c + p[j];
        const double reflected = tg_polygamma_d(n, 1.0 - x);
        return ((n & 1) ? -reflected : reflected) - pow(TG_PI, n + 1) * v;
    }
    double factorial = 1.0;  // n!
    for (int k = 2; k <= n; ++k) factorial *= k;
    double sum = 0.0;
    const double start = 20.0 + 2 * n;
    for (; x < start; x += 1.0) sum += pow(x, -(n + 1));
    // (n-1)!/x^n + n!/(2 x^(n+1)) + sum_k B_2k/(2k)! (2k+n-1)!/x^(2k+n)
    const double b[12] = {1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600,
                          2.08767569878681e-08, -5.284190138687493e-10,
                          1.3382536530684679e-11, -3.3896802963225827e-13,
                          8.586062056277845e-15, -2.174868698558062e-16,
                          5.5090028283602295e-18, -1.3954464685812522e-19};
    const double lead = factorial / n / pow(x, n);  // (n-1)!/x^n
    double ratio = 1.0, series = 1.0 + n / (2.0 * x);
    for (int k = 1; k <= 12; ++k) {
        ratio *= (n + 2.0 * k - 2) * (n + 2.0 * k - 1) / (x * x);
        const double term = b[k - 1] * ratio;
        series += term;
        if (fabs(term) < 1e-18 * series) break;
    }
    return sign * (factorial * sum + lead * series);
}

// --- the functions CUDA has, under one name for the device and the host
#ifdef __CUDACC__
#define TG_UNARY(f, device_double, device_float, host_double)                   \
    __device__ __forceinline__ double tg_##f(double x) { return device_double(x); } \
    __device__ __forceinline__ float tg_##f(float x) { return device_float(x); }
#else
#define TG_UNARY(f, device_double, device_float, host_double)            \
    static inline double tg_##f(double x) { return host_double(x); }     \
    static inline float tg_##f(float x) { return float(host_double(double(x))); }
#endif

TG_UNARY(erf, erf, erff, std::erf)
TG_UNARY(erfc, erfc, erfcf, std::erfc)
TG_UNARY(erfinv, erfinv, erfinvf, tg_host::erfinv)
TG_UNARY(erfcinv, erfcinv, erfcinvf, tg_host::erfcinv)
TG_UNARY(erfcx, erfcx, erfcxf, tg_host::erfcx)
TG_UNARY(lgamma, lgamma, lgammaf, std::lgamma)
TG_UNARY(gamma, tgamma, tgammaf, std::tgamma)
TG_UNARY(ndtr, normcdf, normcdff, tg_host::normcdf)
TG_UNARY(ndtri, normcdfinv, normcdfinvf, tg_host::normcdfinv)
TG_UNARY(bessel_j0, j0, j0f, ::j0)
TG_UNARY(bessel_j1, j1, j1f, ::j1)
TG_UNARY(bessel_y0, y0, y0f, ::y0)
TG_UNARY(bessel_y1, y1, y1f, ::y1)
TG_UNARY(cbrt, cbrt, cbrtf, std::cbrt)
TG_UNARY(exp2, exp2, exp2f, std::exp2)
TG_UNARY(sinpi, sinpi, sinpif, tg_host::sinpi)
TG_UNARY(cospi, cospi, cospif, tg_host::cospi)

TG_FN double tg_sinpi_d(double x) { return tg_sinpi(x); }
TG_FN double tg_cospi_d(double x) { return tg_cospi(x); }

// --- the functions CUDA lacks, and those written from the others
#define TG_DOUBLE_ONLY(f)                                                  \
    TG_FN float tg_##f(float x) { return float(tg_##f(double(x))); }

TG_FN double tg_gammaln(double x) { return x == -TG_INF ? x : tg_lgamma(x); }  // SciPy's limit
TG_DOUBLE_ONLY(gammaln)
TG_FN double tg_digamma(double x) { return tg_digamma_d(x); }
TG_DOUBLE_ONLY(digamma)
TG_FN double tg_polygamma(double n, double x) { return tg_polygamma_d(int(n), x); }
TG_FN float tg_polygamma(float n, float x) { return float(tg_polygamma_d(int(n), double(x))); }

TG_FN double tg_i0e(double x) {
    const double a = fabs(x);
    if (a <= 20.0) {
#ifdef __CUDACC__
        return cyl_bessel_i0(a) * exp(-a);
#else
        return tg_host::bessel_i_series(a, 0) * exp(-a);
#endif
    }
    return a == TG_INF ? 0.0 : tg_bessel_ie_asymptotic(a, 0);
}
TG_DOUBLE_ONLY(i0e)

TG_FN double tg_i1e(double x) {
    const double a = fabs(x);
    double v;
    if (a <= 20.0) {
#ifdef __CUDACC__
        v = cyl_bessel_i1(a) * exp(-a);
#else
        v = a * tg_host::bessel_i_series(a, 1) * exp(-a);
#endif
    } else {
        v = a == TG_INF ? 0.0 : tg_bessel_ie_asymptotic(a, 1);
    }
    return x < 0 ? -v : v;
}
TG_DOUBLE_ONLY(i1e)

#ifdef __CUDACC__
TG_UNARY(bessel_i0, cyl_bessel_i0, cyl_bessel_i0f, cyl_bessel_i0)
TG_UNARY(bessel_i1, cyl_bessel_i1, cyl_bessel_i1f, cyl_bessel_i1)
#else
// I0 and I1 from the series, or from the scaled functions times exp(|x|) (in two halves, so
// that the result overflows only where I0 does).
static inline double tg_bessel_i0(double x) {
    const double a = std::fabs(x);
    if (a <= 20.0) return tg_host::bessel_i_series(a, 0);
    if (a == TG_INF) return a;
    const double h = std::exp(0.5 * a);
    return tg_i0e(a) * h * h;
}
static inline double tg_bessel_i1(double x) {
    const double a = std::fabs(x);
    double v;
    if (a <= 20.0) {
        v = a * tg_host::bessel_i_series(a, 1);
    } else if (a == TG_INF) {
        v = a;
    } else {
        const double h = std::exp(0.5 * a);
        v = tg_i1e(a) * h * h;
    }
    return x < 0 ? -v : v;
}
TG_DOUBLE_ONLY(bessel_i0)
TG_DOUBLE_ONLY(bessel_i1)
#endif

// SciPy's (and CuPy's) convention: j0, j1, y0, y1, i0 and i1 are nan at +-inf.
#define TG_NAN_AT_INF(f)                                                     \
    template <typename T>                                                    \
    TG_FN T tg_##f(T x) { return x - x != x - x ? x - x : tg_bessel_##f(x); }
TG_NAN_AT_INF(j0)
TG_NAN_AT_INF(j1)
TG_NAN_AT_INF(y0)
TG_NAN_AT_INF(y1)
TG_NAN_AT_INF(i0)
TG_NAN_AT_INF(i1)

// 1 / (1 + exp(-x)), without overflow on either side.
template <typename T>
TG_FN T tg_expit(T x) {
    if (x >= T(0)) return T(1) / (T(1) + exp(-x));
    const T e = exp(x);
    return e / (T(1) + e);
}

// log(p / (1 - p)); near p = 1/2 as log1p((2p - 1) / (1 - p)), 2p - 1 exact there.
template <typename T>
TG_FN T tg_logit(T p) {
    if (p >= T(0.25) && p <= T(0.75)) return log1p((T(2) * p - T(1)) / (T(1) - p));
    return log(p / (T(1) - p));
}

// x log(y) and x log1p(y), 0 where x == 0 and y is not nan (SciPy).
template <typename T>
TG_FN T tg_xlogy(T x, T y) { return x == T(0) && y == y ? T(0) : x * log(y); }
template <typename T>
TG_FN T tg_xlog1py(T x, T y) { return x == T(0) && y == y ? T(0) : x * log1p(y); }

// -x log(x): 0 at 0, -inf below.
template <typename T>
TG_FN T tg_entr(T x) {
    if (x > T(0)) return -x * log(x);
    return x == T(0) ? T(0) : (x < T(0) ? -T(TG_INF) : x);
}

// NumPy's sinc: sin(pi x) / (pi x), with x = 1e-20 standing for 0.
template <typename T>
TG_FN T tg_sinc(T x) {
    const T t = T(TG_PI) * (x == T(0) ? T(1e-20) : x);
    return sin(t) / t;
}

// log(ndtr(x)): log1p(-ndtr(-x)) above 0; log(ndtr(x)) down to -20; below, with
// erfc(t) = exp(-t^2) erfcx(t), -x^2/2 + log(erfcx(-x / sqrt 2) / 2).
TG_FN double tg_log_ndtr(double x) {
    if (x > 0) return log1p(-tg_ndtr(-x));
    if (x > -20.0) return log(tg_ndtr(x));
#ifdef __CUDACC__
    const double r = erfcx(-x * 0.7071067811865476);
#else
    const double r = tg_host::erfcx(-x * 0.7071067811865476);
#endif
    return -0.5 * x * x + log(0.5 * r);
}
TG_DOUBLE_ONLY(log_ndtr)

#endif  // TG_SPECIAL_CUH
