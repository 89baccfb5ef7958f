//! What the text around the OOM says about the environment, and what the user
//! told us: the PyTorch version, the allocator config in use, Windows paths,
//! and components that share CUDA memory between processes (which rule out
//! expandable segments). This reads context lines only; the OOM messages
//! themselves are parsed by `ingest`.

use crate::conf::Settings;
use crate::rules::VersionRange;
use regex::Regex;
use std::sync::LazyLock;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// From `--torch-version`, or a version line in the text (collect_env, pip freeze).
    pub torch: Option<VersionRange>,
    /// The allocator config in effect, from `--conf` or a `PYTORCH_*ALLOC_CONF=` in the text.
    pub current: Option<Settings>,
    /// The raw config value and where it came from ("--conf", "the text").
    pub current_source: Option<(String, &'static str)>,
    pub windows: bool,
    pub ipc_user: bool,
}

static VERSION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?im)(?:PyTorch version:\s*|torch\s*==\s*|torch version[:=]?\s*|torch\s+)v?(\d+)\.(\d+)(?:\.\d+)?").unwrap_or_else(|e| panic!("static regex: {e}"))
});
static CONF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF\s*[=:]\s*["']?([A-Za-z_][A-Za-z0-9_:.,\[\]>]*)"#,
    )
    .unwrap_or_else(|e| panic!("static regex: {e}"))
});
static WINDOWS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?m)(?:File "[A-Za-z]:\\|\b[A-Za-z]:\\(?:Users|Program Files|ProgramData|Python)|\\site-packages\\torch)"#)
        .unwrap_or_else(|e| panic!("static regex: {e}"))
});
/// §5: expandable segments break CUDA IPC users: vLLM's custom all-reduce and
/// CuMemAllocator (sleep mode), torch_memory_saver.
static IPC: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)torch_memory_saver|custom_all_reduce|CuMemAllocator|cumem_allocator")
        .unwrap_or_else(|e| panic!("static regex: {e}"))
});

impl Context {
    /// Scans the text of every input. The OOM hint PyTorch itself prints
    /// ("try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") is not a
    /// config the user set, so lines holding "try setting" are skipped.
    pub fn scan(&mut self, text: &str) {
        if self.torch.is_none()
            && let Some(c) = VERSION.captures(text)
        {
            let v = |i| c.get(i).and_then(|m| m.as_str().parse().ok());
            if let (Some(major), Some(minor)) = (v(1), v(2))
                && (1..=9).contains(&major)
            {
                self.torch = Some(VersionRange::exact(crate::conf::TorchVersion::new(
                    major, minor,
                )));
            }
        }
        if self.current_source.is_none() {
            for line in text.lines().filter(|l| !l.contains("try setting")) {
                if let Some(c) = CONF.captures(line) {
                    let value = c
                        .get(1)
                        .map_or("", |m| m.as_str())
                        .trim_end_matches([',', '.']);
                    self.set_current(value, "the text");
                    break;
                }
            }
        }
        self.windows |= WINDOWS.is_match(text);
        self.ipc_user |= IPC.is_match(text);
    }

    /// Records the config in effect; an unparsable value is kept as text only.
    pub fn set_current(&mut self, value: &str, source: &'static str) {
        self.current = super::combine::settings_of(value);
        self.current_source = Some((value.to_string(), source));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_versions_configs_and_platforms() {
        let mut c = Context::default();
        c.scan(
            "PyTorch version: 2.3.1+cu121\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n\
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
        c.scan("If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
        assert_eq!(c.current_source, None);
        c.scan("vllm/distributed/device_communicators/custom_all_reduce.py");
        assert!(c.ipc_user);
    }
}
