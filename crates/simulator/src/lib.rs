//! `cloud-route-controller simulate`: a day of cluster life in seconds.
//!
//! The simulator runs this project's real reconcile code — the
//! [`route_controller::Controller`] loop with its trigger filter, scheduler,
//! planner, executor and status writes, unchanged — against a model of the
//! API server ([`api`]) and the simulated cloud
//! ([`provider_memory::MemoryCloud`]), on tokio's paused clock.
//!
//! ```text
//! scenario (TOML) ──► timeline ──► driver ──► ApiServer ──► NodeStore ──► Controller ──► Probe ──► MemoryCloud
//!  (scenario.rs)     (timeline.rs)  (run.rs)   (api.rs)      (watch events)                (observe.rs)
//! ```
//!
//! Each mode runs on its own thread with its own paused runtime, on the same
//! timeline. Module ownership: [`scenario`] the file format, [`timeline`] the
//! events and the minimum mutations, [`api`] the Node objects, [`observe`]
//! the measurements, [`run`] one mode, [`report`] and [`chart`] the output.

pub mod api;
pub mod chart;
pub mod check;
pub mod observe;
pub mod report;
pub mod run;
pub mod scenario;
pub mod timeline;

use std::path::PathBuf;

use route_controller::Mode;

pub use report::SimulationReport;
pub use run::{ModeReport, run_mode};
pub use scenario::{Scenario, ScenarioError};
pub use timeline::{Timeline, TimelineError};

/// Output format of `simulate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table for people.
    Table,
    /// One JSON document for machines.
    Json,
}

/// Flags of `cloud-route-controller simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// A scenario file (TOML), or the name of a shipped scenario: idle-1000, autoscaling-5000, flaky-hetzner, throttle-storm-50, azure-kubenet-400, gce-routes-300.
    #[arg(value_name = "SCENARIO")]
    pub scenario: PathBuf,

    /// Mode to simulate; repeat for several (default: periodic, watch and incremental).
    #[arg(long = "mode", value_name = "MODE", value_parser = parse_mode)]
    pub modes: Vec<Mode>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,

    /// Where to write the SVG chart of cumulative cloud calls (default: simulate-<scenario>.svg).
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,

    /// Overrides the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

/// Why a simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// Its events.
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    /// A run.
    #[error(transparent)]
    Run(#[from] run::RunError),
    /// A mode's thread died.
    #[error("the simulation of mode {0} failed unexpectedly")]
    Panicked(&'static str),
}

/// Runs `scenario` in each of `modes` (in parallel, one thread each).
pub fn run_scenario(scenario: &Scenario, modes: &[Mode]) -> Result<SimulationReport, SimError> {
    let wall = std::time::Instant::now();
    let timeline = Timeline::build(scenario)?;
    let results: Vec<Result<ModeReport, SimError>> = std::thread::scope(|s| {
        let handles: Vec<_> = modes
            .iter()
            .map(|&mode| {
                let timeline = &timeline;
                (mode, s.spawn(move || run_mode(scenario, timeline, mode)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(mode, h)| match h.join() {
                Ok(r) => r.map_err(SimError::from),
                Err(_) => Err(SimError::Panicked(mode.as_str())),
            })
            .collect()
    });
    let modes = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(SimulationReport {
        scenario: report::ScenarioSummary::new(scenario, &timeline),
        modes,
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}

/// The `simulate` subcommand: runs, prints the table or JSON, writes the chart.
pub fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut scenario = Scenario::load(&args.scenario)?;
    if let Some(seed) = args.seed {
        scenario.seed = seed;
    }
    let mut modes = if args.modes.is_empty() {
        Mode::ALL.to_vec()
    } else {
        args.modes.clone()
    };
    let mut seen = Vec::new();
    modes.retain(|m| {
        let fresh = !seen.contains(m);
        seen.push(*m);
        fresh
    });
    let report = run_scenario(&scenario, &modes)?;
    let chart_path = args.chart.clone().unwrap_or_else(|| {
        let safe: String = scenario
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        PathBuf::from(format!("simulate-{safe}.svg"))
    });
    let svg = chart::svg(
        &scenario.name,
        scenario.duration.0.as_secs_f64(),
        &report.modes,
    );
    std::fs::write(&chart_path, svg)
        .with_context(|| format!("writing the chart to {}", chart_path.display()))?;
    match args.output {
        Output::Table => {
            print!("{}", report.table());
            println!("Chart: {}", chart_path.display());
        }
        Output::Json => {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    }
    Ok(())
}
