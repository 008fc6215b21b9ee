//! `SkillBank`: the skills with their embeddings, exact top-k retrieval by cosine, usage
//! accounting, admission under a deduplication threshold, eviction, and versions.
//!
//! The bank changes only through `admit`, `record_usage`, `evict_harmful` and `import`; each
//! returns the events it caused, and `commit` turns the changes since the last commit into one
//! new version. Stages write those events and a snapshot per version as tables.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::embed::{CachedEmbedder, EmbedError, cosine};
use super::skill::{Skill, SkillMeta, SkillText};

/// How usage after a solved question is credited to the skills the solver saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageRule {
    /// Each retrieved skill: +1 retrieval per question, +1 help per successful rollout and
    /// +1 harm per failed rollout of that question.
    #[default]
    Rollouts,
    /// Each retrieved skill: +1 retrieval per question, +1 help when most of its rollouts
    /// succeeded (p̂ > ½), +1 harm when most failed (p̂ < ½), nothing at p̂ = ½.
    Majority,
    /// The difference a skill makes rather than how hard its questions are: the odd-numbered
    /// rollouts of a question shown skills are answered without them, and each retrieved skill
    /// gets +1 retrieval, +1 help when the rollouts shown it succeeded more often than those
    /// not shown it, +1 harm when less often, nothing at a tie. Those rollouts lose the skills
    /// (and are trained without them).
    Counterfactual,
}

/// What makes a candidate a duplicate of a skill already in the bank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DedupBy {
    /// Their embeddings' cosine is above `dedup_threshold` (the paper's way): a judge's
    /// paraphrases of one strategy merge.
    #[default]
    Embedding,
    /// The same trigger, exactly: one skill per question pattern. For skills that are built
    /// rather than written (`distiller: rules`, whose trigger is the question with its entities
    /// masked): two patterns' skills differ only in relation words, which MiniLM places above
    /// 0.86, so by embedding every second deep pattern's skill would be rejected as a duplicate;
    /// one pattern's skills differ at most in how the success happened to phrase its searches.
    Trigger,
}

impl UsageRule {
    /// Whether a solver question of this `source` (`proposed`, `reused`, `substitute`, `dummy`)
    /// judges the skills it was shown. By outcome (`rollouts`, `majority`), only the proposer's
    /// accepted questions: reused ones were counted when first asked, and the training world's
    /// substitutes are not the frontier the skills are distilled for. By difference
    /// (`counterfactual`), every real question: the rollouts without the skills are the
    /// baseline, whatever the question's source or difficulty. Never a dummy: every dummy
    /// retrieves the same skills and would collect harms for nothing.
    pub fn judges(self, source: &str) -> bool {
        match source {
            "proposed" => true,
            "dummy" => false,
            _ => self == UsageRule::Counterfactual,
        }
    }
}

/// The bank's rules (the paper's; the dedup threshold depends on the embedder).
#[derive(Debug, Clone, PartialEq)]
pub struct BankConfig {
    /// Skills at most.
    pub capacity: usize,
    /// What makes a candidate a duplicate.
    pub dedup_by: DedupBy,
    /// Under [`DedupBy::Embedding`], a candidate whose cosine to some skill exceeds this is a
    /// duplicate.
    pub dedup_threshold: f32,
    /// Retrievals before a skill can be evicted for doing harm.
    pub evict_min_retrievals: u64,
    /// How usage is credited.
    pub usage: UsageRule,
}

/// What happened to the bank, one row of `skill_events`.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillEvent {
    /// What happened.
    pub kind: SkillEventKind,
    /// The skill concerned (for a rejected candidate, the id it would have had).
    pub skill_id: String,
    /// Its description.
    pub description: String,
    /// The nearest existing skill, for a duplicate.
    pub nearest: Option<String>,
    /// Cosine to `nearest`.
    pub similarity: Option<f32>,
    /// Why, in words.
    pub reason: String,
    /// The question of a retrieval.
    pub question_id: Option<String>,
}

impl SkillEvent {
    /// An event about skill `skill_id`, with no nearest skill, similarity or question.
    pub fn new(kind: SkillEventKind, skill_id: String, description: String, reason: String) -> SkillEvent {
        SkillEvent { kind, skill_id, description, nearest: None, similarity: None, reason, question_id: None }
    }
}

/// Kinds of `skill_events` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillEventKind {
    /// Admitted into the bank.
    Added,
    /// Not admitted: too close to an existing skill.
    RejectedDuplicate,
    /// Not admitted: malformed, or no room (the bank is full of seed skills).
    Rejected,
    /// Removed from the bank.
    Evicted,
    /// Shown to the solver for a question.
    Retrieved,
}

impl SkillEventKind {
    /// The name in the `event` column.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillEventKind::Added => "added",
            SkillEventKind::RejectedDuplicate => "rejected_duplicate",
            SkillEventKind::Rejected => "rejected",
            SkillEventKind::Evicted => "evicted",
            SkillEventKind::Retrieved => "retrieved",
        }
    }
}

/// The skills the solver saw for one question, and how its rollouts went.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionUsage {
    /// The question.
    pub question_id: String,
    /// Skills in its prompt.
    pub skill_ids: Vec<String>,
    /// Rollouts that succeeded.
    pub successes: u64,
    /// Rollouts in all.
    pub rollouts: u64,
    /// Successes and rollouts of the question's rollouts answered without its skills
    /// ([`UsageRule::Counterfactual`]); not part of `successes` and `rollouts`.
    pub without: Option<(u64, u64)>,
}

/// The skill memory.
#[derive(Debug, Clone)]
pub struct SkillBank {
    config: BankConfig,
    skills: Vec<Skill>,
    vectors: Vec<Vec<f32>>,
    version: u64,
    dirty: bool,
}

impl SkillBank {
    /// An empty bank at version 0.
    pub fn new(config: BankConfig) -> SkillBank {
        SkillBank { config, skills: Vec::new(), vectors: Vec::new(), version: 0, dirty: false }
    }

    /// A bank restored at `version` (from a run's last snapshot or a skill file); `vectors` are
    /// the embeddings of the skills' texts, in order.
    pub fn restore(config: BankConfig, skills: Vec<Skill>, vectors: Vec<Vec<f32>>, version: u64) -> SkillBank {
        SkillBank { config, skills, vectors, version, dirty: false }
    }

    /// [`Self::restore`], embedding the skills' texts with `embedder`.
    pub fn embedded(
        config: BankConfig,
        skills: Vec<Skill>,
        version: u64,
        embedder: &CachedEmbedder,
    ) -> Result<SkillBank, EmbedError> {
        let texts: Vec<String> = skills.iter().map(|s| s.text.embedding_text()).collect();
        let vectors = embedder.embed(&texts.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(SkillBank::restore(config, skills, vectors, version))
    }

    /// The rules.
    pub fn config(&self) -> &BankConfig {
        &self.config
    }

    /// The last committed version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The skills, in admission order.
    pub fn skills(&self) -> &[Skill] {
        &self.skills
    }

    /// How many skills there are.
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// The `k` skills most similar to `query` (a unit vector), best first; ties go to the
    /// older skill. Exact: the bank is small (hundreds), a scan is microseconds.
    pub fn top_k(&self, query: &[f32], k: usize) -> Vec<(&Skill, f32)> {
        self.top_k_among(&self.vectors, query, k)
    }

    /// The `k` skills whose vectors in `vectors` (one per skill, in [`SkillBank::skills`]'
    /// order: another text of each skill than the bank's own) are most similar to `query`.
    pub fn top_k_among(&self, vectors: &[Vec<f32>], query: &[f32], k: usize) -> Vec<(&Skill, f32)> {
        debug_assert_eq!(vectors.len(), self.skills.len());
        let mut scored: Vec<(usize, f32)> = vectors.iter().map(|v| cosine(v, query)).enumerate().collect();
        let k = k.min(scored.len());
        if k == 0 {
            return Vec::new();
        }
        let better = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        scored.select_nth_unstable_by(k - 1, better);
        scored.truncate(k);
        scored.sort_by(better);
        scored.into_iter().map(|(i, s)| (&self.skills[i], s)).collect()
    }

    /// The most similar skill to `vector` and its cosine.
    pub fn nearest(&self, vector: &[f32]) -> Option<(&Skill, f32)> {
        self.top_k(vector, 1).into_iter().next()
    }

    /// Admits a candidate unless it duplicates a skill (see [`DedupBy`]). At capacity, the
    /// lowest-utility non-seed skill makes room; seed skills are never evicted.
    pub fn admit(&mut self, id: String, text: SkillText, mut meta: SkillMeta, vector: Vec<f32>) -> Vec<SkillEvent> {
        let event = |kind, reason: String| SkillEvent::new(kind, id.clone(), text.description.clone(), reason);
        if self.skills.iter().any(|s| s.id == id) {
            return vec![event(SkillEventKind::Rejected, format!("a skill with id `{id}` is already in the bank"))];
        }
        if let Some((nearest, similarity, reason)) = self.duplicated(&text, &vector) {
            return vec![SkillEvent {
                nearest: Some(nearest),
                similarity,
                ..event(SkillEventKind::RejectedDuplicate, reason)
            }];
        }
        let mut events = Vec::new();
        if self.skills.len() >= self.config.capacity {
            let Some(victim) = self.lowest_utility() else {
                return vec![event(
                    SkillEventKind::Rejected,
                    format!("the bank is at capacity ({}) with seed skills only", self.config.capacity),
                )];
            };
            let utility = self.skills[victim].meta.utility();
            events.push(self.remove(victim, format!("lowest utility ({utility}) at capacity, to admit `{id}`")));
        }
        meta.version_added = self.version + 1;
        events.push(event(SkillEventKind::Added, "admitted".to_string()));
        self.skills.push(Skill { id, text, meta });
        self.vectors.push(vector);
        self.dirty = true;
        events
    }

    /// The skill a candidate duplicates, with their cosine where that is the test, and why.
    fn duplicated(&self, text: &SkillText, vector: &[f32]) -> Option<(String, Option<f32>, String)> {
        match self.config.dedup_by {
            DedupBy::Embedding => {
                let (nearest, similarity) = self.nearest(vector)?;
                (similarity > self.config.dedup_threshold).then(|| {
                    let reason = format!(
                        "cosine {similarity:.3} to `{}` is above the dedup threshold {}",
                        nearest.id, self.config.dedup_threshold
                    );
                    (nearest.id.clone(), Some(similarity), reason)
                })
            }
            DedupBy::Trigger => {
                let same = self.skills.iter().find(|s| s.text.trigger == text.trigger)?;
                let reason = format!("`{}` has the same trigger", same.id);
                Some((same.id.clone(), None, reason))
            }
        }
    }

    /// The non-seed skill to evict at capacity: lowest helps − harms, then fewest retrievals,
    /// then the oldest.
    fn lowest_utility(&self) -> Option<usize> {
        (0..self.skills.len()).filter(|&i| !self.skills[i].meta.seed).min_by_key(|&i| {
            let meta = &self.skills[i].meta;
            (meta.utility(), meta.retrievals, meta.version_added)
        })
    }

    fn remove(&mut self, index: usize, reason: String) -> SkillEvent {
        let skill = self.skills.remove(index);
        self.vectors.remove(index);
        self.dirty = true;
        SkillEvent::new(SkillEventKind::Evicted, skill.id, skill.text.description, reason)
    }

    /// Credits each question's outcome to the skills its solver saw (see [`UsageRule`]).
    /// Unknown ids (a skill evicted since) are ignored.
    pub fn record_usage(&mut self, usage: &[QuestionUsage]) {
        for question in usage {
            let failures = question.rollouts.saturating_sub(question.successes);
            let (helps, harms) = match self.config.usage {
                UsageRule::Rollouts => (question.successes, failures),
                UsageRule::Majority => {
                    (u64::from(question.successes > failures), u64::from(question.successes < failures))
                }
                UsageRule::Counterfactual => match question.without {
                    // p̂ with the skills against p̂ without them, cross-multiplied.
                    Some((successes, rollouts)) if rollouts > 0 && question.rollouts > 0 => {
                        let (with, without) = (question.successes * rollouts, successes * question.rollouts);
                        (u64::from(with > without), u64::from(with < without))
                    }
                    _ => (0, 0),
                },
            };
            for id in &question.skill_ids {
                if let Some(skill) = self.skills.iter_mut().find(|s| &s.id == id) {
                    skill.meta.retrievals += 1;
                    skill.meta.helps += helps;
                    skill.meta.harms += harms;
                    self.dirty = true;
                }
            }
        }
    }

    /// How usage is credited.
    pub fn usage(&self) -> UsageRule {
        self.config.usage
    }

    /// Evicts every non-seed skill retrieved at least `evict_min_retrievals` times whose
    /// helps − harms is negative.
    pub fn evict_harmful(&mut self) -> Vec<SkillEvent> {
        let mut events = Vec::new();
        let mut index = 0;
        while index < self.skills.len() {
            let meta = &self.skills[index].meta;
            if !meta.seed && meta.retrievals >= self.config.evict_min_retrievals && meta.utility() < 0 {
                let reason =
                    format!("helps − harms = {} − {} < 0 after {} retrievals", meta.helps, meta.harms, meta.retrievals);
                events.push(self.remove(index, reason));
            } else {
                index += 1;
            }
        }
        events
    }

    /// Makes the changes since the last commit one new version; `None` when nothing changed.
    pub fn commit(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        self.version += 1;
        Some(self.version)
    }
}

#[cfg(test)]
mod tests;
