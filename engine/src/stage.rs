//! The `Stage` trait: a typed function from tables to tables, run by the engine once per step
//! on which its schedule fires.
//!
//! A stage declares the tables it reads and writes (names and Arrow schemas) so that the wiring
//! of a spec is checked before anything runs. It never sees storage paths or YAML: the engine
//! hands it its inputs, persists its outputs and builds it from its typed config.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::future::BoxFuture;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::progress::{Progress, StageProgress};
use crate::requirement::Requirement;
use crate::resources::Resources;
use crate::seed;

/// A named table with its Arrow schema, as a stage declares it.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// The table name; also its directory under `tables/`.
    pub name: String,
    /// The exact schema every batch of this table must have.
    pub schema: SchemaRef,
    /// Keep only the latest version and those of steps that are multiples of this (a
    /// stage's large snapshots, such as model checkpoints); `None` keeps every step.
    pub keep_every: Option<u64>,
}

impl TableSpec {
    /// A table named `name` with `schema`.
    pub fn new(name: impl Into<String>, schema: SchemaRef) -> Self {
        TableSpec { name: name.into(), schema, keep_every: None }
    }

    /// This table keeps only its latest version and those of steps that are multiples of
    /// `every`: when a step writes it, the engine deletes the one before unless it is kept.
    /// The deletion is named in the step's commit record, so readers and resume skip it.
    pub fn keep_last_and_every(mut self, every: u64) -> Self {
        self.keep_every = Some(every.max(1));
        self
    }
}

/// Named tables, one `RecordBatch` each: a stage's inputs or outputs.
#[derive(Debug, Clone, Default)]
pub struct Tables(BTreeMap<String, RecordBatch>);

impl Tables {
    /// No tables.
    pub fn new() -> Self {
        Tables::default()
    }

    /// The table `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&RecordBatch, StageError> {
        self.0.get(name).ok_or_else(|| StageError::MissingTable { table: name.to_string() })
    }

    /// Adds or replaces a table.
    pub fn insert(&mut self, name: impl Into<String>, batch: RecordBatch) {
        self.0.insert(name.into(), batch);
    }

    /// Adds a table, builder style.
    pub fn with(mut self, name: impl Into<String>, batch: RecordBatch) -> Self {
        self.insert(name, batch);
        self
    }

    /// The tables in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RecordBatch)> {
        self.0.iter().map(|(name, batch)| (name.as_str(), batch))
    }

    /// How many tables there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A problem with one stage's config, found when the stage is built from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The dotted key inside the stage's config (empty for the config as a whole).
    pub key: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ConfigProblem {
    /// A problem with `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigProblem { key: key.into(), message: message.into() }
    }

    /// A problem with `key` when the size `value` is outside `range`. Every size has an upper
    /// bound: an absurd value (`n_rollouts: 4000000000`) is refused when the spec is validated,
    /// instead of passing and then aborting the run on a failed allocation.
    pub fn size(key: impl Into<String>, value: impl TryInto<u64>, range: RangeInclusive<u64>) -> Option<Self> {
        let value = value.try_into().unwrap_or(u64::MAX);
        (!range.contains(&value)).then(|| {
            let (low, high) = (range.start(), range.end());
            ConfigProblem::new(key, format!("must be between {low} and {high}, got {value}"))
        })
    }
}

/// Why a stage failed. The engine adds the stage name and step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// A declared input is absent (a bug in the engine or the stage).
    #[error("input table `{table}` was not provided")]
    MissingTable {
        /// The table.
        table: String,
    },
    /// A shared resource the stage needs was not built for this run.
    #[error("resource `{type_name}` is not available in this run")]
    MissingResource {
        /// The Rust type asked for.
        type_name: &'static str,
    },
    /// Building or reading Arrow data failed.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// Anything else, in the stage's own words.
    #[error("{0}")]
    Failed(String),
    /// An error from another library.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync>),
}

/// A stage kind: built from its typed config, declares its tables, and runs.
///
/// The engine calls `new` when a spec is validated (so it must only check and store the config,
/// doing no I/O), `inputs`/`outputs` when the graph is checked, and `run` once on every step the
/// stage's schedule fires, after all the stages it comes `after` have finished. `run` gets one
/// batch per declared input and must return exactly one batch per declared output, with the
/// declared schema. Dropping the future returned by `run` cancels the stage: it must not leave
/// work running in the background. Randomness must come from [`StageContext::rng`], never from
/// the clock or the order in which things finish, so that a rerun reproduces the tables.
pub trait Stage: Send + Sync + Sized + 'static {
    /// The name a spec uses in `kind:`.
    const KIND: &'static str;
    /// One line for `sesa schema` and error messages.
    const ABOUT: &'static str;
    /// The stage's own keys in the spec, next to `kind`, `after` and `schedule`.
    type Config: DeserializeOwned + JsonSchema + Send + Sync + 'static;

    /// Checks the config and builds the stage. Returns every problem found, not just the first.
    fn new(config: Self::Config) -> Result<Self, Vec<ConfigProblem>>;

    /// The tables this stage reads.
    fn inputs(&self) -> Vec<TableSpec> {
        Vec::new()
    }

    /// The tables this stage writes.
    fn outputs(&self) -> Vec<TableSpec>;

    /// What the stage needs from outside the run (keys relative to the stage), checked before
    /// a run is created.
    fn requirements(&self) -> Vec<Requirement> {
        Vec::new()
    }

    /// Paths the stage creates on first use: requirements under them are met by the run.
    fn provides(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    /// Runs the stage for one step.
    fn run(&self, cx: &StageContext, inputs: Tables) -> impl Future<Output = Result<Tables, StageError>> + Send;
}

/// The object-safe face of [`Stage`] that the engine stores.
pub(crate) trait DynStage: Send + Sync {
    fn inputs(&self) -> Vec<TableSpec>;
    fn outputs(&self) -> Vec<TableSpec>;
    fn requirements(&self) -> Vec<Requirement>;
    fn provides(&self) -> Vec<PathBuf>;
    fn run<'a>(&'a self, cx: &'a StageContext, inputs: Tables) -> BoxFuture<'a, Result<Tables, StageError>>;
}

impl<S: Stage> DynStage for S {
    fn inputs(&self) -> Vec<TableSpec> {
        Stage::inputs(self)
    }
    fn outputs(&self) -> Vec<TableSpec> {
        Stage::outputs(self)
    }
    fn requirements(&self) -> Vec<Requirement> {
        Stage::requirements(self)
    }
    fn provides(&self) -> Vec<PathBuf> {
        Stage::provides(self)
    }
    fn run<'a>(&'a self, cx: &'a StageContext, inputs: Tables) -> BoxFuture<'a, Result<Tables, StageError>> {
        Box::pin(Stage::run(self, cx, inputs))
    }
}

/// What a running stage may know and use: its step, seeds, shared resources and progress.
pub struct StageContext {
    pub(crate) step: u64,
    pub(crate) steps: u64,
    pub(crate) stage: Arc<str>,
    pub(crate) run_seed: u64,
    pub(crate) resources: Arc<Resources>,
    pub(crate) progress: Progress,
}

impl StageContext {
    /// The current step, from 1.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The number of steps of the run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// This stage's name in the spec.
    pub fn stage_name(&self) -> &str {
        &self.stage
    }

    /// A seed derived from (run seed, step, stage, item): the same on every rerun, whatever
    /// the order in which items are processed.
    pub fn seed(&self, item: u64) -> u64 {
        seed::derive(self.run_seed, self.step, &self.stage, item)
    }

    /// A random number generator seeded with [`StageContext::seed`].
    pub fn rng(&self, item: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed(item))
    }

    /// A shared resource of the run, built once from the spec.
    pub fn resource<T: Any + Send + Sync>(&self) -> Result<Arc<T>, StageError> {
        self.resources.get::<T>().ok_or(StageError::MissingResource { type_name: std::any::type_name::<T>() })
    }

    /// A progress display for `total` items of this stage's work.
    pub fn progress(&self, total: u64) -> StageProgress {
        self.progress.task(&self.stage, total)
    }
}
