//! What the text around the OOM says about the environment, and what the user
//! told us: the PyTorch version, the allocator config in use, Windows paths,
//! and components that share CUDA memory between processes (which rule out
//! expandable segments). The text is not read here: `ingest`'s scanner
//! finds these clues on its own pass ([`TextClues`]), and this decides what
//! they mean next to the flags.

use crate::conf::Settings;
use crate::evidence::TextClues;
use crate::rules::VersionRange;

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

impl Context {
    /// Takes what the text says (the scanner's [`TextClues`]) where the flags
    /// did not say it. The OOM hint PyTorch itself prints ("try setting
    /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") is not a config the
    /// user set, and never becomes a clue.
    pub fn absorb(&mut self, clues: &TextClues) {
        if self.torch.is_none()
            && let Some((major, minor)) = clues.torch_version
        {
            self.torch = Some(VersionRange::exact(crate::conf::TorchVersion::new(
                major, minor,
            )));
        }
        if self.current_source.is_none()
            && let Some(value) = &clues.alloc_conf
        {
            // A config in a log that PyTorch rejects is reported by `conf check`, not here.
            let _ = self.set_current(value, "the text");
        }
        if clues.max_split_hint {
            self.torch_floor = Some(crate::conf::TorchVersion::FIRST_ALLOC_CONF);
        }
        self.windows |= clues.windows_paths;
        self.expandable_unsupported |= clues.expandable_unsupported;
        self.ipc_user |= clues.ipc_user;
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
    fn clues_fill_what_the_flags_left_open() {
        let clues = TextClues {
            torch_version: Some((2, 3)),
            alloc_conf: Some("expandable_segments:True".into()),
            windows_paths: true,
            ..TextClues::default()
        };
        let mut c = Context::default();
        c.absorb(&clues);
        assert_eq!(
            c.torch,
            Some(VersionRange::exact(crate::conf::TorchVersion::new(2, 3)))
        );
        assert_eq!(
            c.current_source,
            Some(("expandable_segments:True".into(), "the text"))
        );
        assert!(c.current.as_ref().is_some_and(|s| s.expandable_segments));
        assert!(c.windows && !c.ipc_user && c.torch_floor.is_none());
        // A flag wins over the text.
        let mut c = Context::default();
        c.set_current("max_split_size_mb:128", "--conf").unwrap();
        c.absorb(&clues);
        assert_eq!(c.current_source.unwrap().0, "max_split_size_mb:128");
    }
}
