//! Growing big vectors cheaply: reserve address space up front (untouched
//! pages cost no memory) and fault pages in ahead of the writes.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::Sender;

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
/// time on a 200 MB snapshot (BENCHMARKS.md, "Snapshot decoding"). Inside
/// [`populating`] its thread makes the calls, 4 MiB ahead. Where the call is
/// refused, pages fault in as usual.
#[derive(Default)]
pub struct Prefault {
    /// Bytes from the vector's start past which the next write asks for more
    /// (`usize::MAX` once the kernel refused).
    ready: usize,
    /// Bytes from the vector's start populated, or asked of a [`populating`]
    /// thread.
    asked: usize,
}

impl Prefault {
    /// One that never populates: for a buffer that is filled again and again.
    pub fn off() -> Self {
        Prefault {
            ready: usize::MAX,
            asked: usize::MAX,
        }
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
        let base = v.as_mut_ptr() as usize;
        let capacity = v.capacity().saturating_mul(size_of::<T>());
        // A populating thread is asked a chunk further ahead, and asked again
        // a chunk before the writes reach what it was asked, so that it
        // works beside them rather than under them.
        let lead = if helped() { 2 * CHUNK } else { CHUNK };
        let start = base.saturating_add(self.asked).next_multiple_of(PAGE);
        let end = base.saturating_add(need.saturating_add(lead).min(capacity)) & !(PAGE - 1);
        if end <= start {
            // Nothing whole left within the capacity: try again once it grows.
            self.ready = need;
            return;
        }
        if !populate_soon(start, end - start) {
            *self = Prefault::off();
            return;
        }
        self.asked = end - base;
        self.ready = self.asked.saturating_sub(lead - CHUNK).max(need);
    }
}

const PAGE: usize = 4096;
/// How far ahead of the writes pages are populated, and the most one call asks.
const CHUNK: usize = 2 << 20;

/// `madvise(MADV_POPULATE_WRITE)` on `len` bytes at page-aligned `addr`;
/// false once the kernel has refused it (before Linux 5.14).
#[cfg(target_os = "linux")]
fn populate_write(addr: usize, len: usize) -> bool {
    if REFUSED.load(Relaxed) {
        return false;
    }
    // SAFETY: whole pages inside a vector's own allocation. Populating only
    // faults pages in and never changes their contents, so a range a
    // populating thread reaches after its vector moved or was freed is
    // harmless: unmapped, the call fails; mapped again, its bytes stay.
    let done =
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 };
    if !done && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        REFUSED.store(true, Relaxed);
    }
    done
}

/// `madvise(MADV_POPULATE_READ)` on `len` bytes at page-aligned `addr`:
/// maps a file mapping's pages (already in the page cache) in one call.
#[cfg(target_os = "linux")]
fn populate_read(addr: usize, len: usize) {
    // SAFETY: as for `populate_write`; reading pages in changes nothing.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
}

#[cfg(not(target_os = "linux"))]
fn populate_read(_addr: usize, _len: usize) {}

/// Asks this thread's [`populating`] thread, if it has one, to map the
/// pages of `range` (a read-only file mapping about to be read): a decoder
/// reading a mapped snapshot then finds them mapped instead of faulting
/// them in 64 KiB at a time, which took 5–9 % of the decoding thread's
/// samples in `top` of a 78 MB snapshot (`top` 6 % faster with it:
/// BENCHMARKS.md, issue 41). Without one, nothing is done.
pub fn read_soon(range: &[u8]) {
    let start = (range.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (range.as_ptr() as usize).saturating_add(range.len()) & !(PAGE - 1);
    if end > start {
        let _ = ask(start, end - start, Request::Read);
    }
}

/// Asks this thread's [`populating`] thread for `len` bytes at `addr`,
/// [`PIECE`] at a time; false without one.
fn ask(addr: usize, len: usize, request: fn(usize, usize) -> Request) -> bool {
    HELPER.with(|h| {
        h.borrow().as_ref().is_some_and(|to| {
            (addr..addr.saturating_add(len))
                .step_by(PIECE)
                .all(|at| to.send(request(at, PIECE.min(addr + len - at))).is_ok())
        })
    })
}

/// What a [`populating`] thread is asked: pages to populate for writing
/// (a growing vector) or for reading (a file mapping).
enum Request {
    Write(usize, usize),
    Read(usize, usize),
}

/// Asked of a [`populating`] thread a little at a time: each call holds the
/// address space's lock, which this thread's growing and freeing of memory
/// (`brk`, `mremap`) waits for. At 2 MiB a call (half a millisecond),
/// `parse`'s reading thread waited 29 ms in all on a 185 MB snapshot.
const PIECE: usize = 256 << 10;

/// Set once `MADV_POPULATE_WRITE` is refused as unknown: pages fault in as usual.
static REFUSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Where this thread's population requests go inside [`populating`].
    static HELPER: RefCell<Option<Sender<Request>>> = const { RefCell::new(None) };
}

fn helped() -> bool {
    HELPER.with(|h| h.borrow().is_some())
}

/// Populates `len` bytes at page-aligned `addr`: on this thread's
/// [`populating`] thread when it has one (true: asked), here otherwise.
fn populate_soon(addr: usize, len: usize) -> bool {
    if REFUSED.load(Relaxed) {
        return false;
    }
    ask(addr, len, Request::Write) || populate_write(addr, len)
}

/// Runs `f` with the page population this thread asks for ([`Prefault`],
/// [`populate_all`]) done on a thread of its own, ahead of the writes,
/// when `worth` it (a large input): on `parse` of a 185 MB snapshot the
/// kernel's page work was a fifth of the reading thread's time, with the
/// second core idle until the trace pass (BENCHMARKS.md, issue 33).
/// Without a thread (refused, or nested) it runs `f` as it is.
pub fn populating<R>(worth: bool, f: impl FnOnce() -> R) -> R {
    if !worth || REFUSED.load(Relaxed) || helped() {
        return f();
    }
    std::thread::scope(|threads| {
        let (to, requests) = std::sync::mpsc::channel::<Request>();
        let spawned = std::thread::Builder::new()
            .name("populate".into())
            .spawn_scoped(threads, move || {
                for r in requests {
                    match r {
                        Request::Write(addr, len) => {
                            populate_write(addr, len);
                        }
                        Request::Read(addr, len) => populate_read(addr, len),
                    }
                }
            });
        if spawned.is_err() {
            return f();
        }
        /// Ends the thread's requests however `f` ends, so the scope's join returns.
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                HELPER.with(|h| h.borrow_mut().take());
            }
        }
        HELPER.with(|h| *h.borrow_mut() = Some(to));
        let _done = Done;
        f()
    })
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
    let start = (v.as_mut_ptr() as usize).next_multiple_of(PAGE);
    let end = (v.as_mut_ptr() as usize).saturating_add(size_of_val(v)) & !(PAGE - 1);
    if end > start {
        // Refused (before Linux 5.14): the pages fault in as before.
        let _ = populate_soon(start, end - start);
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
    REFUSED.store(true, Relaxed);
    false
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// Inside `populating`, the pages ahead of the writes are populated by
    /// its thread (resident once it has joined, though never written here),
    /// what is written is kept, and a nested call runs on the same thread.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_populating_thread_faults_pages_in_ahead_of_the_writes() {
        let mut v: Vec<u64> = reserved(8 << 20);
        let mut ahead = Prefault::default();
        let written = populating(true, || {
            assert!(helped());
            populating(true, || assert!(helped()));
            for i in 0..1000u64 {
                ahead.ahead(&mut v, 1);
                v.push(i);
            }
            v.len()
        });
        assert!(!helped());
        assert_eq!(written, 1000);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        // Asked once, at the first push, 2 chunks past it (to a page's end),
        // and every page up to there resident.
        let base = v.as_ptr() as usize;
        assert_eq!(ahead.asked, ((base + 8 + 2 * CHUNK) & !(PAGE - 1)) - base);
        assert_eq!(
            resident(base, ahead.asked),
            (base + ahead.asked).div_ceil(PAGE) - base / PAGE
        );
        // Without one: a chunk ahead, populated here.
        let mut w: Vec<u64> = reserved(8 << 20);
        let mut ahead = Prefault::default();
        ahead.ahead(&mut w, 1);
        let base = w.as_ptr() as usize;
        assert_eq!(ahead.asked, ((base + 8 + CHUNK) & !(PAGE - 1)) - base);
    }

    /// How many of the pages from page-aligned-down `addr` over `len` bytes
    /// are resident (`mincore`).
    #[cfg(target_os = "linux")]
    pub(crate) fn resident(addr: usize, len: usize) -> usize {
        let start = addr & !(PAGE - 1);
        let pages = (addr + len - start).div_ceil(PAGE);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range lies in a live allocation; `vec` has a byte per page.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, pages * PAGE, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
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
