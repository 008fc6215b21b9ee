//! `world:`: a generated world, written on first use and regenerated when its stamp differs.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use super::SetupError;

/// A generated world (`sesa world generate`), created on first use: the contamination-free
/// corpus, questions and target answers of the quickstart.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorldSection {
    /// Where the world's files go (`corpus.jsonl`, `questions.jsonl`, `targets.jsonl`).
    pub dir: PathBuf,
    /// The world's seed.
    #[serde(default)]
    pub seed: u64,
    /// Entities (and so passages).
    #[serde(default = "default_entities")]
    pub entities: usize,
    /// Benchmark questions to generate.
    #[serde(default = "default_questions")]
    pub questions: usize,
}

fn default_entities() -> usize {
    2000
}

fn default_questions() -> usize {
    500
}

impl Section for WorldSection {
    const KEY: &'static str = "world";

    fn check(&self) -> Vec<ConfigProblem> {
        [
            ConfigProblem::size("entities", self.entities, 10..=10_000_000),
            ConfigProblem::size("questions", self.questions, 1..=10_000_000),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn provides(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }
}

impl WorldSection {
    /// Generates the world into `dir` unless the one there was generated with the same
    /// parameters and generator version (its `world.json`); a stale or unstamped world is
    /// regenerated, with a warning that says what differed. An index built from its corpus
    /// is rebuilt when next opened (see `Bm25Index::open_or_build`).
    pub fn ensure(&self) -> Result<(), SetupError> {
        use crate::data::world::{GENERATOR_VERSION, World, WorldConfig, WorldStamp};
        let config = WorldConfig { seed: self.seed, entities: self.entities, questions: self.questions };
        let wanted = WorldStamp { generator: GENERATOR_VERSION, config };
        let dir = self.dir.display();
        match WorldStamp::read(&self.dir) {
            Some(stamp) if stamp == wanted => return Ok(()),
            Some(stamp) => {
                tracing::warn!(
                    "the world in {dir} was generated with {}: regenerating it",
                    stamp.differences(&wanted).join(", ")
                )
            }
            None if self.dir.join("corpus.jsonl").exists() => {
                tracing::warn!("the world in {dir} does not record how it was generated (world.json): regenerating it")
            }
            None => {}
        }
        tracing::info!(dir = %dir, seed = self.seed, entities = self.entities, "generating the world");
        let world = World::generate(config);
        world.write(&self.dir).map_err(|e| SetupError::World(format!("{}: {e}", self.dir.display())))?;
        Ok(())
    }
}
