//! The `sesa` binary.

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    sesa::main_with(sesa_stages::registry())
}

/// glibc gives freed memory back to the system as soon as the top of a heap holds a few free
/// megabytes, and maps every block over its adaptive threshold afresh. A training step frees
/// and reallocates about 2 GB of activations, so each step faulted them in again page by page:
/// a third of a SmolLM2 step was kernel time. Keeping freed memory (up to the process's peak)
/// and mapping only blocks over 32 MiB separately takes that to a tenth.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; it runs before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        // Freed memory is kept per arena, and glibc gives each thread that allocates its own
        // arena (up to 8 per core): a training stage on one blocking thread, the next on
        // another, each kept its peak, and a learning run grew past 20 GB. Two arenas share it.
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}
