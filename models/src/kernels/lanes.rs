//! Sixteen lanes, a panel's [`LANES`](super::LANES) columns, in the registers of one
//! instruction set: two AVX2 registers ([`Avx2`]) or one AVX-512 register ([`Avx512`]). The
//! matrix products and the attention's value sums are written once over [`Lanes`] and compiled
//! for each set by a thin `#[target_feature]` wrapper that inlines them. Every operation works
//! lane by lane, so the two sets give the same bits, and a kernel's arithmetic reads as its
//! portable twin's.
//!
//! The methods are `#[inline(always)]` and unsafe: they compile to their instructions only
//! inside a function that enables the set's features, which their callers must be.

use std::arch::x86_64::{
    __m256, __m256i, __m512, __m512i, _mm_loadu_si128, _mm256_add_epi32, _mm256_add_ps, _mm256_cvtepi8_epi16,
    _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_mul_ps,
    _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_storeu_ps, _mm512_add_ps,
    _mm512_cvtepi8_epi16, _mm512_cvtepi32_ps, _mm512_dpwssd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_storeu_ps,
};

use super::KvValue;

/// Sixteen F32 lanes, and sixteen 32-bit integer lanes ([`Lanes::Int`]).
///
/// # Safety
/// Every method needs its implementation's CPU features (see each type), and pointers must
/// be readable or writable for the sixteen lanes (the bytes said).
pub(super) trait Lanes: Copy {
    /// Sixteen 32-bit integers (or, as loaded by [`Lanes::widen_pairs`], 32 of 16 bits).
    type Int: Copy;
    unsafe fn zero() -> Self;
    unsafe fn zero_int() -> Self::Int;
    unsafe fn splat(value: f32) -> Self;
    unsafe fn load(from: *const f32) -> Self;
    /// Sixteen cached keys or values, widened exactly to F32.
    unsafe fn load_values<T: KvValue>(from: *const T) -> Self;
    unsafe fn store(self, to: *mut f32);
    unsafe fn add(self, other: Self) -> Self;
    unsafe fn mul(self, other: Self) -> Self;
    /// `self · a + b`, rounded once.
    unsafe fn mul_add(self, a: Self, b: Self) -> Self;
    /// 32 int8 weights, a pair per lane (two inputs of one column), sign-extended to 16 bits.
    unsafe fn widen_pairs(from: *const i8) -> Self::Int;
    /// `sums` plus, in each lane, its pair of weights times `pair` (two 16-bit inputs, the
    /// first in the low half): exact, as long as the sums stay within 32 bits.
    unsafe fn dot_pairs(sums: Self::Int, pair: i32, weights: Self::Int) -> Self::Int;
    unsafe fn to_float(ints: Self::Int) -> Self;
}

/// Two AVX2 registers of eight lanes (needs AVX2, FMA and F16C).
#[derive(Clone, Copy)]
pub(super) struct Avx2([__m256; 2]);

/// One AVX-512 register (needs AVX-512 F; [`Lanes::widen_pairs`] BW and [`Lanes::dot_pairs`]
/// VNNI too).
#[derive(Clone, Copy)]
pub(super) struct Avx512(__m512);

// Every `unsafe` block below: the caller's CPU features and readable or writable lanes, as
// `Lanes` requires.
impl Lanes for Avx2 {
    type Int = [__m256i; 2];

    #[inline(always)]
    unsafe fn zero() -> Avx2 {
        unsafe { Avx2([_mm256_setzero_ps(); 2]) }
    }

    #[inline(always)]
    unsafe fn zero_int() -> [__m256i; 2] {
        unsafe { [_mm256_setzero_si256(); 2] }
    }

    #[inline(always)]
    unsafe fn splat(value: f32) -> Avx2 {
        unsafe { Avx2([_mm256_set1_ps(value); 2]) }
    }

    #[inline(always)]
    unsafe fn load(from: *const f32) -> Avx2 {
        unsafe { Avx2([_mm256_loadu_ps(from), _mm256_loadu_ps(from.add(8))]) }
    }

    #[inline(always)]
    unsafe fn load_values<T: KvValue>(from: *const T) -> Avx2 {
        unsafe { Avx2([T::load8(from), T::load8(from.add(8))]) }
    }

    #[inline(always)]
    unsafe fn store(self, to: *mut f32) {
        unsafe {
            _mm256_storeu_ps(to, self.0[0]);
            _mm256_storeu_ps(to.add(8), self.0[1]);
        }
    }

    #[inline(always)]
    unsafe fn add(self, other: Avx2) -> Avx2 {
        unsafe { Avx2([_mm256_add_ps(self.0[0], other.0[0]), _mm256_add_ps(self.0[1], other.0[1])]) }
    }

    #[inline(always)]
    unsafe fn mul(self, other: Avx2) -> Avx2 {
        unsafe { Avx2([_mm256_mul_ps(self.0[0], other.0[0]), _mm256_mul_ps(self.0[1], other.0[1])]) }
    }

    #[inline(always)]
    unsafe fn mul_add(self, a: Avx2, b: Avx2) -> Avx2 {
        unsafe { Avx2([_mm256_fmadd_ps(self.0[0], a.0[0], b.0[0]), _mm256_fmadd_ps(self.0[1], a.0[1], b.0[1])]) }
    }

    #[inline(always)]
    unsafe fn widen_pairs(from: *const i8) -> [__m256i; 2] {
        unsafe {
            [
                _mm256_cvtepi8_epi16(_mm_loadu_si128(from.cast())),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(from.add(16).cast())),
            ]
        }
    }

    #[inline(always)]
    unsafe fn dot_pairs(sums: [__m256i; 2], pair: i32, weights: [__m256i; 2]) -> [__m256i; 2] {
        unsafe {
            let pair = _mm256_set1_epi32(pair);
            [
                _mm256_add_epi32(sums[0], _mm256_madd_epi16(pair, weights[0])),
                _mm256_add_epi32(sums[1], _mm256_madd_epi16(pair, weights[1])),
            ]
        }
    }

    #[inline(always)]
    unsafe fn to_float(ints: [__m256i; 2]) -> Avx2 {
        unsafe { Avx2([_mm256_cvtepi32_ps(ints[0]), _mm256_cvtepi32_ps(ints[1])]) }
    }
}

impl Lanes for Avx512 {
    type Int = __m512i;

    #[inline(always)]
    unsafe fn zero() -> Avx512 {
        unsafe { Avx512(_mm512_setzero_ps()) }
    }

    #[inline(always)]
    unsafe fn zero_int() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn splat(value: f32) -> Avx512 {
        unsafe { Avx512(_mm512_set1_ps(value)) }
    }

    #[inline(always)]
    unsafe fn load(from: *const f32) -> Avx512 {
        unsafe { Avx512(_mm512_loadu_ps(from)) }
    }

    #[inline(always)]
    unsafe fn load_values<T: KvValue>(from: *const T) -> Avx512 {
        unsafe { Avx512(T::load16(from)) }
    }

    #[inline(always)]
    unsafe fn store(self, to: *mut f32) {
        unsafe { _mm512_storeu_ps(to, self.0) }
    }

    #[inline(always)]
    unsafe fn add(self, other: Avx512) -> Avx512 {
        unsafe { Avx512(_mm512_add_ps(self.0, other.0)) }
    }

    #[inline(always)]
    unsafe fn mul(self, other: Avx512) -> Avx512 {
        unsafe { Avx512(_mm512_mul_ps(self.0, other.0)) }
    }

    #[inline(always)]
    unsafe fn mul_add(self, a: Avx512, b: Avx512) -> Avx512 {
        unsafe { Avx512(_mm512_fmadd_ps(self.0, a.0, b.0)) }
    }

    #[inline(always)]
    unsafe fn widen_pairs(from: *const i8) -> __m512i {
        unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(from.cast())) }
    }

    #[inline(always)]
    unsafe fn dot_pairs(sums: __m512i, pair: i32, weights: __m512i) -> __m512i {
        unsafe {
            // `vpdpwssd`: the `vpmaddwd` and the add of the AVX2 version in one instruction.
            _mm512_dpwssd_epi32(sums, _mm512_set1_epi32(pair), weights)
        }
    }

    #[inline(always)]
    unsafe fn to_float(ints: __m512i) -> Avx512 {
        unsafe { Avx512(_mm512_cvtepi32_ps(ints)) }
    }
}

/// Stores a kernel's accumulators, one per row, into the rows of `sums`.
///
/// # Safety
/// The CPU must have `L`'s features.
#[inline(always)]
pub(super) unsafe fn store_rows<L: Lanes>(acc: &[L], sums: &mut super::Tile) {
    for (sums, acc) in sums.iter_mut().zip(acc) {
        // SAFETY: each row of `sums` holds LANES = 16 floats; the caller's features.
        unsafe { acc.store(sums.as_mut_ptr()) };
    }
}
