//! The memory budget of one run: how much any single input may make allocdoc
//! read and hold. Every limit has a flag; going over one is `Error::Input`
//! (exit 2) naming the limit and the flag, never an abort.
//!
//! The defaults fit a 2-core, 24 GiB machine with room for multi-GB
//! snapshots: a snapshot pickle holds at most about one decoded value per 3
//! input bytes, so [`Limits::max_objects`] (8 GiB of values) admits pickles of
//! 3 GB and more, and its blocks (32 bytes each) stay under 2 GiB.

use crate::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct Limits {
    /// The most bytes read from one input, after decompression.
    ///
    /// Bounds the time an endless input (a device, a pipe that never closes)
    /// can take, and the memory of the inputs held whole: pickles, trace CSVs
    /// and RMM logs that arrive compressed or through a pipe.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE", value_parser = crate::units::parse_size,
        default_value = MAX_INPUT_DEFAULT, help_heading = "Limits"))]
    pub max_input_bytes: u64,
    /// The most values a snapshot pickle may decode to (8 bytes each).
    ///
    /// Objects, container items and memo entries all count. At the default,
    /// a pickle may also decode to at most 3/4 of a value per input byte
    /// (and 64 MiB): a snapshot holds less, a flood of cheap opcodes more.
    /// Naming another value replaces that bound.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N",
        default_value_t = Limits::default().max_objects, help_heading = "Limits"))]
    pub max_objects: u64,
    /// The most blocks a snapshot may expand to.
    ///
    /// A block list that several segments share counts once per segment.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N",
        default_value_t = Limits::default().max_blocks, help_heading = "Limits"))]
    pub max_blocks: u64,
    /// The most observations (OOM messages, summaries, stats dumps) kept from one text input.
    ///
    /// Each takes a few KiB parsed: a log of nothing but back-to-back OOM
    /// messages holds about 20 times its size in observations.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N",
        default_value_t = Limits::default().max_observations, help_heading = "Limits"))]
    pub max_observations: u64,
}

/// `--max-input-bytes`'s default as `--help` shows it: [`Limits::default`]'s, in units.
pub const MAX_INPUT_DEFAULT: &str = "16GiB";

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 16 << 30,
            max_objects: 1 << 30,
            max_blocks: 1 << 26,
            max_observations: 500_000,
        }
    }
}

/// Which limit an input went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    InputBytes,
    Objects,
    Blocks,
    Observations,
}

impl Limit {
    /// The command-line flag that raises it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::InputBytes => "--max-input-bytes",
            Limit::Objects => "--max-objects",
            Limit::Blocks => "--max-blocks",
            Limit::Observations => "--max-observations",
        }
    }

    /// What the flag takes.
    fn value(self) -> &'static str {
        match self {
            Limit::InputBytes => "SIZE",
            Limit::Objects | Limit::Blocks | Limit::Observations => "N",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Limit::InputBytes => "bytes read",
            Limit::Objects => "decoded values",
            Limit::Blocks => "snapshot blocks (shared block lists counted once per segment)",
            Limit::Observations => {
                "observations (OOM messages, memory summaries, stats dumps) in one text input"
            }
        }
    }
}

impl Limits {
    pub fn get(&self, limit: Limit) -> u64 {
        match limit {
            Limit::InputBytes => self.max_input_bytes,
            Limit::Objects => self.max_objects,
            Limit::Blocks => self.max_blocks,
            Limit::Observations => self.max_observations,
        }
    }

    /// The error for `input` going over `limit`; `detail` says by how much
    /// or where, when known.
    pub fn exceeded(&self, input: &str, limit: Limit, detail: &str) -> Error {
        let sep = if detail.is_empty() { "" } else { ": " };
        Error::Input(format!(
            "{input}: over the limit of {} {}{sep}{detail} (raise it with {} {})",
            self.get(limit),
            limit.what(),
            limit.flag(),
            limit.value()
        ))
    }
}

/// The memory this process may use: its memory cgroup's limit (v2
/// `memory.max`, v1 `memory.limit_in_bytes`) or the machine's RAM, whichever
/// is less; `None` where neither can be read. A container's limit is enforced
/// by killing the process, not by refusing an allocation, so budgets must
/// stay under it rather than wait for a refusal.
pub fn memory_available() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let ram = read("/proc/meminfo").and_then(|m| {
        let kib = m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
        Some(
            kib.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024,
        )
    });
    let cgroup = read("/proc/self/cgroup").and_then(|c| {
        c.lines().find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            let (dir, file) = if controllers.is_empty() {
                ("/sys/fs/cgroup", "memory.max")
            } else if controllers.split(',').any(|c| c == "memory") {
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
            } else {
                return None;
            };
            // Inside a container the mount's root is the process's own group.
            // "max" (v2) or a huge number (v1) when unlimited.
            [format!("{dir}{path}/{file}"), format!("{dir}/{file}")]
                .iter()
                .find_map(|f| read(f)?.trim().parse::<u64>().ok())
        })
    });
    match (ram, cgroup) {
        (Some(r), Some(c)) => Some(r.min(c)),
        (r, c) => r.or(c),
    }
}

/// The error for an allocation the system refused while reading `input`.
pub fn out_of_memory(input: &str, what: &str, bytes: usize) -> Error {
    Error::Input(format!(
        "{input}: not enough memory for {what} (the system refused {bytes} more bytes); \
         lower --max-input-bytes, --max-objects, --max-blocks or --max-observations to stop such inputs earlier"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_memory_available_is_at_most_the_machine_ram() {
        let m = memory_available().expect("Linux has /proc/meminfo");
        let info = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert!(m > 0 && m <= kib * 1024, "{m} of {kib} KiB");
    }

    #[test]
    fn the_shown_default_is_the_default() {
        assert_eq!(
            crate::units::parse_size(MAX_INPUT_DEFAULT),
            Ok(Limits::default().max_input_bytes)
        );
    }

    #[test]
    fn errors_name_the_limit_and_its_flag() {
        let l = Limits {
            max_blocks: 10,
            ..Limits::default()
        };
        let e = l
            .exceeded("s.pickle", Limit::Blocks, "400000000 blocks")
            .to_string();
        assert_eq!(
            e,
            "s.pickle: over the limit of 10 snapshot blocks (shared block lists counted once per segment): 400000000 blocks (raise it with --max-blocks N)"
        );
        assert_eq!(crate::Error::Input(e).exit_code(), 2);
    }
}
