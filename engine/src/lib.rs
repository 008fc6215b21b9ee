//! A generic engine for experiments made of typed stages that run step after step.
//!
//! It knows nothing about models, questions or skills: a domain crate registers stage kinds and
//! spec sections, and the engine does the rest — spec loading and validation, the stage graph,
//! concurrent execution per step, Parquet artifacts, atomic commits, resume.
//!
//! ```text
//!  spec.yaml ──extends/--set──▶ SourceDoc ──Registry──▶ Spec ──graph checks──▶ Pipeline
//!                                                                               │
//!         ArtifactStore (local dir, S3, memory) ◀── Parquet + commit records ── Run::execute
//!                                                        per step: active stages as a DAG on tokio
//! ```
//!
//! Main types: [`Registry`] (what a spec may use), [`Stage`] (a kind of stage), [`spec::Spec`]
//! and [`Pipeline`] (a checked spec and its graph), [`Run`] (a pipeline bound to a store),
//! [`ArtifactStore`] (write-once objects), [`Progress`] (bars or log lines). Helpers for domain
//! crates: [`columns`] (building and reading Arrow tables) and [`deserialize_tagged!`] (a spec's
//! tagged choices, with problems named by their setting).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{RecordBatch, UInt64Array};
//! use arrow_schema::{DataType, Field, Schema, SchemaRef};
//! use sesa_engine::*;
//!
//! /// Writes `rows` random numbers per step.
//! struct Numbers { rows: u64 }
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! struct NumbersConfig { rows: u64 }
//!
//! fn schema() -> SchemaRef {
//!     Arc::new(Schema::new(vec![Field::new("value", DataType::UInt64, false)]))
//! }
//!
//! impl Stage for Numbers {
//!     const KIND: &'static str = "numbers";
//!     const ABOUT: &'static str = "random numbers";
//!     type Config = NumbersConfig;
//!     fn new(config: NumbersConfig) -> Result<Self, Vec<ConfigProblem>> {
//!         Ok(Numbers { rows: config.rows })
//!     }
//!     fn outputs(&self) -> Vec<TableSpec> {
//!         vec![TableSpec::new("numbers", schema())]
//!     }
//!     async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
//!         use rand::Rng;
//!         let values: Vec<u64> = (0..self.rows).map(|i| cx.rng(i).random_range(0..100)).collect();
//!         let batch = RecordBatch::try_new(schema(), vec![Arc::new(UInt64Array::from(values))])?;
//!         Ok(Tables::new().with("numbers", batch))
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let mut registry = Registry::new();
//! registry.stage::<Numbers>();
//! let dir = tempfile::tempdir().unwrap();
//! let spec_path = dir.path().join("spec.yaml");
//! std::fs::write(&spec_path, "name: demo\nseed: 1\nsteps: 2\nstages:\n  gen: {kind: numbers, rows: 3}\n").unwrap();
//! let pipeline = load_pipeline(&spec_path, &[], &registry).unwrap();
//! let store = ArtifactStore::in_memory();
//! let mut run = Run::create(&store, pipeline, "doc").await.unwrap();
//! let (_stop, watch) = tokio::sync::watch::channel(StopRequest::None);
//! let outcome = run.execute(&Progress::new(ProgressMode::Hidden), watch).await.unwrap();
//! assert_eq!(outcome, RunOutcome::Completed);
//! assert_eq!(run.manifest().committed_steps, 2);
//! # });
//! ```

pub mod columns;
pub mod manifest;
pub mod plan;
pub mod progress;
pub mod registry;
pub mod requirement;
pub mod resources;
pub mod run;
pub mod seed;
pub mod spec;
pub mod stage;
pub mod store;
pub mod table;
pub mod tagged;
pub mod testing;

use std::path::Path;

pub use crate::plan::{GraphFormat, Pipeline};
pub use crate::progress::{Progress, ProgressMode, StageProgress};
pub use crate::registry::{Registry, Section};
pub use crate::requirement::{Requirement, Resource, SpecRequirement};
pub use crate::resources::Resources;
pub use crate::run::{Run, RunError, RunOutcome, Steps, StopRequest, list_runs, read_table, read_table_steps};
pub use crate::spec::{SpecError, SpecErrors};
pub use crate::stage::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};
pub use crate::store::{ArtifactStore, StoreError};

/// Loads, types and checks the spec at `path` with `--set` style `overrides`: everything
/// `sesa validate` does. Returns every problem found.
pub fn load_pipeline(path: &Path, overrides: &[String], registry: &Registry) -> Result<Pipeline, SpecErrors> {
    let mut source = spec::SourceDoc::load(path)?;
    source.apply_overrides(overrides)?;
    let spec = spec::Spec::from_source(&source, registry)?;
    Pipeline::new(spec, &source)
}

/// Types and checks a resolved spec given as text (no `extends:`), with `--set` style
/// `overrides`, as a run's saved spec is read back; `label` names it in errors. For tools that
/// derive one spec from another.
pub fn pipeline_from_text(
    text: &str,
    label: &str,
    overrides: &[String],
    registry: &Registry,
) -> Result<Pipeline, SpecErrors> {
    let mut source = spec::SourceDoc::from_text(text, label)?;
    source.apply_overrides(overrides)?;
    let spec = spec::Spec::from_source(&source, registry)?;
    Pipeline::new(spec, &source)
}
