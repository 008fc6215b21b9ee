//! The forward pass's fork-join: helper threads that spin between calls instead of sleeping.
//!
//! A decoding step runs about ten short parallel loops per layer (300 for SmolLM2), each a
//! fraction of a millisecond. Rayon's idle workers go to sleep after a few rounds of yielding,
//! and waking one costs tens of microseconds on a virtual machine, paid at every loop: measured,
//! one core decoded 1 to 4 sequences as fast as two. Here the helpers spin for a while after
//! each call (the next loop of the step comes within microseconds), then park until woken.
//! Parts are handed out one at a time from a counter, so a helper that starts late takes fewer
//! (of the many rows of a row loop; a product has a part per thread).
//!
//! Which part runs where never changes a result, as long as parts write disjoint outputs and
//! depend on nothing shared that their order could change (each sampled sequence has its own
//! random state).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks, and how long a caller spins for the last
/// parts before it yields its core between looks.
const SPIN: Duration = Duration::from_micros(200);

/// Runs `work(part)` for every part in `0..parts` on the calling thread and up to
/// `threads - 1` helpers, and returns when all have run; a part's panic is raised again here,
/// after every part ended. Rayon's pool runs the parts instead when the helpers are taken
/// (two models multiplying at once, or a part that calls this again) and when the caller is
/// one of rayon's workers (which must stay free to help rayon's own jobs).
pub(crate) fn for_each_part(parts: usize, threads: usize, work: &(dyn Fn(usize) + Sync)) {
    if parts <= 1 || threads <= 1 {
        (0..parts).for_each(work);
        return;
    }
    let pool = Pool::get();
    let Some(_held) = (rayon::current_thread_index().is_none()).then(|| pool.hold()).flatten() else {
        use rayon::prelude::*;
        (0..parts).into_par_iter().for_each(work);
        return;
    };
    // SAFETY: the lifetime is erased so that helpers can hold the job. `work` is called only
    // for parts below `parts`, and `wait` below returns (or unwinds) only after all of those
    // have ended; a helper that comes later finds the counter past the end and never calls it.
    let work: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(work) };
    let job = Arc::new(Job {
        work,
        parts,
        helpers: threads - 1,
        next: AtomicUsize::new(0),
        ended: AtomicUsize::new(0),
        panic: Mutex::new(None),
    });
    *pool.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.clone());
    pool.generation.fetch_add(1, Ordering::Release);
    for helper in pool.helpers.iter().take(threads - 1) {
        helper.unpark();
    }
    let wait = WaitForParts(&job);
    job.run_parts();
    drop(wait);
    *pool.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    if let Some(panic) = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
        resume_unwind(panic);
    }
}

/// Waits, when dropped, until every part of its job has ended: so that no way out of
/// [`for_each_part`], unwinding included, leaves a part running on borrowed data.
struct WaitForParts<'a>(&'a Job);

impl Drop for WaitForParts<'_> {
    fn drop(&mut self) {
        let mut spin = Spin::new();
        while self.0.ended.load(Ordering::Acquire) < self.0.parts {
            if spin.long() {
                // The last part's helper may have lost its core: let it have this one.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// `work(index, chunk)` for every `size`-long chunk of `data` (the last may be shorter), the
/// chunks run as the parts of [`for_each_part`].
pub(crate) fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    size: usize,
    threads: usize,
    work: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(size > 0, "for_each_chunk_mut: chunks of no elements");
    let len = data.len();
    let shared = SharedOut::new(data);
    for_each_part(len.div_ceil(size), threads, &|part| {
        let start = part * size;
        // SAFETY: the parts' chunks are disjoint and inside `data`, which outlives the call.
        let chunk = unsafe { std::slice::from_raw_parts_mut(shared.at(start), size.min(len - start)) };
        work(part, chunk);
    });
}

/// A buffer the parts of one call write, each its own elements.
pub(crate) struct SharedOut<T>(*mut T);

impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SharedOut<T> {}

// SAFETY: parts write disjoint elements (each caller says why).
unsafe impl<T: Send> Send for SharedOut<T> {}
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    pub(crate) fn new(data: &mut [T]) -> SharedOut<T> {
        SharedOut(data.as_mut_ptr())
    }

    /// The element at `offset`.
    ///
    /// # Safety
    /// `offset` is inside the buffer.
    pub(crate) unsafe fn at(self, offset: usize) -> *mut T {
        // SAFETY: the caller's.
        unsafe { self.0.add(offset) }
    }
}

/// A wait's looks at what it waits for: spinning, until it has gone on for [`SPIN`].
struct Spin {
    started: Instant,
    looks: u32,
}

impl Spin {
    fn new() -> Spin {
        Spin { started: Instant::now(), looks: 0 }
    }

    /// Whether the wait has spun long enough (the clock is read every 64 looks).
    fn long(&mut self) -> bool {
        self.looks = self.looks.wrapping_add(1);
        self.looks.is_multiple_of(64) && self.started.elapsed() >= SPIN
    }
}

/// One call's parts.
struct Job {
    /// Called only for parts below `parts` (see [`for_each_part`]).
    work: *const (dyn Fn(usize) + Sync),
    parts: usize,
    /// Helpers allowed to join.
    helpers: usize,
    /// The next part to hand out.
    next: AtomicUsize,
    /// Parts that have ended.
    ended: AtomicUsize,
    /// The first part's panic.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `work` points to a `Sync` closure, called from any thread only while its caller
// waits (see `for_each_part`).
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Takes parts until none are left.
    fn run_parts(&self) {
        loop {
            let part = self.next.fetch_add(1, Ordering::Relaxed);
            if part >= self.parts {
                return;
            }
            // SAFETY: a part below `parts` has not ended, so its caller is still waiting.
            let work = unsafe { &*self.work };
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| work(part))) {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(panic);
            }
            self.ended.fetch_add(1, Ordering::Release);
        }
    }
}

/// The helpers, started on first use: one fewer than the cores.
struct Pool {
    /// Set while a call uses the helpers.
    busy: AtomicBool,
    /// The current call's job, if any.
    job: Mutex<Option<Arc<Job>>>,
    /// Bumped at every call: what spinning helpers watch.
    generation: AtomicU64,
    helpers: Vec<Thread>,
}

impl Pool {
    /// The helpers for one call, or `None` while another call has them.
    fn hold(&self) -> Option<Held<'_>> {
        self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| Held(self))
    }

    fn get() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let count = std::thread::available_parallelism().map_or(1, |n| n.get()).saturating_sub(1);
            // Each helper starts by asking for the pool, which waits until this returns.
            // A helper that cannot be started is one fewer (and none is plain sequential).
            let helpers = (0..count)
                .map_while(|index| {
                    let spawned = std::thread::Builder::new()
                        .name(format!("sesa-kernel-{index}"))
                        .spawn(move || helper(index, Pool::get()));
                    spawned.ok().map(|handle| handle.thread().clone())
                })
                .collect();
            Pool { busy: AtomicBool::new(false), job: Mutex::new(None), generation: AtomicU64::new(0), helpers }
        })
    }
}

/// The helpers, held by one call until dropped (unwinding included).
struct Held<'a>(&'a Pool);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// A helper's life: wait for a new generation (spinning, then parked), join its job.
fn helper(index: usize, pool: &'static Pool) {
    let mut seen = 0;
    loop {
        let mut spin = Spin::new();
        let generation = loop {
            let generation = pool.generation.load(Ordering::Acquire);
            if generation != seen {
                break generation;
            }
            if spin.long() {
                std::thread::park();
            } else {
                std::hint::spin_loop();
            }
        };
        seen = generation;
        let job = pool.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job.filter(|job| index < job.helpers) {
            job.run_parts();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_whoever_calls() {
        let counts: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
        let count = |part: usize| {
            counts[part].fetch_add(1, Ordering::Relaxed);
        };
        for threads in [1, 2, 3] {
            for_each_part(37, threads, &count);
        }
        // Two callers at once: one has the helpers, the other goes to rayon's pool.
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| (0..50).for_each(|_| for_each_part(37, 2, &count)));
            }
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 103), "{counts:?}");
    }

    #[test]
    fn chunks_cover_the_data_and_the_last_may_be_short() {
        let mut data = vec![0usize; 23];
        for_each_chunk_mut(&mut data, 5, 2, |index, chunk| {
            assert!(chunk.len() == 5 || (index == 4 && chunk.len() == 3), "chunk {index}: {}", chunk.len());
            chunk.iter_mut().enumerate().for_each(|(i, v)| *v = index * 5 + i);
        });
        assert_eq!(data, (0..23).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_part_panics_the_caller_after_every_part_ended_and_the_helpers_stay_usable() {
        let ended = AtomicUsize::new(0);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            for_each_part(8, 2, &|part| {
                if part == 3 {
                    panic!("part 3");
                }
                ended.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert_eq!(outcome.unwrap_err().downcast_ref::<&str>(), Some(&"part 3"), "the part's own panic");
        assert_eq!(ended.load(Ordering::Relaxed), 7);
        // Released: other tests may hold the helpers for a moment, never for good.
        let started = Instant::now();
        let held = std::iter::repeat_with(|| Pool::get().hold())
            .find(|held| held.is_some() || started.elapsed() > Duration::from_secs(30))
            .flatten();
        assert!(held.is_some(), "the helpers stayed taken after a panic");
        drop(held);
        let after = AtomicUsize::new(0);
        for_each_part(8, 2, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 8);
    }
}
