//! What the text around the OOM says about the environment, and what the user
//! told us: the PyTorch version, the allocator config in use, Windows paths,
//! and components that share CUDA memory between processes (which rule out
//! expandable segments). This reads context lines only; the OOM messages
//! themselves are parsed by `ingest`.

use crate::conf::Settings;
use crate::rules::VersionRange;
use memchr::memmem;
use regex::bytes::Regex;
use std::sync::LazyLock;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// From `--torch-version`, or a version line in the text (collect_env, pip freeze).
    pub torch: Option<VersionRange>,
    /// The oldest version the text allows: PyTorch's hint "try setting
    /// max_split_size_mb" appeared in 1.10 (§7.2).
    pub torch_floor: Option<crate::conf::TorchVersion>,
    /// The allocator config in effect, from `--conf` or a `PYTORCH_*ALLOC_CONF=` in the text.
    pub current: Option<Settings>,
    /// The raw config value and where it came from ("--conf", "the text").
    pub current_source: Option<(String, &'static str)>,
    pub windows: bool,
    /// PyTorch warned "expandable_segments not supported on this platform"
    /// (old driver, no driver API; pytorch#122057).
    pub expandable_unsupported: bool,
    pub ipc_user: bool,
    /// What the command line says about the setup (`--torch-version`,
    /// `--platform`); it wins over every clue ([`super::setup`]).
    pub flags: super::setup::SetupFlags,
}

static VERSION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?im-u)(?:PyTorch version:\s*|torch\s*==\s*|torch version[:=]?\s*|torch\s+)v?(\d+)\.(\d+)(?:\.\d+)?").unwrap_or_else(|e| panic!("static regex: {e}"))
});
static CONF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?-u)PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF\s*[=:]\s*["']?([A-Za-z_][A-Za-z0-9_:.,\[\]>]*)"#,
    )
    .unwrap_or_else(|e| panic!("static regex: {e}"))
});
static WINDOWS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?m-u)(?:File "[A-Za-z]:\\|\b[A-Za-z]:\\(?:Users|Program Files|ProgramData|Python)|\\site-packages\\torch)"#)
        .unwrap_or_else(|e| panic!("static regex: {e}"))
});
/// §5: expandable segments break CUDA IPC users: vLLM's custom all-reduce and
/// CuMemAllocator (sleep mode), torch_memory_saver.
static IPC: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i-u)torch_memory_saver|custom_all_reduce|CuMemAllocator|cumem_allocator")
        .unwrap_or_else(|e| panic!("static regex: {e}"))
});

/// PyTorch's OOM hint ("… try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
/// to avoid fragmentation"), also when a terminal or a log prefix wrapped it.
fn is_pytorch_hint(text: &[u8], start: usize, end: usize) -> bool {
    let before = &text[start.saturating_sub(80)..start];
    let after = &text[end..end.saturating_add(40).min(text.len())];
    memmem::find(before, b"try").is_some() || memmem::find(after, b"avoid").is_some()
}

impl Context {
    /// Scans the text of every input. The OOM hint PyTorch itself prints
    /// ("try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") is not a
    /// config the user set, so lines holding "try setting" are skipped.
    /// Works on raw bytes with ASCII-only patterns: a multi-GB log is scanned
    /// without a UTF-8 copy, and non-ASCII text cannot push the regexes off the DFA.
    pub fn scan(&mut self, text: &[u8]) {
        if self.torch.is_none()
            && let Some(c) = VERSION.captures(text)
        {
            let v = |i| {
                c.get(i)
                    .and_then(|m| std::str::from_utf8(m.as_bytes()).ok())
                    .and_then(|m| m.parse().ok())
            };
            if let (Some(major), Some(minor)) = (v(1), v(2))
                && (1..=9).contains(&major)
            {
                self.torch = Some(VersionRange::exact(crate::conf::TorchVersion::new(
                    major, minor,
                )));
            }
        }
        if self.current_source.is_none() {
            for c in CONF.captures_iter(text) {
                let (Some(all), Some(value)) = (c.get(0), c.get(1)) else {
                    continue;
                };
                if is_pytorch_hint(text, all.start(), all.end()) {
                    continue;
                }
                // A config in a log that PyTorch rejects is reported by `conf check`, not here.
                let Ok(value) = std::str::from_utf8(value.as_bytes()) else {
                    continue;
                };
                let _ = self.set_current(value.trim_end_matches([',', '.']), "the text");
                break;
            }
        }
        if memmem::find(text, b"try setting max_split_size_mb").is_some() {
            self.torch_floor = Some(crate::conf::TorchVersion::new(1, 10));
        }
        self.windows |= WINDOWS.is_match(text);
        self.expandable_unsupported |=
            memmem::find(text, b"expandable_segments not supported on this platform").is_some();
        self.ipc_user |= IPC.is_match(text);
    }

    /// Records the config in effect. A value PyTorch would reject is kept as
    /// text only, and the error says why (the settings then stay unknown).
    pub fn set_current(&mut self, value: &str, source: &'static str) -> Result<(), String> {
        let version = self
            .torch
            .and_then(|t| t.lo)
            .unwrap_or(crate::conf::TorchVersion::DEFAULT);
        self.current_source = Some((value.to_string(), source));
        match crate::conf::parse(value, version) {
            Ok(p) => {
                self.current = Some(p.settings);
                Ok(())
            }
            Err(e) => {
                self.current = None;
                Err(format!(
                    "PyTorch {version} would reject the config '{value}' ({source}): {e}; see `allocdoc conf check`"
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_versions_configs_and_platforms() {
        let mut c = Context::default();
        c.scan(
            b"PyTorch version: 2.3.1+cu121\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n\
             File \"C:\\Users\\me\\train.py\", line 3\n",
        );
        assert_eq!(
            c.torch,
            Some(VersionRange::exact(crate::conf::TorchVersion::new(2, 3)))
        );
        assert_eq!(
            c.current_source.as_ref().map(|s| s.0.as_str()),
            Some("expandable_segments:True")
        );
        assert!(c.current.as_ref().is_some_and(|s| s.expandable_segments));
        assert!(c.windows && !c.ipc_user);
    }

    #[test]
    fn pytorch_hint_is_not_a_user_config() {
        let mut c = Context::default();
        c.scan(b"If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
        assert_eq!(c.current_source, None);
        c.scan(b"[rank2]: eserved but unallocated memory is large try settin\n[rank2]: g PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n[rank2]:  to avoid fragmentation.");
        assert_eq!(c.current_source, None);
        c.scan(b"vllm/distributed/device_communicators/custom_all_reduce.py");
        assert!(c.ipc_user);
    }
}
