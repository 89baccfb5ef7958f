//! Clues about the environment, found on the scanner's own pass: each kind
//! of clue has anchor strings in the scanner's automaton, and only the few
//! bytes around a hit are checked (ASCII-only byte patterns, no UTF-8 copy).
//! So `diagnose` reads a log once, however large (issue 15).
//!
//! What a clue means for the diagnosis is decided in `advise::context`.

use crate::evidence::TextClues;
use regex::bytes::Regex;
use std::sync::LazyLock;

/// Which clue an anchor may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clue {
    /// "torch" in three casings: a version line, `torch_memory_saver`, `\site-packages\torch`.
    Torch,
    /// `PYTORCH_(CUDA_|HIP_)ALLOC_CONF=`.
    AllocConf,
    MaxSplitHint,
    ExpandableUnsupported,
    /// `File "C:\…` in a Windows traceback.
    WindowsFile,
    /// `C:\Users`, `C:\Program Files`, `C:\ProgramData`, `C:\Python`.
    WindowsDir,
    /// A PowerShell prompt (`PS C:\…>`) or a ```` ```powershell ```` fence.
    WindowsShell,
    Ipc,
}

/// The anchors of each clue. Every one is at least 4 bytes: the scanner's
/// SIMD prefilter fingerprints the first 4 bytes of every anchor.
pub const ANCHORS: [(&str, Clue); 16] = [
    ("torch", Clue::Torch),
    ("Torch", Clue::Torch),
    ("TORCH", Clue::Torch),
    ("_ALLOC_CONF", Clue::AllocConf),
    ("try setting max_split_size_mb", Clue::MaxSplitHint),
    (
        "expandable_segments not supported on this platform",
        Clue::ExpandableUnsupported,
    ),
    ("File \"", Clue::WindowsFile),
    (":\\Users", Clue::WindowsDir),
    (":\\Program", Clue::WindowsDir),
    (":\\Python", Clue::WindowsDir),
    ("PS C:\\", Clue::WindowsShell),
    ("```powershell", Clue::WindowsShell),
    // §5: expandable segments break CUDA IPC users.
    ("custom_all_reduce", Clue::Ipc),
    ("CUSTOM_ALL_REDUCE", Clue::Ipc),
    ("CuMemAllocator", Clue::Ipc),
    ("cumem_allocator", Clue::Ipc),
];

// Both are anchored: they are tried only where an anchor says a match starts.
static VERSION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i-u)^(?:PyTorch version:\s*|torch\s*==\s*|torch version[:=]?\s*|torch\s+)v?(\d+)\.(\d+)",
    )
    .unwrap_or_else(|e| panic!("static regex: {e}"))
});
static CONF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?-u)^PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF\s*[=:]\s*["']?([A-Za-z_][A-Za-z0-9_:.,\[\]>]*)"#,
    )
    .unwrap_or_else(|e| panic!("static regex: {e}"))
});

/// How far past a hit a clue is read: a version line's spaces (pip's
/// aligned columns) or a config value fit easily. Regex captures cost in
/// proportion to what they are given, so no more.
const AFTER: usize = 512;

/// The clues of one input, gathered hit by hit.
#[derive(Default)]
pub struct Finder {
    /// The first version line of this input has been read (later ones are
    /// not: the first is the environment report).
    version_seen: bool,
}

impl Finder {
    /// Reads the clue an anchor of `clue` at `hit` may start (`anchor_len` long).
    pub fn hit(
        &mut self,
        clue: Clue,
        data: &[u8],
        hit: usize,
        anchor_len: usize,
        clues: &mut TextClues,
    ) {
        let after = |n: usize| data.get(hit + anchor_len..).unwrap_or_default().get(..n);
        match clue {
            Clue::Torch => self.torch(data, hit, clues),
            Clue::AllocConf if clues.alloc_conf.is_none() => {
                clues.alloc_conf = conf_at(data, hit);
            }
            Clue::AllocConf => {}
            Clue::MaxSplitHint => clues.max_split_hint = true,
            Clue::ExpandableUnsupported => clues.expandable_unsupported = true,
            Clue::WindowsFile => {
                clues.windows_paths |=
                    matches!(after(3), Some([d, b':', b'\\']) if d.is_ascii_alphabetic());
            }
            Clue::WindowsDir => {
                let drive = hit
                    .checked_sub(1)
                    .and_then(|i| data.get(i))
                    .is_some_and(u8::is_ascii_alphabetic);
                // `\b` before the drive letter.
                let bounded = hit
                    .checked_sub(2)
                    .and_then(|i| data.get(i))
                    .is_none_or(|&b| !(b.is_ascii_alphanumeric() || b == b'_'));
                let dir = data.get(hit + 2..).is_some_and(|tail| {
                    [&b"Users"[..], b"Program Files", b"ProgramData", b"Python"]
                        .iter()
                        .any(|d| tail.starts_with(d))
                });
                clues.windows_paths |= drive && bounded && dir;
            }
            Clue::WindowsShell => clues.windows_paths = true,
            Clue::Ipc => clues.ipc_user = true,
        }
    }

    fn torch(&mut self, data: &[u8], hit: usize, clues: &mut TextClues) {
        let rest = data.get(hit + 5..).unwrap_or_default();
        let before = data.get(..hit).unwrap_or_default();
        if before.ends_with(b"\\site-packages\\") && data[hit..].starts_with(b"torch") {
            clues.windows_paths = true;
        }
        if rest.len() >= 13 && rest[..13].eq_ignore_ascii_case(b"_memory_saver") {
            clues.ipc_user = true;
        }
        // Every version pattern goes on with a space or `=` (paths and
        // `torch.` names are most hits, and stop here).
        if self.version_seen
            || !rest
                .first()
                .is_some_and(|b| b.is_ascii_whitespace() || *b == b'=')
        {
            return;
        }
        // "PyTorch version:" starts two bytes before its "Torch"; the rest at the hit.
        let end = data.len().min(hit + AFTER);
        let py = hit
            .checked_sub(2)
            .filter(|&at| data[at..hit].eq_ignore_ascii_case(b"py"));
        let Some(c) = py
            .into_iter()
            .chain([hit])
            .find_map(|at| VERSION.captures(&data[at..end]))
        else {
            return;
        };
        self.version_seen = true;
        let v = |i| {
            c.get(i)
                .and_then(|m| std::str::from_utf8(m.as_bytes()).ok())
                .and_then(|m| m.parse::<u16>().ok())
        };
        if let (Some(major), Some(minor)) = (v(1), v(2))
            && (1..=9).contains(&major)
            && clues.torch_version.is_none()
        {
            clues.torch_version = Some((major, minor));
        }
    }
}

/// The config value set by the `PYTORCH_*ALLOC_CONF` whose `_ALLOC_CONF` is
/// at `hit`, unless it is PyTorch's own OOM hint.
fn conf_at(data: &[u8], hit: usize) -> Option<String> {
    // "PYTORCH" + "_ALLOC_CONF", "PYTORCH_HIP" + …, "PYTORCH_CUDA" + ….
    let end = data.len().min(hit + AFTER);
    let (start, c) = [7, 11, 12]
        .into_iter()
        .filter_map(|back| hit.checked_sub(back))
        .find_map(|at| Some((at, CONF.captures(&data[at..end])?)))?;
    let (all, value) = (c.get(0)?, c.get(1)?);
    if is_pytorch_hint(data, start, start + all.end()) {
        return None;
    }
    let value = std::str::from_utf8(value.as_bytes()).ok()?;
    Some(value.trim_end_matches([',', '.']).to_owned())
}

/// PyTorch's OOM hint ("… try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
/// to avoid fragmentation"), also when a terminal or a log prefix wrapped it.
fn is_pytorch_hint(text: &[u8], start: usize, end: usize) -> bool {
    let before = &text[start.saturating_sub(80)..start];
    let after = &text[end..end.saturating_add(40).min(text.len())];
    before.windows(3).any(|w| w == b"try") || after.windows(5).any(|w| w == b"avoid")
}
