//! The skill memory: skills as data ([`Skill`], [`SkillFile`]), sentence embeddings
//! ([`MiniLm`] behind a [`CachedEmbedder`]), the [`SkillBank`] with its rules, the bank as
//! tables, and failure distillation by a judge ([`Distiller`]) or by rules ([`induce_batch`]).
//!
//! Only the solver reaches the bank: the solver's prompt kind is the only one with a `{skills}`
//! placeholder, and the proposer's stage is given no handle to the memory.

mod bank;
mod bert;
mod distill;
mod embed;
mod induce;
mod sanitize;
mod skill;
mod tables;

pub use self::bank::{BankConfig, DedupBy, QuestionUsage, SkillBank, SkillEvent, SkillEventKind, UsageRule};
pub use self::distill::{Distilled, Distiller, FailureRecord, output_schema, parse_output, render_failures};
pub use self::embed::{CachedEmbedder, EmbedError, Embedder, HashedWords, MiniLm, cosine};
pub use self::induce::{ChainReader, ComposedChain, Induction, induce, induce_batch, question_pattern};
pub use self::sanitize::{clean, limits};
pub use self::skill::{Skill, SkillFile, SkillFileError, SkillMeta, SkillText, prompt_block};
pub use self::tables::{SKILL_EVENTS_SCHEMA, SKILLS_SCHEMA, events_batch, skills_batch, skills_from_batch};

#[cfg(test)]
mod tests;
