//! Matrix products for the trainer: `C ← A·B + β·C` over slices with arbitrary strides, so
//! the backward pass reads transposes without copying them.
//!
//! matrixmultiply's sgemm sums each output element over `k` in an order fixed by `k` alone,
//! so splitting the rows or columns of `C` over threads changes no bit: a training step is
//! deterministic however many threads run it.

use rayon::prelude::*;

/// A matrix view: `data[offset + i·row + j·col]` is element `(i, j)`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) offset: usize,
    pub(crate) row: usize,
    pub(crate) col: usize,
}

impl<'a> View<'a> {
    /// A row-major matrix whose rows are `width` apart.
    pub(crate) fn rows(data: &'a [f32], width: usize) -> View<'a> {
        View { data, offset: 0, row: width, col: 1 }
    }

    /// The transpose of a row-major matrix whose rows are `width` apart.
    pub(crate) fn transposed(data: &'a [f32], width: usize) -> View<'a> {
        View { data, offset: 0, row: 1, col: width }
    }

    /// The same view starting `offset` elements further.
    pub(crate) fn at(self, offset: usize) -> View<'a> {
        View { offset: self.offset + offset, ..self }
    }

    fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows > 0 && cols > 0 {
            let last = self.offset + (rows - 1) * self.row + (cols - 1) * self.col;
            assert!(
                last < self.data.len(),
                "{what}: a {rows}×{cols} view past the end of its {} values",
                self.data.len()
            );
        }
    }
}

/// The output: `data[offset + i·row + j]`.
pub(crate) struct Out<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) offset: usize,
    pub(crate) row: usize,
}

impl<'a> Out<'a> {
    /// A row-major matrix whose rows are `width` apart.
    pub(crate) fn rows(data: &'a mut [f32], width: usize) -> Out<'a> {
        Out { data, offset: 0, row: width }
    }
}

/// A pointer into a buffer that parallel jobs write in disjoint places.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(*mut f32);

impl SharedMut {
    pub(crate) fn new(data: &mut [f32]) -> SharedMut {
        SharedMut(data.as_mut_ptr())
    }

    /// The pointer (a method, so that closures capture the whole `SharedMut`, which is Sync).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: every user writes disjoint elements from each job (see the uses).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

/// `C (m×n) ← A (m×k) · B (k×n) + β·C`, split over the cores along the longer side of C.
pub(crate) fn gemm(m: usize, k: usize, n: usize, a: View<'_>, b: View<'_>, beta: f32, c: Out<'_>) {
    gemm_with(m, k, n, a, b, beta, c, rayon::current_num_threads())
}

/// [`gemm`] on the calling thread alone (inside an already parallel loop).
pub(crate) fn gemm_serial(m: usize, k: usize, n: usize, a: View<'_>, b: View<'_>, beta: f32, c: Out<'_>) {
    gemm_with(m, k, n, a, b, beta, c, 1)
}

#[allow(clippy::too_many_arguments)]
fn gemm_with(m: usize, k: usize, n: usize, a: View<'_>, b: View<'_>, beta: f32, c: Out<'_>, threads: usize) {
    if m == 0 || n == 0 {
        return;
    }
    a.check(m, k, "A");
    b.check(k, n, "B");
    assert!(c.offset + (m - 1) * c.row + n <= c.data.len() && c.row >= n, "C: a {m}×{n} output past its end");
    let base = SharedMut::new(c.data);
    let run = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        // SAFETY: bounds checked above; each call writes its own block of rows × cols.
        unsafe {
            matrixmultiply::sgemm(
                rows.len(),
                k,
                cols.len(),
                1.0,
                a.data.as_ptr().add(a.offset + rows.start * a.row),
                a.row as isize,
                a.col as isize,
                b.data.as_ptr().add(b.offset + cols.start * b.col),
                b.row as isize,
                b.col as isize,
                beta,
                base.get().add(c.offset + rows.start * c.row + cols.start),
                c.row as isize,
                1,
            );
        }
    };
    // Small products are not worth a thread.
    let parts = if m * n * k < 1 << 16 { 1 } else { threads.max(1) };
    if parts == 1 {
        run(0..m, 0..n);
    } else if m >= n {
        let size = m.div_ceil(parts);
        (0..parts).into_par_iter().for_each(|p| run((p * size).min(m)..((p + 1) * size).min(m), 0..n));
    } else {
        // Column blocks of 16, matching the kernel's panels.
        let size = n.div_ceil(parts).next_multiple_of(16);
        (0..parts).into_par_iter().for_each(|p| run(0..m, (p * size).min(n)..((p + 1) * size).min(n)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn products_and_transposes_agree_with_the_definition_on_any_thread_count() {
        let (m, k, n) = (37, 29, 70);
        let a: Vec<f32> = (0..m * k).map(|v| ((v * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|v| ((v * 5 % 11) as f32 - 5.0) / 4.0).collect();
        let expected = naive(m, k, n, &a, &b);
        let mut results = Vec::new();
        for threads in [1, 2, 3] {
            let mut c = vec![1.0; m * n];
            gemm_with(m, k, n, View::rows(&a, k), View::rows(&b, n), 0.0, Out::rows(&mut c, n), threads);
            results.push(c);
        }
        for c in &results {
            assert_eq!(c, &results[0], "bits depend on the thread count");
            assert!(c.iter().zip(&expected).all(|(x, y)| (x - y).abs() < 1e-4));
        }
        // Bᵀ read through strides: (Bᵀ)ᵀ = B, accumulated onto C.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut c = results[0].clone();
        gemm(m, k, n, View::rows(&a, k), View::transposed(&bt, k), 1.0, Out::rows(&mut c, n));
        assert!(c.iter().zip(&expected).all(|(x, y)| (x - 2.0 * y).abs() < 1e-3));
    }
}
