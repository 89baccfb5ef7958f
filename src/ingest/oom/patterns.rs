//! The message patterns, and the figures (sizes, device indices) read from their matches.

use crate::units::printed_size;
use regex::{Captures, Regex};
use std::sync::LazyLock;

/// Compiles a message pattern: a space matches any run of whitespace or of
/// literal `\n` escapes (a hard wrap may have eaten it; a repr or JSON string
/// escapes newlines), `SIZE` is a figure as `format_size` prints it,
/// `MPS_SIZE` one as the MPS allocator's `format_size` does (binary KB/MB/GB,
/// GiB-style labels in later versions).
pub(super) fn pattern(p: &str) -> Regex {
    let p = p
        .replace(' ', r"(?:\s|\\[nrt])*")
        .replace(
            "MPS_SIZE",
            r"(\d+(?:\.\d+)?)\s*(bytes|KB|MB|GB|KiB|MiB|GiB)",
        )
        .replace("SIZE", r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB)");
    Regex::new(&p).expect("built-in OOM pattern")
}

macro_rules! patterns {
    ($($name:ident = $p:expr;)*) => {
        $(pub(super) static $name: LazyLock<Regex> = LazyLock::new(|| pattern($p));)*
    };
}

patterns! {
    // Native caching allocator, all eras (allocator.md §7.2).
    REQUESTED = "Tried to allocate SIZE";
    DEVICE_OLD = r"\(GPU (\d+) ;";
    DEVICE_NEW = "GPU (\\d+) has a total";
    TOTAL_OLD = "SIZE total capacity";
    TOTAL_NEW = "total capac(?:i)?ty of SIZE";
    ALLOCATED_OLD = "SIZE already allocated";
    ALLOCATED_NEW = "Of the allocated memory SIZE";
    FREE_OLD = "SIZE free";
    FREE_NEW = "of which SIZE";
    RESERVED_OLD = "SIZE reserved in total by PyTorch";
    CACHED = "SIZE cached";
    RESERVED_UNALLOCATED = "SIZE is reserved by PyTorch but unallocated";
    PRIVATE_POOLS = "with SIZE allocated in private pools";
    ALLOWED = "SIZE allowed ;";
    THIS_PROCESS = "this process has SIZE";
    OTHER_PROCESS = r"Process (\d+) has SIZE";
    // cudaMallocAsync backend (c10/cuda/CUDAMallocAsyncAllocator.cpp, mallocAsync).
    ASYNC_DEVICE = "Allocation on device (\\d+) would exceed";
    ASYNC_ALLOCATED = "Currently allocated : SIZE";
    ASYNC_REQUESTED = "Requested : SIZE";
    ASYNC_LIMIT = "Device limit : SIZE";
    ASYNC_FREE = r"Free \(according to CUDA\) : SIZE";
    ASYNC_FRACTION = r"PyTorch limit \(set by user-supplied memory fraction\) : SIZE";
    // The end of each era's message: its absence means the text was cut.
    COMPLETE = r"cached \)|Memory Management (?:and PYTORCH_\w*ALLOC_CONF|\( https?://[^\s)]*\))|unoccupied cached memory\.|more than 1EB memory\.";
    // What sits right before "out of memory" decides who ran out.
    LEAD_ALLOCATOR = r"(CUDA|HIP|XPU) $";
    LEAD_RETYPED = r"(?i)\b(cuda|hip|xpu) $";
    LEAD_RUNTIME = r"(CUDA|HIP) (?:driver )?error : $";
    LEAD_NCCL = r"Cuda failure (?:\d+ )?'$";
    LEAD_MPS = r"MPS backend $";
    LEAD_THC = r"cuda runtime error \( ?2 ?\) : $";
    // THC's THCudaCheck line (THCGeneral), printed before it raises LEAD_THC.
    LEAD_THC_CHECK = r"THCudaCheck FAIL file=(\S+) line=(\d+) error=2 : $";
    // MPSAllocator.mm (its format_size prints binary "KB/MB/GB").
    MPS_ALLOCATED = "MPS allocated : MPS_SIZE";
    MPS_ALLOWED = "max allowed : MPS_SIZE";
    MPS_OTHER = "other allocations : MPS_SIZE";
    MPS_REQUESTED = "Tried to allocate MPS_SIZE";
    // c10/core/impl/alloc_cpu.cpp prints bytes; TH's THAlloc/THRealloc before it
    // printed `size / 1073741824` as "%dGB" (whole GiB, rounded down).
    HOST_REQUESTED = r"you tried to (?:re)?allocate (\d+) (bytes|GB)";
    // A head retyped by hand ("Cuda out of the memory."), which LEAD_ALLOCATOR misses.
    RETYPED_HEAD = r"(?i)\b(cuda|hip|xpu) out of (?:the )?memory [.!:,]? $";
    // IPEX's XPU allocator (csrc/gpu/runtime/CachingDeviceAllocator.cpp) refuses a
    // block over 4 GB on platforms without 2D block arrays, then prints its figures.
    IPEX_LIMIT = r"Current platform can NOT allocate memory block with size larger than \d+GB ! $";
    // The parenthesised figures of a 1.x message quoted without their head.
    FRAGMENT_OPEN = r"\(GPU \d+ ; SIZE $";
    // cudaMallocAsync's message after its head (wrapped or not).
    ASYNC_EXCEED = "would exceed allowed memory";
}

/// Reads the size captured as groups `i` (number) and `i + 1` (unit).
pub(super) fn size_at(c: &Captures, i: usize) -> Option<u64> {
    let v: f64 = c.get(i)?.as_str().parse().ok()?;
    printed_size(v, c.get(i + 1)?.as_str())
}

/// The one figure of a pattern whose words hold no digit. Only the DFA runs
/// (`find`); the number and unit are read from the match by hand, which in an
/// ASCII match gives what the captures give (its first digit starts the
/// number, `\d` and `\s` are ASCII there) at a fraction of the capture
/// engine's cost. A match with other characters takes the captures.
pub(super) fn size(re: &Regex, text: &str) -> Option<u64> {
    let m = re.find(text)?;
    let s = m.as_str();
    if !s.is_ascii() {
        return size_at(&re.captures_at(text, m.start())?, 1);
    }
    let (number, rest) = leading_number(s)?;
    let rest = rest.trim_start();
    let unit = UNITS.iter().find(|u| rest.starts_with(*u))?;
    printed_size(number.parse().ok()?, unit)
}

/// Every unit `SIZE` and `MPS_SIZE` take; none starts another, so after a
/// match's number exactly one of them follows.
const UNITS: [&str; 8] = ["bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB"];

/// The `\d+(?:\.\d+)?` at the first digit of an ASCII `s`, and what follows it.
fn leading_number(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let start = b.iter().position(u8::is_ascii_digit)?;
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = digits(start);
    if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end = digits(end + 1);
    }
    Some((&s[start..end], &s[end..]))
}

/// The index of a pattern whose only number is its `(\d+)`, read as [`size`] reads.
pub(super) fn index(re: &Regex, text: &str) -> Option<u32> {
    let m = re.find(text)?;
    if !m.as_str().is_ascii() {
        return re
            .captures_at(text, m.start())?
            .get(1)?
            .as_str()
            .parse()
            .ok();
    }
    // In a match the digits are followed by a space or `;`, never by `.5`.
    leading_number(m.as_str())?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::text;

    /// [`size`] and [`index`] read what the captures read, on every line of
    /// every text fixture (and each line with its neighbours, for wraps) and
    /// on shapes made to tempt a hand parser.
    #[test]
    fn figures_read_by_hand_are_the_captured_ones() {
        let sizes: [&Regex; 22] = [
            &REQUESTED,
            &TOTAL_OLD,
            &TOTAL_NEW,
            &ALLOCATED_OLD,
            &ALLOCATED_NEW,
            &FREE_OLD,
            &FREE_NEW,
            &RESERVED_OLD,
            &CACHED,
            &RESERVED_UNALLOCATED,
            &PRIVATE_POOLS,
            &ALLOWED,
            &THIS_PROCESS,
            &ASYNC_ALLOCATED,
            &ASYNC_REQUESTED,
            &ASYNC_LIMIT,
            &ASYNC_FREE,
            &ASYNC_FRACTION,
            &MPS_ALLOCATED,
            &MPS_ALLOWED,
            &MPS_OTHER,
            &MPS_REQUESTED,
        ];
        let indices: [&Regex; 3] = [&DEVICE_NEW, &DEVICE_OLD, &ASYNC_DEVICE];
        let dirs = ["/fixtures/text", "/fixtures/eval"];
        let mut texts: Vec<String> = vec![
            "Tried to allocate 1.5.5 GiB; 12.50 GiB total capacity; 3. 2 GiB free".into(),
            "Tried to allocate\\n2.00\u{a0}GiB (GPU 0 ; 7 GiB total capacity ; 5 MiB free".into(),
            "of which ١٢ GiB is free; of which 3 MiB is free; MPS allocated: 2.5 GB, max allowed: 18.13 GB".into(),
            "Allocation on device 12 would exceed allowed memory. Currently allocated     : 7.01 GiB".into(),
        ];
        let files = dirs.iter().flat_map(|d| {
            let dir = format!("{}{d}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_dir(dir).unwrap().map(|f| f.unwrap().path())
        });
        for f in files.filter(|f| f.is_file()) {
            let data = std::fs::read(f).unwrap();
            let lines: Vec<String> = text::clean(&data).lines().map(str::to_owned).collect();
            for w in lines.windows(3) {
                texts.push(w.concat());
            }
        }
        let mut read = 0;
        for t in &texts {
            for re in sizes {
                let captured = re.captures(t).and_then(|c| size_at(&c, 1));
                assert_eq!(size(re, t), captured, "{re} on {t:?}");
                read += usize::from(captured.is_some());
            }
            for re in indices {
                let captured = re.captures(t).and_then(|c| c.get(1)?.as_str().parse().ok());
                assert_eq!(index(re, t), captured, "{re} on {t:?}");
            }
        }
        assert!(read > 1200, "only {read} figures read");
    }
}
