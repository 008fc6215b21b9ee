//! The rules of self-play as pure functions: question validity (SSP's
//! `ProblemExtractor._is_valid_search_question`), solver reward with the anti-spam rule (SSP's
//! `quark_score.compute_score`), proposer reward shapes (SSP's adversarial and intermediate, SESA's
//! frontier), the failure queue, and reading verifier and judge replies.

use std::collections::VecDeque;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::agent::{Role, TurnAction, parse_turn};
use crate::data::metrics::exact_match;
use crate::memory::FailureRecord;
use sesa_engine::deserialize_tagged;

/// The rule-based checks of a proposed question (SSP's `_is_valid_search_question`; the RAG
/// check is the verify stage).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidityRules {
    /// Characters at least (SSP: 10).
    #[serde(default = "defaults::min_chars")]
    pub min_chars: usize,
    /// Characters at most (SSP: 1000).
    #[serde(default = "defaults::max_chars")]
    pub max_chars: usize,
    /// Words at least (SSP: 10).
    #[serde(default = "defaults::min_words")]
    pub min_words: usize,
    /// Distinct searches the proposer must have made (SSP: 2).
    #[serde(default = "defaults::min_searches")]
    pub min_searches: usize,
    /// At least one distinct search per hop asked for, when that is more than `min_searches`
    /// (not SSP's: a rule for a proposer that writes the fewest searches valid whatever depth
    /// it is asked, so that a question asked as four hops was searched as four).
    #[serde(default)]
    pub searches_per_hop: bool,
}

mod defaults {
    pub fn min_chars() -> usize {
        10
    }
    pub fn max_chars() -> usize {
        1000
    }
    pub fn min_words() -> usize {
        10
    }
    pub fn min_searches() -> usize {
        2
    }
}

impl Default for ValidityRules {
    fn default() -> Self {
        ValidityRules {
            min_chars: defaults::min_chars(),
            max_chars: defaults::max_chars(),
            min_words: defaults::min_words(),
            min_searches: defaults::min_searches(),
            searches_per_hop: false,
        }
    }
}

impl ValidityRules {
    /// The distinct searches a proposal asked for `hops` hops must have made.
    pub fn searches_needed(&self, hops: u64) -> usize {
        let per_hop = if self.searches_per_hop { usize::try_from(hops).unwrap_or(usize::MAX) } else { 0 };
        self.min_searches.max(per_hop)
    }

    /// The question, cleaned of stray answer tags, or why it is invalid. `question` is the
    /// proposer's first `<question>` (`None`: it wrote none), asked for `hops` hops.
    pub fn check(
        &self,
        question: Option<&str>,
        target: &str,
        hops: u64,
        searches: &[&str],
        materials: &str,
    ) -> Result<String, String> {
        let Some(question) = question else {
            return Err("no <question> in the proposer's output".into());
        };
        let question = question.replace("<answer>", "").replace("</answer>", "");
        let question = question.trim().trim_end_matches("</answer").trim_end_matches("</").trim().to_string();
        let chars = question.chars().count();
        if chars < self.min_chars || chars > self.max_chars {
            return Err(format!("{chars} characters, outside {}..={}", self.min_chars, self.max_chars));
        }
        let words = question.split_whitespace().count();
        if words < self.min_words {
            return Err(format!("{words} words, fewer than {}", self.min_words));
        }
        if question.to_lowercase().contains(&target.to_lowercase()) {
            return Err("the question contains the answer".into());
        }
        if materials.trim().is_empty() {
            return Err("no retrieved materials".into());
        }
        let mut distinct: Vec<&str> = searches.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() < searches.len() {
            return Err("repeated search queries".into());
        }
        let needed = self.searches_needed(hops);
        if searches.len() < needed {
            return Err(format!("{} searches, fewer than {needed}", searches.len()));
        }
        Ok(question)
    }
}

/// More answer tags than this in a correct response score [`SPAM_REWARD`] (as in SSP).
pub const SPAM_TAGS: usize = 10;
/// The reward of a correct but tag-spamming response.
pub const SPAM_REWARD: f64 = 0.25;

/// The solver's reward: 0 without an answer; 1 on exact match, or when the judge (asked only
/// after a miss) says correct; 0.25 instead of 1 when the response spams answer tags.
pub fn solver_reward(response: &str, answer: Option<&str>, golds: &[String], judged_correct: Option<bool>) -> f64 {
    let Some(answer) = answer else {
        return 0.0;
    };
    let correct = exact_match(answer, golds) > 0.0 || judged_correct == Some(true);
    if !correct {
        return 0.0;
    }
    let tags = response.matches("<answer>").count().max(response.matches("</answer>").count());
    if tags > SPAM_TAGS { SPAM_REWARD } else { 1.0 }
}

/// The factor a solver reward is multiplied by for searching beyond need: (1 − `cost`) per
/// search past the question's hop count, 1 where the count is unknown (a dummy, or a substitute without one).
pub fn excess_search_factor(cost: f64, searches: usize, hops: Option<u64>) -> f64 {
    let excess = hops.map_or(0, |hops| (searches as u64).saturating_sub(hops));
    (1.0 - cost).powi(i32::try_from(excess).unwrap_or(i32::MAX))
}

/// What a rollout's last turn did, beyond the searches that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastTurn {
    /// It answered.
    Answered,
    /// It asked for one more search, which the turn limit left unrun.
    Searched,
    /// Neither: a format error, or a token or context budget ran out.
    Undecided,
}

/// The turns of a solver rollout that misjudged its question's depth: a search once the
/// question's `hops` searches were made, or an answer before them. Turn `j` is the one written
/// after `j` search results; `searches` counts the searches that ran. Empty where the hop count
/// is unknown.
pub fn missteps(searches: usize, last: LastTurn, hops: Option<u64>) -> Vec<u32> {
    let Some(hops) = hops else {
        return Vec::new();
    };
    let searches = searches as u64;
    let mut turns: Vec<u32> = (hops..searches).map(|turn| turn as u32).collect();
    let misjudged = match last {
        LastTurn::Answered => searches < hops,
        LastTurn::Searched => searches >= hops,
        LastTurn::Undecided => false,
    };
    if misjudged {
        turns.push(searches as u32);
    }
    turns
}

/// How the proposer is rewarded for a question whose solver success rate is p̂.
#[derive(Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(tag = "shape", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProposerReward {
    /// SSP: 1 − p̂.
    Adversarial,
    /// SESA: −λ at p̂ ∈ {0, 1}, else 4(ℓ + p̂)(h − p̂).
    Frontier(FrontierReward),
    /// SSP's `intermediate_difficulty`: 4(left + p̂)(right − p̂) inside (0, 1), else 0.
    Intermediate(IntermediateReward),
}

deserialize_tagged!(ProposerReward, "shape", {
    "adversarial" => Adversarial,
    "frontier" => Frontier(settings),
    "intermediate" => Intermediate(settings),
});

/// SESA's frontier reward: −λ at p̂ ∈ {0, 1}, else 4(ℓ + p̂)(h − p̂).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrontierReward {
    /// The endpoint penalty λ > 0.
    pub lambda: f64,
    /// ℓ.
    #[serde(default)]
    pub low: f64,
    /// h.
    #[serde(default = "one")]
    pub high: f64,
}

/// SSP's `intermediate_difficulty`: 4(left + p̂)(right − p̂) inside (0, 1), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntermediateReward {
    /// left.
    #[serde(default)]
    pub left: f64,
    /// right.
    #[serde(default = "one")]
    pub right: f64,
}

pub(crate) fn one() -> f64 {
    1.0
}

impl ProposerReward {
    /// The reward at success rate `p`.
    pub fn reward(&self, p: f64) -> f64 {
        let interior = p > 0.0 && p < 1.0;
        match *self {
            ProposerReward::Adversarial => 1.0 - p,
            ProposerReward::Frontier(FrontierReward { lambda, low, high }) => {
                if interior {
                    4.0 * (low + p) * (high - p)
                } else {
                    -lambda
                }
            }
            ProposerReward::Intermediate(IntermediateReward { left, right }) => {
                if interior {
                    4.0 * (left + p) * (right - p)
                } else {
                    0.0
                }
            }
        }
    }

    /// The lowest reward a valid proposal can get, at any success rate: a concave shape's
    /// interior is lowest at its ends, so the bound is the least of the endpoints' values and
    /// the interior's limits there.
    pub fn lowest(&self) -> f64 {
        let interior = |low: f64, high: f64| (4.0 * low * high).min(4.0 * (low + 1.0) * (high - 1.0));
        match *self {
            ProposerReward::Adversarial => 0.0,
            ProposerReward::Frontier(FrontierReward { lambda, low, high }) => (-lambda).min(interior(low, high)),
            ProposerReward::Intermediate(IntermediateReward { left, right }) => 0.0f64.min(interior(left, right)),
        }
    }
}

/// Failures waiting for consolidation: at most `capacity`, the oldest dropped first.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureQueue {
    capacity: usize,
    records: VecDeque<FailureRecord>,
    dropped: u64,
}

impl FailureQueue {
    /// An empty queue.
    pub fn new(capacity: usize) -> FailureQueue {
        FailureQueue { capacity, records: VecDeque::new(), dropped: 0 }
    }

    /// Adds a record, dropping the oldest when full.
    pub fn push(&mut self, record: FailureRecord) {
        if self.capacity == 0 {
            self.dropped += 1;
            return;
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
            self.dropped += 1;
        }
        self.records.push_back(record);
    }

    /// Removes the records with these ids (consumed by a consolidation).
    pub fn remove(&mut self, ids: &[String]) {
        self.records.retain(|r| !ids.contains(&r.id));
    }

    /// The queued records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &FailureRecord> {
        self.records.iter()
    }

    /// Records queued.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none are queued.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records dropped for want of room, since the run began.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Words a reply may have and still be taken as a bare answer.
const BARE_ANSWER_WORDS: usize = 6;

/// The answer the verifier states in its reply: the rest of the line after its last `Answer:`
/// (any case, ASCII or full-width colon), else the text of its last `<answer>` tag (the
/// solver's format, which a policy warm-started on solver demonstrations writes), else the
/// reply itself when it is a bare answer (one line of at most six words), else none (empty).
/// SSP reads the whole reply when no `Answer:` is found; here that let `answer_match: contains`
/// accept reasoning that named the target on the way to another answer.
pub fn verifier_answer(reply: &str) -> String {
    // ASCII lowering keeps every byte offset of `reply`.
    let lower = reply.to_ascii_lowercase();
    let stated =
        ["answer:", "answer："].iter().filter_map(|marker| lower.rfind(marker).map(|at| at + marker.len())).max();
    if let Some(end) = stated {
        return reply[end..].trim_start().lines().next().unwrap_or_default().trim().to_string();
    }
    if let TurnAction::Final(answer) = parse_turn(Role::Solver, reply) {
        return answer;
    }
    let bare = reply.trim();
    if !bare.contains('\n') && bare.split_whitespace().count() <= BARE_ANSWER_WORDS {
        return bare.to_string();
    }
    String::new()
}

/// Whether a judge's reply says "correct". Unlike SSP's substring test (`"correct" in reply`),
/// "incorrect" and "not correct" are not correct.
pub fn judge_says_correct(reply: &str) -> bool {
    let reply = reply.to_lowercase();
    reply.contains("correct") && !reply.contains("incorrect") && !reply.contains("not correct")
}

#[cfg(test)]
mod tests;
