//! The decision layer below the commands: the workload a command runs
//! ([`workload`]: loading, capacity sources, probe ensembles), one run of it
//! under one config on one device with its figures ([`run`]), and the
//! judgements over runs: `validate`'s verdict and its evidence strength
//! ([`validate`]), `recommend`'s search and ranking ([`search`],
//! [`recommend`]), judging configs across the probes fitted to text evidence
//! ([`ensemble`]) and across segment placements ([`placement`]), the
//! comparison with PyTorch's own figures ([`compare`]), the `replay` pipeline
//! ([`replay`]), and the replay that checks what a trace rule suggests before
//! `diagnose` shows it ([`trace_check`]). What a report draws from replays is
//! computed in [`views`].
//!
//! [`answer`] settles one cause and one line from the diagnosis and the
//! replays, for every command.
//!
//! Rules, facts and their combination live in [`crate::advise`], below this
//! layer; the candidate space the search replays is [`crate::advise::space`].
//! Nothing here renders or prints: the types returned are what `report`
//! renders and `app` turns into an outcome.

pub mod answer;
pub mod compare;
pub mod ensemble;
pub mod fills;
pub mod fit;
pub mod forecast;
pub mod grid;
pub mod placement;
pub mod recommend;
pub mod replay;
pub mod run;
pub mod search;
pub mod trace_check;
pub mod validate;
pub mod views;
pub mod workload;

pub use run::Run;
pub use workload::{CapacitySource, Workload};
