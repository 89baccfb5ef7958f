//! The evaluation of text-only answers behind docs/EVALUATION.md ("Text-only
//! validate and recommend against replays"): every trace family of
//! `tests/support/trace_families.rs` over `--seeds N` seeds (default 10),
//! the OOM message of each fed to text-only `validate` and `recommend`, the
//! answers compared with replaying the trace.
//!
//!     cargo run --profile ci --example text_eval -- --seeds 10 [--first 1] [--detail] [--keep DIR]
//!
//! `--first K` starts at seed K (seeds K to K + N - 1): thresholds are
//! calibrated on seeds 1-5 and checked on seeds held out from that.
//! Deterministic: the same build prints the same tables.

#[path = "../tests/support/text_eval.rs"]
mod text_eval;
#[path = "../tests/support/trace_families.rs"]
mod trace_families;

/// The value after `name` on the command line, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seeds: u64 = option(&args, "--seeds").unwrap_or(10);
    let first: u64 = option(&args, "--first").unwrap_or(1);
    let dir = tempfile::tempdir().expect("a temporary directory");
    // `--keep DIR`: write the messages and traces there, to look into a case.
    let kept: Option<std::path::PathBuf> = option(&args, "--keep");
    let dir_path = kept.clone().unwrap_or_else(|| dir.path().to_path_buf());
    let mut cases = Vec::new();
    for family in trace_families::TraceFamily::ALL {
        for seed in first..first + seeds {
            if let Some(c) = text_eval::evaluate(family, seed, &dir_path) {
                eprintln!(
                    "{} seed {seed}: ES {} / validate exit {} / recommend exit {}",
                    family.name(),
                    c.es_avoids,
                    c.validate.exit_code,
                    c.recommend.exit_code
                );
                cases.push(c);
            }
        }
    }
    print!("{}", text_eval::summary(&cases));
    if args.iter().any(|a| a == "--detail") {
        println!();
        print!("{}", text_eval::detail(&cases));
    }
}
