//! Test-only stage kinds: deterministic, cheap, and slow on demand so a kill lands mid-step.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::Rng;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section, Stage, StageContext, StageError, TableSpec, Tables};

fn schema(columns: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(columns.iter().map(|c| Field::new(*c, DataType::UInt64, false)).collect::<Vec<_>>()))
}

fn batch(columns: &[&str], values: Vec<Vec<u64>>) -> Result<RecordBatch, StageError> {
    let arrays = values.into_iter().map(|v| Arc::new(UInt64Array::from(v)) as Arc<dyn Array>).collect();
    Ok(RecordBatch::try_new(schema(columns), arrays)?)
}

fn column(batch: &RecordBatch, name: &str) -> Vec<u64> {
    let array = batch.column_by_name(name).expect("declared column");
    array.as_any().downcast_ref::<UInt64Array>().expect("u64 column").values().to_vec()
}

/// A spec section the test stages read: an upper bound for random values.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Values are drawn below this.
    pub max_value: u64,
}

impl Section for Limits {
    const KEY: &'static str = "limits";
    fn check(&self) -> Vec<ConfigProblem> {
        if self.max_value == 0 { vec![ConfigProblem::new("max_value", "must be at least 1")] } else { Vec::new() }
    }
}

/// Writes `rows` random numbers per step, after sleeping `delay_ms` in small slices.
pub struct Numbers {
    config: NumbersConfig,
}

/// The config of `numbers`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NumbersConfig {
    /// Rows per step, at least 1.
    pub rows: u64,
    /// Simulated work per step, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Keep only the latest step's numbers and every k-th step's.
    #[serde(default)]
    pub keep_every: Option<u64>,
}

impl Stage for Numbers {
    const KIND: &'static str = "numbers";
    const ABOUT: &'static str = "test: random numbers";
    type Config = NumbersConfig;

    fn new(config: NumbersConfig) -> Result<Self, Vec<ConfigProblem>> {
        if config.rows == 0 {
            return Err(vec![ConfigProblem::new("rows", "must be at least 1, got 0")]);
        }
        Ok(Numbers { config })
    }

    fn outputs(&self) -> Vec<TableSpec> {
        let table = TableSpec::new("numbers", schema(&["item", "value"]));
        vec![match self.config.keep_every {
            Some(every) => table.keep_last_and_every(every),
            None => table,
        }]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let max = cx.resource::<Limits>().map(|l| l.max_value).unwrap_or(1000);
        let mut progress = cx.progress(self.config.rows);
        let slice = Duration::from_millis(self.config.delay_ms) / self.config.rows as u32;
        let mut values = Vec::new();
        for item in 0..self.config.rows {
            tokio::time::sleep(slice).await;
            values.push(cx.rng(item).random_range(0..max));
            progress.inc(1);
        }
        let items = (0..self.config.rows).collect();
        Ok(Tables::new().with("numbers", batch(&["item", "value"], vec![items, values])?))
    }
}

/// Writes one random offset, meant to run `once` and be read on later steps from the store.
pub struct Offsets;

/// The config of `offsets` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

impl Stage for Offsets {
    const KIND: &'static str = "offsets";
    const ABOUT: &'static str = "test: one random offset";
    type Config = NoConfig;

    fn new(_: NoConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Offsets)
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("offsets", schema(&["offset"]))]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let offset = cx.rng(0).random_range(0..100);
        Ok(Tables::new().with("offsets", batch(&["offset"], vec![vec![offset]])?))
    }
}

/// Squares numbers and adds the offset: reads a table of this step and one of an earlier step.
pub struct Square;

impl Stage for Square {
    const KIND: &'static str = "square";
    const ABOUT: &'static str = "test: value² + offset";
    type Config = NoConfig;

    fn new(_: NoConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Square)
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("numbers", schema(&["item", "value"])), TableSpec::new("offsets", schema(&["offset"]))]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("squares", schema(&["item", "square"]))]
    }

    async fn run(&self, _cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let numbers = inputs.get("numbers")?;
        let offset = column(inputs.get("offsets")?, "offset")[0];
        let squares = column(numbers, "value").iter().map(|v| v * v + offset).collect();
        Ok(Tables::new().with("squares", batch(&["item", "square"], vec![column(numbers, "item"), squares])?))
    }
}

/// Sums the squares of its step.
pub struct Total;

impl Stage for Total {
    const KIND: &'static str = "total";
    const ABOUT: &'static str = "test: sum of squares";
    type Config = NoConfig;

    fn new(_: NoConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Total)
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("squares", schema(&["item", "square"]))]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("totals", schema(&["count", "sum"]))]
    }

    async fn run(&self, _cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let squares = column(inputs.get("squares")?, "square");
        let row = vec![vec![squares.len() as u64], vec![squares.iter().sum()]];
        Ok(Tables::new().with("totals", batch(&["count", "sum"], row)?))
    }
}

/// Fails at one step, to test failure handling.
pub struct Fail {
    at_step: u64,
}

/// The config of `fail`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailConfig {
    /// The step at which to fail.
    pub at_step: u64,
}

impl Stage for Fail {
    const KIND: &'static str = "fail";
    const ABOUT: &'static str = "test: fails at a given step";
    type Config = FailConfig;

    fn new(config: FailConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Fail { at_step: config.at_step })
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("failures", schema(&["step_seen"]))]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        if cx.step() == self.at_step {
            return Err(StageError::Failed(format!("told to fail at step {}", self.at_step)));
        }
        Ok(Tables::new().with("failures", batch(&["step_seen"], vec![vec![cx.step()]])?))
    }
}
