//! The `allocdoc` binary: parses the command line, calls the library, prints
//! what it returns and exits with the contract's code. Nothing else lives here.

use allocdoc::app::{self, Format, Outcome};
use allocdoc::units::{decimal_unit_note, parse_device_size};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "allocdoc",
    version,
    about = "Diagnose PyTorch GPU out-of-memory failures and prove which PYTORCH_CUDA_ALLOC_CONF fixes them",
    after_help = "Examples:\n  allocdoc diagnose train.log\n  pbpaste | allocdoc diagnose\n  allocdoc parse --format json oom.txt\n  allocdoc conf check 'expandable_segments:True' --torch-version 2.1\n  allocdoc replay trace.csv --conf '' --conf expandable_segments:True --capacity 24GiB\n  allocdoc recommend snapshot.pickle --capacity 16GiB"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    Text,
    Json,
    Markdown,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Text => Format::Text,
            FormatArg::Json => Format::Json,
            FormatArg::Markdown => Format::Markdown,
        }
    }
}

#[derive(Args, Clone, Copy)]
struct FormatOpt {
    /// Output format.
    #[arg(long, value_enum, default_value = "text", global = true)]
    format: FormatArg,
}

/// A device size; the first size written with a decimal-looking unit (`GB`)
/// gets a one-line note that it is read as binary.
fn size_arg(s: &str) -> Result<u64, String> {
    static NOTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let size = parse_device_size(s)?;
    if let Some(note) = decimal_unit_note(s)
        && !NOTED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        let _ = writeln!(std::io::stderr(), "{note}");
    }
    Ok(size)
}

#[derive(Subcommand)]
enum Command {
    /// The main job: parse every input, run the rules, print the cause and one environment line.
    #[command(
        after_help = "Examples:\n  allocdoc diagnose train.log\n  allocdoc diagnose rank*.log --format markdown\n  python train.py 2>&1 | allocdoc diagnose -"
    )]
    Diagnose {
        /// Logs, memory_summary()/memory_stats() dumps, snapshot pickles or traces; `-` or nothing reads standard input.
        inputs: Vec<String>,
        /// Also list rules that could not be evaluated and what they need.
        #[arg(short, long)]
        verbose: bool,
        /// A directory of extra YAML rules that add to or override the built-in ones.
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Your PyTorch version (e.g. 2.4) when the evidence does not show it.
        #[arg(long)]
        torch_version: Option<String>,
        /// The PYTORCH_CUDA_ALLOC_CONF in effect when the OOM happened (read from the text when it shows one).
        #[arg(long)]
        conf: Option<String>,
        /// Also write a self-contained HTML report.
        #[arg(long)]
        report: Option<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// The evidence alone: what was found in the inputs, nothing inferred.
    #[command(
        after_help = "Examples:\n  allocdoc parse train.log\n  allocdoc parse --format json snapshot.pickle"
    )]
    Parse {
        /// Inputs; `-` or nothing reads standard input.
        inputs: Vec<String>,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Work with PYTORCH_CUDA_ALLOC_CONF values.
    #[command(
        after_help = "Examples:\n  allocdoc conf check 'expandable_segments:True' --torch-version 2.1\n  allocdoc conf check \"$PYTORCH_CUDA_ALLOC_CONF\" --format json"
    )]
    Conf {
        #[command(subcommand)]
        action: ConfAction,
    },
    /// Run a trace through the bundled caching allocator under one or more configs.
    #[command(
        after_help = "Examples:\n  allocdoc replay trace.csv --capacity 24GiB\n  allocdoc replay trace.csv --conf '' --conf expandable_segments:True --capacity 24GiB\n  allocdoc replay snapshot.pickle --fidelity\n  allocdoc replay trace.csv --device cuda:0 --capacity 8GiB"
    )]
    Replay {
        /// A trace CSV (action,id,size,stream), an RMM replay log or a snapshot pickle with a trace.
        trace: String,
        /// A config to run under (repeatable; '' is PyTorch's default).
        #[arg(long = "conf")]
        confs: Vec<String>,
        /// Device capacity, e.g. 24GiB (default: a snapshot's recorded OOM, else an
        /// 80 GiB simulated card, or the free memory of the GPU with --device cuda).
        #[arg(long, value_parser = size_arg)]
        capacity: Option<u64>,
        /// `sim` (default) or `cuda[:N]`: run the allocator on GPU N, which must have
        /// --capacity free (exit 3 when no CUDA driver or GPU is usable).
        #[arg(long, default_value = "sim")]
        device: String,
        /// Compare every allocation with the addresses recorded in the snapshot.
        #[arg(long)]
        fidelity: bool,
        /// Print PyTorch's memory_summary() for each run at its peak and at the end.
        #[arg(long)]
        summary: bool,
        /// Follow this PyTorch version's allocator behaviour (default 2.6).
        #[arg(long)]
        torch_version: Option<String>,
        /// memory_stats() JSON written by scripts/torch_crosscheck.py, to compare against.
        #[arg(long)]
        compare_with: Option<PathBuf>,
        /// Write the last config's simulated run as a torch memory snapshot pickle
        /// (protocol 4: opens in pytorch.org/memory_viz and torch.cuda._memory_viz).
        #[arg(long)]
        emit_snapshot: Option<PathBuf>,
        /// Also write a self-contained HTML report.
        #[arg(long)]
        report: Option<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Search the config space by replay and rank the results.
    #[command(
        after_help = "When PyTorch's defaults rank first, the recommendation is to unset the variable: its line is `unset PYTORCH_CUDA_ALLOC_CONF` (value \"\").\n\nExamples:\n  allocdoc recommend trace.csv --capacity 16GiB\n  allocdoc recommend snapshot.pickle --format json\n  allocdoc recommend rmm_log.csv --capacity 24GiB\n  allocdoc recommend oom.log --current max_split_size_mb:128"
    )]
    Recommend {
        /// A trace CSV, an RMM replay log, a snapshot pickle, or text evidence (an OOM message, memory_summary()), which gets a fitted synthetic probe.
        input: String,
        /// Device capacity, e.g. 24GiB (default: what the evidence implies, else an 80 GiB card).
        #[arg(long, value_parser = size_arg)]
        capacity: Option<u64>,
        /// The config in use today (default: PyTorch's defaults).
        #[arg(long)]
        current: Option<String>,
        /// Also write a self-contained HTML report: the current and the recommended
        /// config's memory over the trace, the segment map, the ranked table.
        #[arg(long)]
        report: Option<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Replay (or probe, for text-only evidence) under the current and a candidate config.
    #[command(
        after_help = "Examples:\n  allocdoc validate trace.csv --conf expandable_segments:True --capacity 24GiB\n  allocdoc validate oom.log --conf expandable_segments:True\n  allocdoc validate oom.log --conf expandable_segments:True --device cuda"
    )]
    Validate {
        /// A trace CSV, an RMM replay log, a snapshot pickle, or text evidence (an OOM message, memory_summary()), which gets a fitted synthetic probe.
        input: String,
        /// The candidate config.
        #[arg(long)]
        conf: String,
        /// The config in use today (default: PyTorch's defaults).
        #[arg(long)]
        current: Option<String>,
        /// Device capacity, e.g. 24GiB (default: what the evidence implies, else an
        /// 80 GiB simulated card, or the free memory of the GPU with --device cuda).
        #[arg(long, value_parser = size_arg)]
        capacity: Option<u64>,
        /// `sim` (default) or `cuda[:N]`.
        #[arg(long, default_value = "sim")]
        device: String,
        /// Also write a self-contained HTML report: both configs' memory over the
        /// trace overlaid, the segment map at the OOM or the peak, the verdict.
        #[arg(long)]
        report: Option<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
    },
    /// Inspect and unit-test the YAML rules.
    #[command(
        after_help = "Examples:\n  allocdoc rules list\n  allocdoc rules show reserved-gap\n  allocdoc rules test my-rules/"
    )]
    Rules {
        #[command(subcommand)]
        action: RulesAction,
        /// A directory of extra YAML rules.
        #[arg(long, global = true)]
        rules: Option<PathBuf>,
        #[command(flatten)]
        format: FormatOpt,
    },
}

#[derive(Subcommand)]
enum ConfAction {
    /// Lint a PYTORCH_CUDA_ALLOC_CONF value for a given PyTorch version.
    #[command(
        after_help = "Examples:\n  allocdoc conf check 'max_split_size_mb:128,expandable_segments:True'\n  allocdoc conf check 'roundup_power2_divisions:[256:1,512:2,>:8]' --torch-version 2.10"
    )]
    Check {
        /// The value, as it would be set in the environment ('' is PyTorch's defaults).
        conf: String,
        /// PyTorch version whose grammar and keys apply (default 2.6).
        #[arg(long)]
        torch_version: Option<String>,
        #[command(flatten)]
        format: FormatOpt,
    },
}

#[derive(Subcommand)]
enum RulesAction {
    /// List every rule: id, severity and what it detects.
    #[command(
        after_help = "Examples:\n  allocdoc rules list\n  allocdoc rules list --rules my-rules/ --format markdown"
    )]
    List,
    /// Show one rule in full: its condition, message and test cases.
    #[command(
        after_help = "Examples:\n  allocdoc rules show reserved-gap\n  allocdoc rules show capacity --format json"
    )]
    Show {
        /// The rule's id, as `rules list` prints it.
        id: String,
    },
    /// Run every rule's own test cases (exit 1 when one fails).
    #[command(after_help = "Examples:\n  allocdoc rules test\n  allocdoc rules test my-rules/")]
    Test {
        /// A directory of extra YAML rules to load and test with the built-in ones.
        dir: Option<PathBuf>,
    },
}

/// On a real GPU, Ctrl-C stops the replay at its next driver call so the device
/// returns every allocation before the process exits.
#[cfg(feature = "cuda")]
fn stop_cuda_on_ctrl_c(device: &str) {
    if device.starts_with("cuda") {
        let _ = ctrlc::set_handler(|| {
            allocdoc::device::cuda::INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed)
        });
    }
}

#[cfg(not(feature = "cuda"))]
fn stop_cuda_on_ctrl_c(_device: &str) {}

/// The config search's progress on standard error, drawn only once the search
/// has taken more than a second (short searches stay silent).
struct SearchBar {
    bar: indicatif::ProgressBar,
    start: std::time::Instant,
}

impl SearchBar {
    fn new() -> Self {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        SearchBar {
            bar,
            start: std::time::Instant::now(),
        }
    }

    fn update(&self, p: allocdoc::advise::search::Progress) {
        use allocdoc::advise::search::Progress;
        if self.bar.is_hidden() && self.start.elapsed().as_secs_f64() > 1.0 {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        match p {
            Progress::Candidates { done, total } => {
                self.bar.set_message("replaying configs");
                self.bar.set_length(total as u64);
                self.bar.set_position(done as u64);
            }
            Progress::Bisect { step } => {
                self.bar.set_message("bisecting the smallest capacity");
                self.bar.set_length(step as u64);
                self.bar.set_position(step as u64);
            }
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn run(cli: Cli) -> Result<Outcome, allocdoc::Error> {
    match cli.command {
        Command::Diagnose {
            inputs,
            verbose,
            rules,
            torch_version,
            conf,
            report,
            format,
        } => app::diagnose::run(&app::diagnose::DiagnoseOptions {
            inputs,
            format: format.format.into(),
            verbose,
            rules_dir: rules,
            torch_version,
            conf,
            report,
        }),
        Command::Parse { inputs, format } => app::parse::run(&app::parse::ParseOptions {
            inputs,
            format: format.format.into(),
        }),
        Command::Conf {
            action:
                ConfAction::Check {
                    conf,
                    torch_version,
                    format,
                },
        } => app::conf_check::run(&app::conf_check::ConfCheckOptions {
            conf,
            torch_version,
            format: format.format.into(),
        }),
        Command::Replay {
            trace,
            confs,
            capacity,
            device,
            fidelity,
            summary,
            torch_version,
            compare_with,
            emit_snapshot,
            report,
            format,
        } => {
            stop_cuda_on_ctrl_c(&device);
            app::replay::run(&app::replay::ReplayOptions {
                trace,
                confs,
                capacity,
                device,
                fidelity,
                summary,
                torch_version,
                compare_with,
                emit_snapshot,
                report,
                format: format.format.into(),
            })
        }
        Command::Recommend {
            input,
            capacity,
            current,
            report,
            format,
        } => {
            let bar = SearchBar::new();
            let out = app::recommend::run_with_progress(
                &app::recommend::RecommendOptions {
                    input,
                    capacity,
                    current,
                    report,
                    format: format.format.into(),
                },
                &|p| bar.update(p),
            );
            bar.finish();
            out
        }
        Command::Validate {
            input,
            conf,
            current,
            capacity,
            device,
            report,
            format,
        } => {
            stop_cuda_on_ctrl_c(&device);
            app::validate::run(&app::validate::ValidateOptions {
                input,
                conf,
                current,
                capacity,
                device,
                report,
                format: format.format.into(),
            })
        }
        Command::Rules {
            action,
            rules,
            format,
        } => {
            let action = match action {
                RulesAction::List => app::rules_cmd::RulesAction::List,
                RulesAction::Show { id } => app::rules_cmd::RulesAction::Show(id),
                RulesAction::Test { dir } => app::rules_cmd::RulesAction::Test(dir),
            };
            app::rules_cmd::run(&app::rules_cmd::RulesOptions {
                action,
                rules_dir: rules,
                format: format.format.into(),
            })
        }
    }
}

impl Command {
    /// True when the command reads standard input (`-`, or no input given).
    fn reads_stdin(&self) -> bool {
        match self {
            Command::Diagnose { inputs, .. } | Command::Parse { inputs, .. } => {
                inputs.is_empty() || inputs.iter().any(|i| i == "-")
            }
            Command::Replay { trace: input, .. }
            | Command::Recommend { input, .. }
            | Command::Validate { input, .. } => input == "-",
            Command::Conf { .. } | Command::Rules { .. } => false,
        }
    }
}

/// Writes what a command printed; a failed write is exit 2 with a message,
/// but a reader that went away (`allocdoc … | head`) ends it quietly.
fn write_out(text: &str, code: u8) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::from(code),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(code),
        Err(e) => write_failed(&e),
    }
}

fn write_failed(e: &std::io::Error) -> ExitCode {
    let _ = writeln!(
        std::io::stderr(),
        "allocdoc: error: cannot write the output: {e}"
    );
    ExitCode::from(allocdoc::error::EXIT_INPUT as u8)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            // Everything but --help and --version is a usage error (2).
            return ExitCode::from(2);
        }
        // --help and --version go to standard output.
        Err(e) => {
            return match e.print() {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => write_failed(&e),
                _ => ExitCode::SUCCESS,
            };
        }
    };
    if cli.command.reads_stdin() && std::io::stdin().is_terminal() {
        let _ = writeln!(
            std::io::stderr(),
            "allocdoc: reading standard input: paste the text, then press Ctrl-D on a new line \
             (Ctrl-Z then Enter on Windows); Ctrl-C cancels"
        );
    }
    // On a terminal, lay tables out for its width; piped output keeps the
    // library's stable default.
    if let Some(columns) = comfy_table::Table::new().width() {
        allocdoc::report::common::set_text_width(columns);
    }
    match run(cli) {
        Ok(outcome) => {
            let mut err = std::io::stderr().lock();
            for note in &outcome.stderr {
                let _ = writeln!(err, "{note}");
            }
            write_out(&outcome.stdout, outcome.exit_code.clamp(0, 255) as u8)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "allocdoc: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
