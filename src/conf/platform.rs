//! Where PyTorch runs: the platform decides which accepted settings actually
//! take effect, and how a user sets an environment variable.
//!
//! Expandable segments need the CUDA driver's virtual-memory API, which
//! PyTorch reaches only where `PYTORCH_C10_DRIVER_API_SUPPORTED` is defined
//! (Linux CUDA builds; `c10/cuda/driver_api.cpp` dlopens `libcuda.so.1`).
//! Elsewhere `CUDAAllocatorConfig::expandable_segments()` warns once
//! "expandable_segments not supported on this platform" and returns false:
//! the value is accepted and ignored. ROCm builds read the same key through
//! `HIPAllocatorConfig`, which ignores it the same way until ROCm support
//! landed (pytorch#177974, 2.12, ROCm >= 7.0).

use super::{ConfWarning, Settings, TorchVersion};
use serde::Serialize;

/// The platform a PyTorch build runs on, as far as the allocator cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Platform {
    /// A CUDA build on Linux (also WSL2's Linux side).
    #[default]
    Linux,
    /// A CUDA build on Windows (WDDM or TCC).
    Windows,
    /// A ROCm (HIP) build on Linux.
    Rocm,
}

/// The first PyTorch release whose ROCm allocator honours expandable segments.
pub const ROCM_EXPANDABLE_SINCE: TorchVersion = TorchVersion::new(2, 12);

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Linux => "Linux",
            Platform::Windows => "Windows",
            Platform::Rocm => "ROCm",
        }
    }

    /// Whether PyTorch `version` on this platform acts on `expandable_segments:True`.
    pub fn honours_expandable_segments(self, version: TorchVersion) -> bool {
        match self {
            Platform::Linux => true,
            Platform::Windows => false,
            Platform::Rocm => version >= ROCM_EXPANDABLE_SINCE,
        }
    }

    /// What PyTorch accepts but ignores on this platform, as warnings (PyTorch
    /// prints the first one itself).
    pub fn ignored(self, settings: &Settings) -> Vec<ConfWarning> {
        let mut out = Vec::new();
        if settings.expandable_segments && !self.honours_expandable_segments(settings.version) {
            let why = match self {
                Platform::Rocm => format!(
                    "PyTorch's ROCm allocator honours it from {ROCM_EXPANDABLE_SINCE} (with ROCm 7.0 or later)"
                ),
                _ => {
                    "the CUDA driver's virtual-memory API is used only by Linux builds".to_string()
                }
            };
            out.push(ConfWarning {
                text: format!(
                    "on {} PyTorch {} accepts expandable_segments:True but ignores it and warns \
                     \"expandable_segments not supported on this platform\": {why}",
                    self.as_str(),
                    settings.version
                ),
                from_pytorch: true,
            });
        }
        out
    }

    /// `settings` as they take effect here: what the platform ignores is off.
    pub fn effective(self, settings: &Settings) -> Settings {
        let mut s = settings.clone();
        if !self.honours_expandable_segments(s.version) {
            s.expandable_segments = false;
        }
        s
    }
}

/// A shell a user sets the variable in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shell {
    /// bash, zsh, sh: `export`.
    Posix,
    /// Windows cmd.exe: `set`.
    Cmd,
    /// PowerShell: `$env:`.
    PowerShell,
}

impl Shell {
    /// The shells of a platform, the usual one first.
    pub fn of(platform: Platform) -> &'static [Shell] {
        match platform {
            Platform::Windows => &[Shell::Cmd, Shell::PowerShell],
            Platform::Linux | Platform::Rocm => &[Shell::Posix],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Shell::Posix => "sh",
            Shell::Cmd => "cmd.exe",
            Shell::PowerShell => "PowerShell",
        }
    }

    /// The line that sets `var` to `value`, or clears it when `value` is empty
    /// (PyTorch's defaults are asked for by unsetting, not by an empty value).
    pub fn line(self, var: &str, value: &str) -> String {
        match (self, value.is_empty()) {
            (Shell::Posix, false) => format!("export {var}={value}"),
            (Shell::Posix, true) => format!("unset {var}"),
            // cmd.exe keeps quotes and trailing spaces in the value: none here.
            (Shell::Cmd, false) => format!("set {var}={value}"),
            (Shell::Cmd, true) => format!("set {var}="),
            (Shell::PowerShell, false) => format!("$env:{var} = \"{value}\""),
            (Shell::PowerShell, true) => format!("Remove-Item Env:{var}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_are_ignored_off_linux() {
        let es = Settings {
            expandable_segments: true,
            version: TorchVersion::new(2, 4),
            ..Settings::default()
        };
        assert!(Platform::Linux.ignored(&es).is_empty());
        let w = Platform::Windows.ignored(&es);
        assert_eq!(w.len(), 1);
        assert!(w[0].text.contains("not supported on this platform"));
        assert!(!Platform::Windows.effective(&es).expandable_segments);
        assert!(!Platform::Rocm.effective(&es).expandable_segments);
        let later = Settings {
            version: TorchVersion::new(2, 12),
            ..es
        };
        assert!(Platform::Rocm.effective(&later).expandable_segments);
    }

    #[test]
    fn lines_per_shell() {
        let v = "PYTORCH_CUDA_ALLOC_CONF";
        assert_eq!(
            Shell::Posix.line(v, "expandable_segments:True"),
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
        assert_eq!(
            Shell::Cmd.line(v, "max_split_size_mb:512"),
            "set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"
        );
        assert_eq!(
            Shell::PowerShell.line(v, "max_split_size_mb:512"),
            "$env:PYTORCH_CUDA_ALLOC_CONF = \"max_split_size_mb:512\""
        );
        assert_eq!(Shell::Posix.line(v, ""), "unset PYTORCH_CUDA_ALLOC_CONF");
        assert_eq!(
            Shell::PowerShell.line(v, ""),
            "Remove-Item Env:PYTORCH_CUDA_ALLOC_CONF"
        );
    }
}
