//! The `allocdoc` binary: parses the command line, calls the library, prints
//! what it returns and exits with the contract's code. Nothing else lives here.
//! The Python wheel's `allocdoc` command is this same file, compiled into the
//! extension (python/src/lib.rs) and started through [`cli`].

use allocdoc::app::{self, Outcome};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
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

/// The command tree: names, descriptions and examples. Each command's
/// arguments are its options struct in `allocdoc::app` (clap derive there).
#[derive(Subcommand)]
enum Command {
    /// The main job: parse every input, run the rules, print the cause and one environment line.
    #[command(
        after_help = "Examples:\n  allocdoc diagnose train.log\n  allocdoc diagnose rank*.log --format markdown\n  python train.py 2>&1 | allocdoc diagnose -\n  allocdoc diagnose --each --format jsonl /shared/oom-logs > results.jsonl"
    )]
    Diagnose(app::diagnose::DiagnoseOptions),
    /// The evidence alone: what was found in the inputs, nothing inferred.
    #[command(
        after_help = "Examples:\n  allocdoc parse train.log\n  allocdoc parse --format json snapshot.pickle\n  allocdoc parse --each --format jsonl 'logs/*/rank*.log'"
    )]
    Parse(app::parse::ParseOptions),
    /// What fills the card: which code holds the memory at the peak, at the OOM and at the end of a snapshot.
    #[command(
        long_about = "What fills the card: the live allocations of a torch memory snapshot at the peak of allocated memory, at the trace's OOM and at its end (or at --at), grouped by the code that made them, in categories (parameters, gradients, optimizer state, activations, temporaries), with the memory live before the trace began and the reserved memory no tensor holds.\n\nAn allocation counts as live from its `alloc` trace entry to its `free_completed` entry, as torch.cuda._memory_viz and the allocator count active memory. Bytes are the sizes the tensors asked for (the trace's `size`); the allocator's rounded block bytes are shown beside them where they differ.",
        after_help = "Examples:\n  allocdoc top snapshot.pickle\n  allocdoc top snapshot.pickle --at oom --by user -n 10\n  allocdoc top snapshot.pickle --at 1402 --by stack\n  allocdoc top snapshot.pickle --by category --format json\n  allocdoc top snapshot.pickle --report fills.html"
    )]
    Top(app::top::TopOptions),
    /// Compare what fills the card in two snapshots: the peak (or --at oom|end) side by side, by site and by category.
    #[command(
        after_help = "Examples:\n  allocdoc diff baseline.pickle checkpointed.pickle\n  allocdoc diff before.pickle after.pickle --by category\n  allocdoc diff a.pickle b.pickle --at end --format json"
    )]
    Diff(app::diff::DiffOptions),
    /// How large a batch (or sequence) fits: predict the peak at any size from snapshots at two or more sizes.
    #[command(
        long_about = "How large a batch (or sequence, or image) fits: from torch memory snapshots of one workload recorded at two or more values of one knob, pair the allocations across the recordings by call site and order, read a size law for each (constant, a power of the knob, affine), and predict the trace at any size. Each predicted trace is replayed through the bundled allocator as a fresh process (the memory live before the trace allocated first, then the trace) under PyTorch's defaults and each --conf: the peak of allocated and reserved memory, whether it runs out of memory on --capacity and on which request, and the largest size that fits the card under each config, by bisection over replays. No GPU and no OOM spent.\n\nTwo knobs at once (a batch and a length): --points instead of --sizes, one point per input, at least three not on one line; each allocation gets a law in both knobs (constant, a product of powers, affine), --at-points predicts points and with --capacity the frontier gives, for each value of one knob (--along), the largest value of the other that fits.\n\nCode compiled with torch.compile pairs as eager code does: Inductor's generated modules are matched by function name and call order, never by their hash or lines, and sites are named by the user's frame, marked (compiled).\n\nRecord each size with torch.cuda.memory._record_memory_history() around one step (after a warm-up step), then _dump_snapshot(); allocdoc.capture.record_sizes in the Python package does it for you (points=[(1, 512), (2, 512), (1, 1024)] for two knobs).",
        after_help = "Examples:\n  allocdoc fit b8.pickle b16.pickle --sizes 8,16 --capacity 79.11GiB --knob batch\n  allocdoc fit s512.pickle s1024.pickle --sizes 512,1024 --at 2048,4096 --conf expandable_segments:True\n  allocdoc fit a.pickle b.pickle c.pickle --sizes 1,2,4 --capacity 24GiB --step 2 --format json\n  allocdoc fit b8.pickle b16.pickle --sizes 8,16 --at 32 --report fit.html\n  allocdoc fit b1s512.pickle b2s512.pickle b1s1024.pickle --points '1,512;2,512;1,1024' --knobs batch,seq_len --capacity 80GiB --along batch=1,2,4,8"
    )]
    Fit(app::fit::FitOptions),
    /// A whole run of steps whose size varies: the step that runs out of memory, the config and the size cap that carry the run.
    #[command(
        long_about = "A whole run, not one step: from the same recordings fit takes (snapshots of one workload at two or more values of one knob), replay a run of many steps whose size varies (variable sequence lengths, the last partial batch, evaluation) as one process through the bundled allocator, under PyTorch's defaults and each --conf. The cache keeps blocks between steps, so reserved memory ratchets above any single step's peak and a card that holds every step alone can run out of memory hours in, at a long step after short ones: forecast says at which step, what strands the memory, which config carries the run, and (with --capacity) the largest cap on the size under which the run survives the card.\n\nThe run is a file of step sizes (--run, one per line, # comments), or is built from a file of per-sample sizes shuffled into padded batches (--lengths FILE --batch N [--steps M] [--seed S] [--pad-to K], written out with --write-run). Each step follows fit's predicted trace at its size; what a step leaves live is freed by the next step where the recording shows it freed (shared/forecast/README.md's semantics).\n\nTwo knobs, the batch first (recordings at points, --points \"b,s;...\" --knobs batch,seq_len, as fit takes them): the run's sizes are the second knob's at --batch N, or with --batch max (and --lengths, --capacity) at the largest batch whose whole run survives the card, searched per config over the runs --lengths makes at each batch.",
        after_help = "Examples:\n  allocdoc forecast s128.pickle s512.pickle --sizes 128,512 --run run.txt --capacity 24GiB --knob context_length\n  allocdoc forecast s128.pickle s512.pickle --sizes 128,512 --lengths token_lengths.txt --batch 8 --pad-to 64 --steps 5000 --capacity 80GiB\n  allocdoc forecast a.pickle b.pickle --sizes 256,1024 --run run.txt --conf expandable_segments:True --format json\n  allocdoc forecast a.pickle b.pickle --sizes 256,1024 --run run.txt --capacity 12GiB --report forecast.html\n  allocdoc forecast b1s512.pickle b2s512.pickle b1s1024.pickle --points '1,512;2,512;1,1024' --knobs batch,seq_len --lengths token_lengths.txt --batch max --capacity 80GiB"
    )]
    Forecast(app::forecast::ForecastOptions),
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
    Replay(app::replay::ReplayOptions),
    /// Search the config space by replay and rank the results.
    #[command(
        after_help = "When PyTorch's defaults rank first, the recommendation is to unset the variable: its line is `unset PYTORCH_CUDA_ALLOC_CONF` (value \"\").\n\nExamples:\n  allocdoc recommend trace.csv --capacity 16GiB\n  allocdoc recommend snapshot.pickle --format json\n  allocdoc recommend rmm_log.csv --capacity 24GiB\n  allocdoc recommend oom.log --current max_split_size_mb:128"
    )]
    Recommend(app::recommend::RecommendOptions),
    /// Replay (or probe, for text-only evidence) under the current and a candidate config.
    #[command(
        after_help = "Examples:\n  allocdoc validate trace.csv --conf expandable_segments:True --capacity 24GiB\n  allocdoc validate oom.log --conf expandable_segments:True\n  allocdoc validate oom.log --conf expandable_segments:True --device cuda"
    )]
    Validate(app::validate::ValidateOptions),
    /// Inspect and unit-test the YAML rules.
    #[command(
        after_help = "Examples:\n  allocdoc rules list\n  allocdoc rules show reserved-gap\n  allocdoc rules test my-rules/"
    )]
    Rules(app::rules_cmd::RulesOptions),
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  allocdoc completions bash > ~/.local/share/bash-completion/completions/allocdoc\n  allocdoc completions zsh > ~/.zfunc/_allocdoc\n  allocdoc completions fish > ~/.config/fish/completions/allocdoc.fish\n  allocdoc completions powershell >> $PROFILE"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ConfAction {
    /// Lint a PYTORCH_CUDA_ALLOC_CONF value for a given PyTorch version.
    #[command(
        after_help = "Examples:\n  allocdoc conf check 'max_split_size_mb:128,expandable_segments:True'\n  allocdoc conf check 'roundup_power2_divisions:[256:1,512:2,>:8]' --torch-version 2.10"
    )]
    Check(app::conf_check::ConfCheckOptions),
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

    fn update(&self, p: allocdoc::trial::search::Progress) {
        use allocdoc::trial::search::Progress;
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
            Progress::Steps { done, total } => {
                self.bar.set_message("replaying the run's steps");
                self.bar.set_length(total as u64);
                self.bar.set_position(done as u64);
            }
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn run(cli: Cli) -> Result<Outcome, allocdoc::Error> {
    match cli.command {
        Command::Diagnose(opts) => app::diagnose::run(&opts),
        Command::Parse(opts) => app::parse::run(&opts),
        Command::Top(opts) => app::top::run(&opts),
        Command::Diff(opts) => app::diff::run(&opts),
        Command::Fit(opts) => app::fit::run(&opts),
        Command::Forecast(opts) => {
            let bar = SearchBar::new();
            let out = app::forecast::run_with_progress(&opts, &|p| bar.update(p));
            bar.finish();
            out
        }
        Command::Conf {
            action: ConfAction::Check(opts),
        } => app::conf_check::run(&opts),
        Command::Replay(opts) => {
            stop_cuda_on_ctrl_c(&opts.device);
            app::replay::run(&opts)
        }
        Command::Recommend(opts) => {
            let bar = SearchBar::new();
            let out = app::recommend::run_with_progress(&opts, &|p| bar.update(p));
            bar.finish();
            out
        }
        Command::Validate(opts) => {
            stop_cuda_on_ctrl_c(&opts.device);
            app::validate::run(&opts)
        }
        Command::Rules(opts) => app::rules_cmd::run(&opts),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command(), "allocdoc", &mut script);
            Ok(Outcome::ok(String::from_utf8_lossy(&script).into_owned()))
        }
    }
}

impl Command {
    /// True when the command reads standard input (`-`, or no input given).
    fn reads_stdin(&self) -> bool {
        match self {
            Command::Diagnose(o) => o.inputs.is_empty() || o.inputs.iter().any(|i| i == "-"),
            Command::Parse(o) => o.inputs.is_empty() || o.inputs.iter().any(|i| i == "-"),
            Command::Replay(o) => o.trace == "-",
            Command::Top(o) => o.inputs.iter().any(|i| i == "-"),
            Command::Diff(o) => o.before == "-" || o.after == "-",
            Command::Fit(o) => o.recordings.inputs.iter().any(|i| i == "-"),
            Command::Forecast(o) => {
                o.recordings.inputs.iter().any(|i| i == "-")
                    || o.run.as_deref() == Some("-")
                    || o.lengths.as_deref() == Some("-")
            }
            Command::Recommend(o) => o.input == "-",
            Command::Validate(o) => o.input == "-",
            Command::Conf { .. } | Command::Rules(_) | Command::Completions { .. } => false,
        }
    }
}

/// A one-line note for the first size on the command line written with a
/// decimal-looking unit (`--capacity 24GB`): it is read as binary.
fn decimal_size_note(args: &[OsString]) -> Option<String> {
    const SIZE_FLAGS: [&str; 2] = ["--capacity", "--max-input-bytes"];
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    args.iter().enumerate().find_map(|(i, a)| {
        let value = match a.split_once('=') {
            Some((flag, v)) if SIZE_FLAGS.contains(&flag) => v,
            _ if SIZE_FLAGS.contains(&a.as_str()) => args.get(i + 1)?,
            _ => return None,
        };
        allocdoc::units::decimal_unit_note(value)
    })
}

/// Writes what a command printed; a failed write is exit 2 with a message,
/// but a reader that went away (`allocdoc … | head`) ends it quietly.
fn write_out(text: &str, code: u8) -> u8 {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => code,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => code,
        Err(e) => write_failed(&e),
    }
}

fn write_failed(e: &std::io::Error) -> u8 {
    let _ = writeln!(
        std::io::stderr(),
        "allocdoc: error: cannot write the output: {e}"
    );
    allocdoc::error::EXIT_INPUT as u8
}

fn main() -> ExitCode {
    #[cfg(target_os = "linux")]
    out_of_memory::install();
    ExitCode::from(cli(std::env::args_os()))
}

/// An allocation the machine refuses ends the process with exit 2 and a
/// message, never with an abort's exit 134 and core dump. The decoders grow
/// their big vectors fallibly and name the limit they hit; every other
/// allocation is bounded by the input limits, so one that still fails means
/// the machine has less memory than those limits allow. Rust's
/// `handle_alloc_error` prints "memory allocation of N bytes failed" and
/// aborts; the allocator below notes the failed size, and the SIGABRT
/// handler turns that abort into exit 2 (any other abort stays an abort).
#[cfg(target_os = "linux")]
mod out_of_memory {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The size of the last allocation the system refused (0: none).
    static REFUSED: AtomicUsize = AtomicUsize::new(0);

    struct Noting;

    #[global_allocator]
    static ALLOCATOR: Noting = Noting;

    fn noted(ptr: *mut u8, size: usize) -> *mut u8 {
        if ptr.is_null() {
            REFUSED.store(size.max(1), Ordering::Relaxed);
        }
        ptr
    }

    // SAFETY: every call is passed to the system allocator unchanged.
    unsafe impl GlobalAlloc for Noting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            noted(unsafe { System.alloc(layout) }, layout.size())
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            noted(unsafe { System.alloc_zeroed(layout) }, layout.size())
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            noted(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Async-signal-safe: formats into a stack buffer, writes, exits.
    extern "C" fn on_abort(_: libc::c_int) {
        let size = REFUSED.load(Ordering::Relaxed);
        if size == 0 {
            // Not an allocation failure: abort as usual.
            unsafe {
                libc::signal(libc::SIGABRT, libc::SIG_DFL);
                libc::raise(libc::SIGABRT);
            }
            return;
        }
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut n = size;
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let parts: [&[u8]; 3] = [
            b"allocdoc: error: out of memory: the system refused an allocation of ",
            &digits[i..],
            b" bytes. Every input limit is a flag (see 'Limits' in `allocdoc <command> --help`): \
              lower them, or run on a machine with more memory\n",
        ];
        for part in parts {
            unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
        }
        unsafe { libc::_exit(2) };
    }

    pub fn install() {
        let handler = on_abort as extern "C" fn(libc::c_int);
        unsafe { libc::signal(libc::SIGABRT, handler as libc::sighandler_t) };
    }
}

/// The command tree, every command's help ending with the one exit-code
/// table (`allocdoc::error::EXIT_CODES_HELP`).
fn command() -> clap::Command {
    fn with_codes(c: clap::Command) -> clap::Command {
        let help = c
            .get_after_help()
            .map(|h| format!("{h}\n\n"))
            .unwrap_or_default();
        c.after_help(format!("{help}{}", allocdoc::error::EXIT_CODES_HELP))
            .mut_subcommands(with_codes)
    }
    with_codes(Cli::command())
}

/// The whole command: `args` (the program name first) parsed, run, printed;
/// returns the exit code.
pub fn cli(args: impl IntoIterator<Item = OsString>) -> u8 {
    let args: Vec<OsString> = args.into_iter().collect();
    let cli = match command()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            // Everything but --help and --version is a usage error (2).
            return 2;
        }
        // --help and --version go to standard output.
        Err(e) => {
            return match e.print() {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => write_failed(&e),
                _ => 0,
            };
        }
    };
    let mut err = std::io::stderr().lock();
    if let Some(note) = decimal_size_note(&args) {
        let _ = writeln!(err, "{note}");
    }
    if cli.command.reads_stdin() && std::io::stdin().is_terminal() {
        let _ = writeln!(
            err,
            "allocdoc: reading standard input: paste the text, then press Ctrl-D on a new line \
             (Ctrl-Z then Enter on Windows); Ctrl-C cancels"
        );
    }
    drop(err);
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
            drop(err);
            write_out(&outcome.stdout, outcome.exit_code.clamp(0, 255) as u8)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "allocdoc: error: {e}");
            e.exit_code().clamp(0, 255) as u8
        }
    }
}
