//! The observer's own heap (`observer.memory.heap`), as glibc's allocator
//! counts it: what is in use beside what it holds free. Beside RSS and the
//! tables' entries it tells a table filling, a leak (in use grows) and
//! fragmentation (free grows) apart.

use std::time::{Duration, Instant};

/// How often the heap's free pages go back to the system.
pub const RELEASE_EVERY: Duration = Duration::from_secs(10);

/// Blocks at least this large are mapped on their own and unmapped when
/// freed.
const MMAP_THRESHOLD: i32 = 1 << 20;
/// Free memory at the top of an arena past this goes back at a free.
const TRIM_THRESHOLD: i32 = 512 << 10;

/// Fixes the allocator's thresholds; called first thing, before any thread.
/// glibc raises both after each large free (the mmap threshold to the
/// block's size, up to 32 MiB, the trim threshold to twice that): once the
/// TLS manager had read a library of a few MiB, buffers that size came from
/// the arenas, and a thread's arena gives its free top back only past the
/// trim threshold (`malloc_trim` does not shrink those). In the soak the
/// heap held 34 MiB free beside 4.5 MiB in use, and RSS crept up 2.3 MiB in
/// 25 minutes as the traffic faulted free pages back in. Fixed values also
/// turn the raising off.
pub fn configure() {
    // SAFETY: mallopt only sets the allocator's parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Gives the heap's free pages back to the system every `every`, on a
/// thread of its own for the process's life: free chunks inside the arenas
/// keep their pages resident (glibc reuses free chunks wherever they lie,
/// and faults their pages back in one reuse at a time). `malloc_trim`
/// locks one arena at a time (0.1-0.2 ms in all here); the correlator waits
/// on it at most while its own arena is walked.
pub fn keep_releasing(every: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("heap".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let began = Instant::now();
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
            tracing::debug!(took_us = began.elapsed().as_micros() as u64, "heap trimmed");
        })?;
    Ok(())
}

/// Bytes of the heap by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heap {
    /// Allocated and not freed (mmapped large blocks included).
    pub in_use: u64,
    /// Freed but still held by the allocator, in every arena.
    pub free: u64,
}

impl Heap {
    /// Now, over every arena.
    pub fn read() -> Heap {
        // SAFETY: mallinfo2 takes no arguments and only reads the
        // allocator's state under its arenas' locks.
        let m = unsafe { libc::mallinfo2() };
        Heap {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        }
    }

    /// As `observer.memory.heap{state}` labels them.
    pub fn by_state(self) -> [(&'static str, u64); 2] {
        [("in_use", self.in_use), ("free", self.free)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_held_shows_in_use() {
        let before = Heap::read();
        // Read through black_box: an allocation nothing reads may be elided.
        let held = std::hint::black_box(vec![1u8; 8 << 20]);
        let during = Heap::read();
        assert!(
            during.in_use >= before.in_use + (8 << 20),
            "{before:?} -> {during:?}"
        );
        drop(held);
        let after = Heap::read();
        assert!(after.in_use < during.in_use, "{during:?} -> {after:?}");
    }
}
