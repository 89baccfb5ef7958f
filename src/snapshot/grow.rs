//! Growing big vectors cheaply: reserve address space up front (untouched
//! pages cost no memory) and fault pages in ahead of the writes.

/// A vector with room for `items`, or for fewer if that much address space
/// is refused.
pub fn reserved<T>(items: usize) -> Vec<T> {
    let mut v = Vec::new();
    let mut want = items;
    while want > 0 && v.try_reserve_exact(want).is_err() {
        want /= 4;
    }
    v
}

/// Pre-faults a growing vector's spare capacity ahead of its writes, 2 MiB
/// at a time, with `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+): one kernel
/// entry per 2 MiB instead of a page fault per 4 KiB: 5–10 % of `parse`'s CPU
/// time on a 200 MB snapshot (BENCHMARKS.md, "Snapshot decoding"). Where the
/// call is refused, pages fault in as usual.
#[derive(Default)]
pub struct Prefault {
    /// Bytes from the vector's start already populated (`usize::MAX` once
    /// the kernel refused).
    ready: usize,
}

impl Prefault {
    /// One that never populates: for a buffer that is filled again and again.
    pub fn off() -> Self {
        Prefault { ready: usize::MAX }
    }

    /// Room for `more` items past `v.len()`.
    #[inline(always)]
    pub fn ahead<T>(&mut self, v: &mut Vec<T>, more: usize) {
        let need = v.len().saturating_add(more).saturating_mul(size_of::<T>());
        if need > self.ready {
            self.populate(v, need);
        }
    }

    #[cold]
    #[inline(never)]
    fn populate<T>(&mut self, v: &mut Vec<T>, need: usize) {
        const PAGE: usize = 4096;
        const CHUNK: usize = 2 << 20;
        let base = v.as_mut_ptr() as usize;
        let capacity = v.capacity().saturating_mul(size_of::<T>());
        let start = base.saturating_add(self.ready).next_multiple_of(PAGE);
        let end = base.saturating_add(need.saturating_add(CHUNK).min(capacity)) & !(PAGE - 1);
        if end <= start {
            // Nothing whole left within the capacity: try again once it grows.
            self.ready = need;
            return;
        }
        self.ready = if populate_write(start, end - start) {
            end - base
        } else {
            usize::MAX
        };
    }
}

/// `madvise(MADV_POPULATE_WRITE)` on `len` bytes at page-aligned `addr`.
#[cfg(target_os = "linux")]
fn populate_write(addr: usize, len: usize) -> bool {
    // SAFETY: callers pass whole pages inside a vector's own allocation;
    // populating only faults the pages in and never changes their contents.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
}

/// Asks for 2 MiB pages behind a big vector's capacity (`MADV_HUGEPAGE`,
/// Linux only): one page fault and one page-table entry per 2 MiB instead of
/// 512. A 1 M-event trace's events are 24 MB; fault handling was a fifth of
/// `allocdoc replay`'s CPU time (BENCHMARKS.md, "Whole-process replay").
pub fn advise_huge<T>(v: &mut Vec<T>) {
    huge_pages(
        v.as_mut_ptr() as usize,
        v.capacity().saturating_mul(size_of::<T>()),
    );
}

/// A zeroed table of `len` numbers, or of fewer (down to none) where that
/// much memory is refused: `vec![0; len]` would abort then. Its pages are
/// mapped on first touch, so only the entries in use cost memory.
pub fn zeroed_table(len: usize) -> Vec<u32> {
    let mut want = len;
    while want > 0 {
        let Ok(layout) = std::alloc::Layout::array::<u32>(want) else {
            want /= 4;
            continue;
        };
        // SAFETY: `layout` is non-zero-sized (`want` > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u32>();
        if !ptr.is_null() {
            // SAFETY: allocated by the global allocator with `u32`'s layout for
            // `want` items, all zero, which are valid `u32`s.
            return unsafe { Vec::from_raw_parts(ptr, want, want) };
        }
        want /= 4;
    }
    Vec::new()
}

/// Faults in a zeroed table's pages for writing before any read. A read
/// first maps the shared zero page; the write after it copies the page and
/// flushes the TLB of every core running the process (an interrupt to the
/// other thread, each 4 KiB): the trace reader's id table, read before
/// written, spent a tenth of its thread's time that way.
pub fn populate_all<T>(v: &mut [T]) {
    const PAGE: usize = 4096;
    let start = (v.as_mut_ptr() as usize).next_multiple_of(PAGE);
    let end = (v.as_mut_ptr() as usize).saturating_add(size_of_val(v)) & !(PAGE - 1);
    if end > start {
        // Refused (before Linux 5.14): the pages fault in as before.
        let _ = populate_write(start, end - start);
    }
}

/// `madvise(MADV_HUGEPAGE)` on the whole 2 MiB pages of `len` bytes at `addr`.
#[cfg(target_os = "linux")]
fn huge_pages(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = addr.next_multiple_of(HUGE);
    let end = addr.saturating_add(len) & !(HUGE - 1);
    if end > start {
        // SAFETY: whole pages inside a vector's own allocation; the advice
        // changes how pages are backed, never their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn huge_pages(_addr: usize, _len: usize) {}

#[cfg(not(target_os = "linux"))]
fn populate_write(_addr: usize, _len: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed table is all zeros, and populating part of it changes nothing;
    /// a length no allocator grants gives a shorter table, not an abort.
    #[test]
    fn zeroed_tables_are_zero_and_never_abort() {
        let mut t = zeroed_table(3 << 20);
        assert_eq!(t.len(), 3 << 20);
        populate_all(&mut t[1000..(2 << 20)]);
        assert!(t.iter().all(|&x| x == 0));
        let refused = zeroed_table(usize::MAX / 2);
        assert!(refused.len() < usize::MAX / 2);
        assert!(refused.first().is_none_or(|&x| x == 0));
        assert!(refused.last().is_none_or(|&x| x == 0));
        assert!(zeroed_table(0).is_empty());
    }

    #[test]
    fn prefaulting_keeps_what_is_written_and_follows_growth() {
        let mut v: Vec<u64> = reserved(1 << 20);
        let mut ahead = Prefault::default();
        for i in 0..300_000u64 {
            ahead.ahead(&mut v, 1);
            v.push(i);
        }
        // Past the reserve: the vector moves and grows; prefaulting follows.
        ahead.ahead(&mut v, 1 << 21);
        v.extend(300_000..(1 << 21) + 300_000);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        assert!(
            ahead.ready >= 300_000 * 8,
            "populated {} bytes",
            ahead.ready
        );
    }
}
