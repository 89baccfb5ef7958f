//! The `PYTORCH_CUDA_ALLOC_CONF` parser, one grammar per era (spec §6.2):
//! A (1.10–1.13) regex split, B (2.0–2.9) token lexer, C (2.10+)
//! `ConfigTokenizer` read by two parsers. Each step mirrors the PyTorch
//! function named in its comment, including what PyTorch fails to check.

use super::cpp::{self, Converted, CppThrow};
use super::keys::{self, KeySpec, Owner};
use super::{
    ConfError, ConfWarning, ErrorOrigin, MIB, ParsedConf, PyException, Settings, TorchVersion,
    Unmodelled,
};
use crate::evidence::Backend;
use std::borrow::Cow;

const ROUNDUP_INTERVALS: usize = 16;
/// `kLargeBuffer / 1 MiB`: the floor of `max_split_size_mb` before 2.11.
const LARGE_BUFFER_MB: u64 = 20;
/// `kMinLargeAlloc / 1 MiB`: `large_segment_size_mb` must exceed it (2.11+).
const MIN_LARGE_ALLOC_MB: u64 = 10;
/// `pinned_max_register_threads()`.
const MAX_REGISTER_THREADS: u64 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 1.10–1.13: `std::regex` split on `[\s,]+` then `[:]+`.
    Regex,
    /// 2.0–2.9: `CUDAAllocatorConfig::lexArgs`, only `' '` dropped.
    Lexer,
    /// 2.10+: `ConfigTokenizer`, every `isspace` dropped, delimiters unchecked.
    Tokenizer,
}

impl Era {
    pub fn of(version: TorchVersion) -> Era {
        if version < TorchVersion::new(2, 0) {
            Era::Regex
        } else if version < TorchVersion::new(2, 10) {
            Era::Lexer
        } else {
            Era::Tokenizer
        }
    }
}

/// Parses a `PYTORCH_CUDA_ALLOC_CONF` value as PyTorch `version` would, from
/// PyTorch's defaults (every parse resets max_split_size, the roundup table
/// and the gc threshold; the rest start at defaults here too).
pub fn parse(value: &str, version: TorchVersion) -> Result<ParsedConf, ConfError> {
    let mut p = Parser {
        raw: value,
        version,
        era: Era::of(version),
        toks: Vec::new(),
        out: ParsedConf {
            settings: Settings {
                version,
                ..Settings::default()
            },
            warnings: Vec::new(),
            unmodelled: Vec::new(),
        },
        used_async: false,
        used_native_specific: false,
    };
    if version < TorchVersion::FIRST_ALLOC_CONF {
        p.note(format!(
            "PyTorch {version} does not read PYTORCH_CUDA_ALLOC_CONF (it appeared in 1.10); the value has no effect"
        ));
        return Ok(p.out);
    }
    match p.era {
        Era::Regex => p.parse_regex_era(value)?,
        Era::Lexer => {
            p.toks = lex(value, |c| c == ' ');
            p.parse_pass(None)?;
        }
        Era::Tokenizer => {
            p.toks = lex(value, |c| cpp::is_c_space(c as u8) && c.is_ascii());
            // From the environment the CUDA hook (`CUDAAllocatorConfig`) reads
            // the value before `AcceleratorAllocatorConfig` does: users report
            // "ValueError: Unrecognized key '…' in CUDA allocator config." at
            // CUDA initialization. (`_set_allocator_settings` runs the two in
            // the other order and names the "Accelerator allocator config".)
            p.parse_pass(Some(Owner::Cuda))?;
            if version >= TorchVersion::new(2, 11) {
                p.large_segment_pre_pass()?;
            }
            p.parse_pass(Some(Owner::Core))?;
        }
    }
    p.finish();
    Ok(p.out)
}

/// `lexArgs` / `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own,
/// `dropped` characters vanish, everything else accumulates into words.
fn lex(value: &str, dropped: impl Fn(char) -> bool) -> Vec<Cow<'_, str>> {
    let mut toks = Vec::new();
    let mut word = String::new();
    for (at, c) in value.char_indices() {
        if matches!(c, ',' | ':' | '[' | ']') {
            if !word.is_empty() {
                toks.push(Cow::Owned(std::mem::take(&mut word)));
            }
            toks.push(Cow::Borrowed(&value[at..at + 1]));
        } else if !dropped(c) {
            word.push(c);
        }
    }
    if !word.is_empty() {
        toks.push(Cow::Owned(word));
    }
    toks
}

struct Parser<'a> {
    raw: &'a str,
    version: TorchVersion,
    era: Era,
    toks: Vec<Cow<'a, str>>,
    out: ParsedConf,
    used_async: bool,
    used_native_specific: bool,
}

impl Parser<'_> {
    fn note(&mut self, text: String) {
        // The two era-C passes see the same delimiters: report once.
        if self.out.warnings.iter().any(|w| w.text == text) {
            return;
        }
        self.out.warnings.push(ConfWarning {
            text,
            from_pytorch: false,
        });
    }

    fn at_least(&self, major: u16, minor: u16) -> bool {
        self.version >= TorchVersion::new(major, minor)
    }

    /// A failed `TORCH_CHECK` (A, B) or `TORCH_CHECK_VALUE` (C).
    fn check_failed(&self, message: impl Into<String>) -> ConfError {
        let exception = if self.era == Era::Tokenizer {
            PyException::ValueError
        } else {
            PyException::RuntimeError
        };
        ConfError {
            exception: Some(exception),
            message: message.into(),
            origin: ErrorOrigin::Check,
        }
    }

    fn internal_assert(message: &str) -> ConfError {
        ConfError {
            exception: Some(PyException::RuntimeError),
            message: message.to_string(),
            origin: ErrorOrigin::InternalAssert,
        }
    }

    /// `ConfigTokenizer::checkIndex`.
    fn check_index(&self, i: usize) -> Result<(), ConfError> {
        if i < self.toks.len() {
            Ok(())
        } else {
            Err(Self::internal_assert(
                "Index out of bounds in ConfigTokenizer",
            ))
        }
    }

    fn tok(&self, i: usize) -> &str {
        self.toks.get(i).map_or("", |t| t.as_ref())
    }

    /// Era B `consumeToken(config, i, c)`; era C `checkToken(i, c)`, whose
    /// result PyTorch ignores (only the index is checked).
    fn delimiter(&mut self, i: usize, c: char) -> Result<usize, ConfError> {
        let found_ok = self
            .toks
            .get(i)
            .is_some_and(|t| t.len() == 1 && t.starts_with(c));
        match self.era {
            Era::Tokenizer => {
                self.check_index(i)?;
                if !found_ok {
                    let found = self.tok(i).to_string();
                    self.note(format!(
                        "expected '{c}' at token {i} but found '{found}'; PyTorch {} does not check delimiters and reads on",
                        self.version
                    ));
                }
            }
            _ if !found_ok => {
                return Err(self.check_failed(format!(
                    "Error parsing CachingAllocator settings, expected {c}"
                )));
            }
            _ => {}
        }
        Ok(i)
    }

    /// The value token at `i`: era B reports `missing` (a key-specific
    /// `TORCH_CHECK`), era C asserts on the index.
    fn value(&self, i: usize, missing: &str) -> Result<(), ConfError> {
        match self.era {
            Era::Tokenizer => self.check_index(i),
            _ if i < self.toks.len() => Ok(()),
            _ => Err(self.check_failed(missing)),
        }
    }

    fn cpp_error(function: &str) -> ConfError {
        ConfError {
            exception: Some(PyException::RuntimeError),
            message: function.to_string(),
            origin: ErrorOrigin::CppException,
        }
    }

    fn converted<T: Copy>(
        &mut self,
        key: &str,
        text: &str,
        r: Result<Converted<T>, CppThrow>,
        function: &str,
    ) -> Result<T, ConfError> {
        let c = r.map_err(|_| Self::cpp_error(function))?;
        if c.ignored_tail {
            self.note(format!(
                "{key}: PyTorch reads only the number at the start of '{text}' ({function}) and ignores the rest"
            ));
        }
        Ok(c.value)
    }

    /// An unsigned integer as the era converts it: `stoi` assigned to
    /// `size_t` (A, B) or `ConfigTokenizer::toSizeT` = `stoull` (C).
    fn size_t(&mut self, key: &str, text: &str) -> Result<u64, ConfError> {
        let (r, function) = if self.era == Era::Tokenizer {
            (cpp::stoull(text), "stoull")
        } else {
            (cpp::stoi_as_size_t(text), "stoi")
        };
        let v = self.converted(key, text, r, function)?;
        if text.trim_start().starts_with('-') && v != 0 {
            self.note(format!(
                "{key}: '{text}' is negative; PyTorch converts it to the unsigned size {v}"
            ));
        }
        Ok(v)
    }

    fn double(&mut self, key: &str, text: &str) -> Result<f64, ConfError> {
        self.converted(key, text, cpp::stod(text), "stod")
    }

    /// A `True`/`False` value at token `i` (case-sensitive in every era).
    /// Era B: `missing` is the message for a missing value, or `None` where
    /// PyTorch folds that case into "Expected a single True/False argument".
    fn boolean(&self, i: usize, canonical: &str, missing: Option<&str>) -> Result<bool, ConfError> {
        let t = self.tok(i);
        if self.era == Era::Tokenizer {
            // ConfigTokenizer::toBool
            self.check_index(i)?;
            return match t {
                "True" => Ok(true),
                "False" => Ok(false),
                _ => Err(self.check_failed(format!(
                    "Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{t}'"
                ))),
            };
        }
        if i >= self.toks.len()
            && let Some(m) = missing
        {
            return Err(self.check_failed(m));
        }
        match t {
            "True" if i < self.toks.len() => Ok(true),
            "False" if i < self.toks.len() => Ok(false),
            _ => Err(self.check_failed(format!(
                "Expected a single True/False argument for {canonical}"
            ))),
        }
    }

    /// `CUDAAllocatorConfig::parseArgs` (era B, `owner` = None) or one of the
    /// two era-C passes: `AcceleratorAllocatorConfig::parseArgs` (Core) and
    /// the CUDA hook (Cuda). A pass skips (`ConfigTokenizer::skipKey`) the
    /// known keys the other parser owns.
    fn parse_pass(&mut self, owner: Option<Owner>) -> Result<(), ConfError> {
        let mut i = 0;
        while i < self.toks.len() {
            let name = self.tok(i).to_string();
            let spec = keys::lookup(&name, self.version);
            i = match (spec, owner) {
                (Some(spec), None) => self.parse_key(spec, i)?,
                (Some(spec), Some(o)) if spec.owner == o => self.parse_key(spec, i)?,
                (Some(_), Some(_)) => self.skip_key(i)?,
                (None, None) => {
                    return Err(
                        self.check_failed(format!("Unrecognized CachingAllocator option: {name}"))
                    );
                }
                // Whichever pass runs first rejects the key; the CUDA one does.
                (None, Some(_)) => {
                    return Err(self.check_failed(format!(
                        "Unrecognized key '{name}' in CUDA allocator config."
                    )));
                }
            };
            if i + 1 < self.toks.len() {
                i = self.delimiter(i + 1, ',')?;
            }
            i += 1;
        }
        Ok(())
    }

    /// `ConfigTokenizer::skipKey`: returns the index of the value or of the
    /// closing `]` of a list value.
    fn skip_key(&mut self, i: usize) -> Result<usize, ConfError> {
        let mut i = self.delimiter(i + 1, ':')? + 1;
        self.check_index(i)?;
        if self.tok(i) != "[" {
            return Ok(i);
        }
        i += 1;
        while i < self.toks.len() && self.tok(i) != "]" {
            i += 1;
        }
        if i >= self.toks.len() {
            return Err(Self::internal_assert(
                "Expected closing bracket ']' in ConfigTokenizer but reached end of config",
            ));
        }
        Ok(i)
    }

    /// `AcceleratorAllocatorConfig::parseArgs` (2.11+) first scans every token
    /// for `large_segment_size_mb`, because max_split_size_mb and
    /// max_non_split_rounding_mb are bounded by it.
    fn large_segment_pre_pass(&mut self) -> Result<(), ConfError> {
        let mut i = 0;
        while i < self.toks.len() {
            if self.tok(i) == "large_segment_size_mb" {
                i = self.delimiter(i + 1, ':')? + 1;
                self.check_index(i)?;
                let text = self.tok(i).to_string();
                let mb = self.size_t("large_segment_size_mb", &text)?;
                if mb <= MIN_LARGE_ALLOC_MB {
                    return Err(self.check_failed(format!(
                        "CachingAllocator option large_segment_size_mb must be > {MIN_LARGE_ALLOC_MB} MB"
                    )));
                }
                self.out.settings.large_segment_size = mb.min(u64::MAX / MIB) * MIB;
            }
            i += 1;
        }
        self.out.settings.max_non_split_rounding_size = self.out.settings.large_segment_size;
        Ok(())
    }

    /// One `key:value` item; returns the index of its last token.
    fn parse_key(&mut self, spec: &'static KeySpec, i: usize) -> Result<usize, ConfError> {
        // The cudaMallocAsync warning flag: era B sets it for every key but
        // `backend`; era C only for the keys the CUDA parser owns, so
        // max_split_size_mb & co. no longer trigger it there.
        if spec.name != "backend"
            && (self.era == Era::Lexer || self.era == Era::Tokenizer && spec.owner == Owner::Cuda)
        {
            self.used_native_specific = true;
        }
        let i = self.delimiter(i + 1, ':')?;
        let canonical = spec.canonical;
        match canonical {
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                self.parse_mb_limit(canonical, i + 1)
            }
            "garbage_collection_threshold" => self.parse_gc_threshold(i + 1),
            "roundup_power2_divisions" => self.parse_roundup(i + 1),
            "backend" => self.parse_backend(i + 1),
            "expandable_segments" => {
                self.out.settings.expandable_segments = self.boolean(i + 1, canonical, None)?;
                Ok(i + 1)
            }
            "release_lock_on_cudamalloc" => {
                self.out.settings.release_lock_on_cudamalloc =
                    self.boolean(i + 1, canonical, None)?;
                self.note(format!("{}: {}", spec.name, spec.note));
                Ok(i + 1)
            }
            "per_process_memory_fraction" => {
                self.value(i + 1, "")?;
                let text = self.tok(i + 1).to_string();
                let f = self.double(canonical, &text)?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(self.check_failed(
                        "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                    ));
                }
                self.out.settings.per_process_memory_fraction = Some(f);
                Ok(i + 1)
            }
            "large_segment_size_mb" => self.skip_key(i - 1),
            "roundup_bypass_threshold_mb" => {
                // 1.13 only, no validation; reached through the regex era.
                let text = self.tok(i + 1).to_string();
                let mb = self.size_t(canonical, &text)?;
                self.out.settings.roundup_bypass_threshold = mb.wrapping_mul(MIB);
                Ok(i + 1)
            }
            _ => self.parse_unmodelled(spec, i + 1),
        }
    }

    /// `parseMaxSplitSize` / `parseMaxNonSplitRoundingSize`.
    fn parse_mb_limit(&mut self, key: &'static str, i: usize) -> Result<usize, ConfError> {
        self.value(i, &format!("Error, expecting {key} value"))?;
        let text = self.tok(i).to_string();
        let mb = self.size_t(key, &text)?;
        let floor = match self.era {
            Era::Tokenizer => self.out.settings.large_segment_size / MIB,
            _ => LARGE_BUFFER_MB,
        };
        let ok = match self.era {
            Era::Tokenizer => mb >= floor,
            _ => mb > floor,
        };
        if !ok {
            let op = if self.era == Era::Tokenizer || !self.at_least(1, 12) {
                ">="
            } else {
                ">"
            };
            return Err(self.check_failed(format!(
                "CachingAllocator option {key} too small, must be {op} {floor}"
            )));
        }
        let bytes = mb.min(u64::MAX / MIB) * MIB;
        if key == "max_split_size_mb" {
            self.out.settings.max_split_size = bytes;
        } else {
            self.out.settings.max_non_split_rounding_size = bytes;
        }
        Ok(i)
    }

    /// `parseGarbageCollectionThreshold`.
    fn parse_gc_threshold(&mut self, i: usize) -> Result<usize, ConfError> {
        self.value(i, "Error, expecting garbage_collection_threshold value")?;
        let text = self.tok(i).to_string();
        let t = self.double("garbage_collection_threshold", &text)?;
        self.set_gc_threshold(t)?;
        Ok(i)
    }

    fn set_gc_threshold(&mut self, t: f64) -> Result<(), ConfError> {
        if self.era == Era::Tokenizer {
            if !(t > 0.0 && t < 1.0) {
                return Err(
                    self.check_failed("garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
                );
            }
        } else if t.is_nan() || t <= 0.0 {
            return Err(self.check_failed("garbage_collect_threshold too small, set it 0.0~1.0"));
        } else if t >= 1.0 {
            return Err(self.check_failed("garbage_collect_threshold too big, set it 0.0~1.0"));
        }
        self.out.settings.garbage_collection_threshold = t;
        Ok(())
    }

    fn divisions_word(&self) -> &'static str {
        // The "divisons" typo was fixed in 2.9.
        if self.at_least(2, 9) {
            "divisions"
        } else {
            "divisons"
        }
    }

    fn check_power_of_two_divisions(&self, d: u64) -> Result<(), ConfError> {
        if d.is_power_of_two() {
            Ok(())
        } else {
            Err(self.check_failed(format!(
                "For roundups, the {} has to be power of 2 ",
                self.divisions_word()
            )))
        }
    }

    /// `parseRoundUpPower2Divisions` (2.0+; 1.12–1.13 take the scalar form
    /// through the regex era). Semantics of §6.4.
    fn parse_roundup(&mut self, mut i: usize) -> Result<usize, ConfError> {
        self.value(i, "Error, expecting roundup_power2_divisions value")?;
        let table = &mut [0u64; ROUNDUP_INTERVALS];
        if self.tok(i) != "[" || self.era == Era::Regex {
            let text = self.tok(i).to_string();
            let d = self.size_t("roundup_power2_divisions", &text)?;
            self.check_power_of_two_divisions(d)?;
            self.out.settings.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
            if d == 1 && self.version <= TorchVersion::new(2, 0) {
                self.note(format!(
                    "roundup_power2_divisions:1 in PyTorch {} also turns off the 512-byte rounding of requests above 512 bytes (1.12–2.0 quirk)",
                    self.version
                ));
            }
            return Ok(i);
        }
        let mut last = 0usize;
        let mut first = true;
        let mut overwrote: Option<(u64, u64)> = None;
        loop {
            i += 1;
            if i >= self.toks.len() || self.tok(i) == "]" {
                break;
            }
            let boundary_at = i;
            i = self.delimiter(i + 1, ':')? + 1;
            self.value(i, "Error parsing roundup_power2_divisions value")?;
            let text = self.tok(i).to_string();
            let d = self.size_t("roundup_power2_divisions", &text)?;
            let zero_ok = self.at_least(2, 4);
            if !(d.is_power_of_two() || zero_ok && d == 0) {
                let tail = if zero_ok {
                    " or 0 to disable roundup "
                } else {
                    " "
                };
                return Err(self.check_failed(format!(
                    "For roundups, the {} has to be power of 2{tail}",
                    self.divisions_word()
                )));
            }
            let boundary = self.tok(boundary_at).to_string();
            if boundary == ">" {
                // 2.0–2.9 fill from the last explicit bucket (overwriting it);
                // 2.10+ from the one after it.
                let from = if self.era == Era::Tokenizer {
                    last + 1
                } else {
                    last
                };
                if self.era == Era::Lexer && !first && table[last] != d {
                    overwrote = Some((1 << last, table[last]));
                }
                for t in table.iter_mut().skip(from) {
                    *t = d;
                }
            } else {
                let (r, function) = if self.era == Era::Tokenizer {
                    (cpp::stoull(&boundary), "stoull")
                } else {
                    (cpp::stoull(&boundary), "stoul")
                };
                let k = self.converted("roundup_power2_divisions", &boundary, r, function)?;
                if !k.is_power_of_two() {
                    return Err(
                        self.check_failed("For roundups, the intervals have to be power of 2 ")
                    );
                }
                let idx = (k.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
                if first {
                    for t in table.iter_mut().take(idx) {
                        *t = d;
                    }
                    first = false;
                }
                table[idx] = d;
                last = idx;
            }
            if i + 1 >= self.toks.len() {
                return Err(match self.era {
                    Era::Tokenizer => Self::internal_assert("Index out of bounds in ConfigTokenizer"),
                    _ => ConfError {
                        exception: None,
                        message: "the list is not closed with ']': PyTorch reads past the end of its token list here (undefined behaviour: a crash or a garbage read)".into(),
                        origin: ErrorOrigin::ReadsPastEnd,
                    },
                });
            }
            if self.tok(i + 1) != "]" {
                i = self.delimiter(i + 1, ',')?;
            }
        }
        if i >= self.toks.len() {
            if self.era == Era::Tokenizer {
                return Err(Self::internal_assert(
                    "Expected closing bracket ']' in ConfigTokenizer but reached end of config",
                ));
            }
            self.note("roundup_power2_divisions: the list is not closed with ']'; PyTorch 2.0–2.9 accepts it anyway".into());
        }
        if let Some((mb, was)) = overwrote {
            self.note(format!(
                "roundup_power2_divisions: in PyTorch {} '>' also overwrites the {mb} MB bucket (was {was}); 2.10+ keeps it",
                self.version
            ));
        }
        self.out.settings.roundup_power2_divisions = *table;
        Ok(i)
    }

    /// `parseAllocatorConfig`: the CUDA-version checks and the
    /// load-time/runtime backend assert cannot fail for an environment value.
    fn parse_backend(&mut self, i: usize) -> Result<usize, ConfError> {
        self.value(i, "Error parsing backend value")?;
        match self.tok(i) {
            "native" => self.out.settings.backend = Backend::Native,
            "cudaMallocAsync" => {
                self.out.settings.backend = Backend::CudaMallocAsync;
                self.used_async = true;
            }
            _ => {
                return Err(self.check_failed(
                    "Unknown allocator backend, options are native and cudaMallocAsync",
                ));
            }
        }
        // The backend was fixed at load time by a cruder parser; a value the
        // two read differently (`backend: cudaMallocAsync`) trips this assert.
        // 2.10+ is left out: whether its static initializer still uses the
        // regex split is UNVERIFIED.
        if self.era == Era::Lexer && self.out.settings.backend != load_time_backend(self.raw) {
            return Err(Self::internal_assert(
                "Allocator backend parsed at runtime != allocator backend parsed at load time",
            ));
        }
        Ok(i)
    }

    /// Keys that do not change what the bundled allocator does: validated as
    /// PyTorch validates them, then recorded.
    fn parse_unmodelled(&mut self, spec: &'static KeySpec, i: usize) -> Result<usize, ConfError> {
        let key = spec.canonical;
        let missing = format!("Error, expecting {key} value");
        let end = match key {
            "pinned_num_register_threads" => {
                self.value(i, &missing)?;
                let text = self.tok(i).to_string();
                let n = self.size_t(key, &text)?;
                let got = if self.era == Era::Tokenizer {
                    format!(", got {n}")
                } else {
                    " ".into()
                };
                if !n.is_power_of_two() {
                    return Err(self.check_failed(format!(
                        "Number of register threads has to be power of 2{got}"
                    )));
                }
                if n > MAX_REGISTER_THREADS {
                    let got = if self.era == Era::Tokenizer {
                        format!(", got {n}")
                    } else {
                        String::new()
                    };
                    return Err(self.check_failed(format!(
                        "Number of register threads should be less than or equal to {MAX_REGISTER_THREADS}{got}"
                    )));
                }
                i
            }
            "pinned_reserve_segment_size_mb"
            | "pinned_max_round_threshold_mb"
            | "pinned_max_cached_size_mb" => {
                self.check_index(i)?;
                let text = self.tok(i).to_string();
                let n = self.size_t(key, &text)?;
                if key == "pinned_reserve_segment_size_mb" && n == 0 {
                    return Err(
                        self.check_failed("Pinned reserve segment size has to be greater than 0")
                    );
                }
                i
            }
            "expandable_segments_reserve_by_class" => self.skip_key(i - 2)?,
            "expandable_segments_reserve" => {
                self.check_index(i)?;
                let text = self.tok(i).to_string();
                if !valid_reserve(&text) {
                    self.out.warnings.push(ConfWarning {
                        text: format!(
                            "Ignoring invalid expandable-segment reserve value '{text}' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."
                        ),
                        from_pytorch: true,
                    });
                }
                i
            }
            // Booleans: pinned_use_cuda_host_register, pinned_use_background_threads,
            // graph_capture_record_stream_reuse, pinned_free_catch_all,
            // throw_on_cudamalloc_oom.
            _ => {
                self.boolean(i, key, Some(&missing))?;
                i
            }
        };
        let value = self
            .toks
            .get(i..=end)
            .map(|t| t.concat())
            .unwrap_or_default();
        self.record_unmodelled(spec, value);
        Ok(end)
    }

    fn record_unmodelled(&mut self, spec: &'static KeySpec, value: String) {
        let s = &mut self.out.settings;
        if !s.unmodelled_keys.iter().any(|k| k == spec.name) {
            s.unmodelled_keys.push(spec.name.to_string());
        }
        self.out.unmodelled.retain(|u| u.key != spec.name);
        self.out.unmodelled.push(Unmodelled {
            key: spec.name.to_string(),
            value,
            effect: spec.effect,
            note: spec.note,
        });
    }

    /// Era A, `CachingAllocatorConfig::parseArgs` (1.10–1.13).
    fn parse_regex_era(&mut self, value: &str) -> Result<(), ConfError> {
        for (option, kv) in regex_options(value) {
            if kv.len() < 2 {
                if !option.chars().all(|c| c == ':') {
                    self.note(format!(
                        "'{option}' has no value; PyTorch {} silently ignores it",
                        self.version
                    ));
                }
                continue;
            }
            if kv.len() > 2 {
                self.note(format!(
                    "'{option}': PyTorch {} reads only '{}:{}' and ignores the rest",
                    self.version, kv[0], kv[1]
                ));
            }
            let Some(spec) = keys::lookup(kv[0], self.version) else {
                return Err(
                    self.check_failed(format!("Unrecognized CachingAllocator option: {}", kv[0]))
                );
            };
            // Reuse the token-level helpers on the two parts.
            self.toks = vec![
                Cow::Owned(kv[0].to_string()),
                Cow::Borrowed(":"),
                Cow::Owned(kv[1].to_string()),
            ];
            self.parse_key(spec, 0)?;
        }
        Ok(())
    }

    /// Warnings PyTorch prints after a successful parse, and allocdoc's notes
    /// on the result.
    fn finish(&mut self) {
        if self.used_async && self.used_native_specific {
            // 2.0 source: a space after the first comma, none after the second.
            let ignored = if self.version == TorchVersion::new(2, 0) {
                "max_split_size_mb, roundup_bypass_threshold_mb,roundup_power2_divisions, and garbage_collect_threshold."
            } else {
                "max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."
            };
            self.out.warnings.push(ConfWarning {
                text: format!("backend:cudaMallocAsync ignores {ignored}"),
                from_pytorch: true,
            });
        }
        let s = self.out.settings.clone();
        if s.backend == Backend::CudaMallocAsync {
            self.note(
                "backend:cudaMallocAsync is not modelled by the bundled allocator (it models the native caching allocator); the native settings below have no effect under it"
                    .into(),
            );
        }
        if s.garbage_collection_threshold > 0.0 && s.per_process_memory_fraction.is_none() {
            self.note(
                "garbage_collection_threshold only acts when a per-process memory fraction is set (torch.cuda.set_per_process_memory_fraction)"
                    .into(),
            );
        }
        if s.expandable_segments {
            // CUDAAllocatorConfig::expandable_segments(): a compile-time guard.
            self.note(
                "builds without the CUDA driver API (Windows; ROCm before support) warn \"expandable_segments not supported on this platform\" and ignore expandable_segments"
                    .into(),
            );
        }
    }
}

/// The options of the 1.x parser and of 2.x's `BackendStaticInitializer`:
/// `std::regex` split on `[\s,]+`, each option on `[:]+` (a leading empty
/// part is kept, a trailing one is not). Yields (option, parts).
fn regex_options(value: &str) -> impl Iterator<Item = (&str, Vec<&str>)> {
    value
        .split(|c: char| c == ',' || c.is_ascii() && cpp::is_c_space(c as u8))
        .filter(|option| !option.is_empty())
        .map(|option| {
            let mut kv: Vec<&str> = option.split(':').collect();
            let lead = kv.first().is_some_and(|s| s.is_empty());
            kv.retain(|s| !s.is_empty());
            if lead {
                kv.insert(0, "");
            }
            (option, kv)
        })
}

/// `BackendStaticInitializer::parseEnvForBackend` (2.0–2.9): the backend
/// picked at load time, before the full parser runs.
fn load_time_backend(value: &str) -> Backend {
    regex_options(value)
        .filter(|(_, kv)| kv.len() >= 2 && kv[0] == "backend")
        .find_map(|(_, kv)| match kv[1] {
            "cudaMallocAsync" => Some(Backend::CudaMallocAsync),
            "native" => Some(Backend::Native),
            _ => None,
        })
        .unwrap_or(Backend::Native)
}

/// `expandable_segments_reserve` (2.15): a positive finite fraction (`0.5`)
/// or an absolute size (`40G`). The exact accepted forms are UNVERIFIED.
fn valid_reserve(text: &str) -> bool {
    if let Ok(f) = text.parse::<f64>() {
        return f.is_finite() && f > 0.0;
    }
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    matches!(
        unit,
        "G" | "GB" | "GiB" | "M" | "MB" | "MiB" | "T" | "TB" | "TiB"
    ) && digits
        .parse::<f64>()
        .is_ok_and(|f| f.is_finite() && f > 0.0)
}
