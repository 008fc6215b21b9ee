//! The agent loop, in one place for the proposer, the solver and evaluation.
//!
//! Search-R1 / SSP protocol: the model thinks, writes `<search>q</search>`, the loop searches and
//! appends `<information>…</information>`, and the model continues, until it writes its final
//! tag (`<answer>` for the solver, `<question>` for the proposer), breaks the protocol, or runs
//! out of turns, tokens or context. The episodes of a batch run concurrently, each at its own
//! pace: a backend with continuous batching (`candle`, an OpenAI-compatible server) merges
//! their calls into shared forward steps, so an episode that stops early never waits for the
//! slowest, and one episode searches while the others decode.

mod prompt;
mod tags;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use self::prompt::{
    DISTILL_PROMPT, JUDGE_PROMPT, PROPOSER_PROMPT, PromptError, PromptKind, PromptTemplate, SOLVER_PROMPT,
    VERIFIER_PROMPT,
};
pub use self::tags::{FormatError, MAX_QUERY_CHARS, Role, TurnAction, information_block, parse_turn};
use crate::search::{Search, SearchError, format_results};
use sesa_models::policy::{
    FinishReason, Generation, GenerationRequest, KvCacheDtype, Policy, PolicyError, Precision, Sampling,
};

/// Budgets of one episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Generation turns at most (SSP: 10); a search asked for on the last turn is not run.
    pub max_turns: usize,
    /// New tokens per turn at most.
    pub max_turn_tokens: usize,
    /// Generated tokens per episode at most (retrieved text not counted).
    pub max_total_tokens: usize,
    /// Context length (prompt, generated and retrieved) at which the episode stops.
    pub context_limit: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits { max_turns: 10, max_turn_tokens: 512, max_total_tokens: 4096, context_limit: 8192 }
    }
}

/// One episode to run: a rendered prompt and its seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// The prompt, chat template applied, ending where the assistant starts.
    pub prompt: String,
    /// The episode's seed; turn seeds derive from it.
    pub seed: u64,
    /// Text written into the response rather than sampled (guidance); `None`: all the model's.
    pub written: Option<Written>,
}

impl Episode {
    /// An episode whose response is all the model's.
    pub fn new(prompt: String, seed: u64) -> Episode {
        Episode { prompt, seed, written: None }
    }
}

/// What guidance writes into a response: the model goes on from it as from its own text, and
/// training learns it as written (`loss_mask` 2, no sampling probability).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Written {
    /// What the response opens with; the first turn continues from it.
    pub opening: String,
    /// Per turn: text written into the turn's first thought where the model closed it, unless
    /// the thought already says it. The sampled `</think>` is taken back, so the model goes on
    /// thinking from the written words and closes the thought itself: one thought a turn, as
    /// the model was shown.
    pub in_thought: Vec<Option<String>>,
    /// Until the episode has searched this many times, a final tag the model opens is taken
    /// back and `<search>` written in its place, so the model goes on to write a query: a
    /// proposer asked for four hops that stops walking after two, or a solver's probe of one
    /// search more than its group made.
    pub searches: usize,
}

impl Written {
    /// What to write into turn `turn`'s closed thought `text`, if anything.
    fn for_thought(&self, turn: usize, text: &str) -> Option<&str> {
        let written = self.in_thought.get(turn)?.as_deref()?;
        (!text.contains(written.trim())).then_some(written)
    }
}

/// Where a thought ends: a turn with text to write into its thought stops there first.
const THOUGHT_END: &str = "</think>";

/// What [`Written::searches`] writes where the model opened its final tag too early.
const SEARCH_OPEN: &str = "<search>";

/// A turn being generated: its text (written parts included), the tokens sampled, why the last
/// generation stopped, and the generation's wall time in milliseconds.
struct TurnSoFar {
    text: String,
    tokens: usize,
    finish: FinishReason,
    generation_ms: u64,
}

/// What [`AgentRun::take_back`] took back.
struct Reopened {
    /// The response's text taken back: the tag, after what its first token held before it.
    taken_back: String,
    /// That text before the tag, to be written again.
    kept: String,
    /// Sampled tokens taken back.
    tokens: usize,
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Outcome {
    /// The final tag: the answer (solver) or the question (proposer).
    Final(String),
    /// The model broke the protocol.
    FormatError(FormatError),
    /// `max_turns` turns without a final tag.
    TurnLimit,
    /// `max_total_tokens` generated without a final tag.
    TokenBudget,
    /// The context reached `context_limit`.
    ContextLimit,
}

impl Outcome {
    /// The text of the final tag, when the episode ended with one.
    pub fn final_text(&self) -> Option<&str> {
        match self {
            Outcome::Final(text) => Some(text),
            _ => None,
        }
    }
}

/// One generation turn of an episode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turn {
    /// The turn's text: what the model generated, with any [`Written`] text within it.
    pub text: String,
    /// Tokens generated (written ones not counted).
    pub tokens: usize,
    /// Why generation stopped.
    pub finish: FinishReason,
    /// The search query, if the turn asked for one (and it ran).
    pub query: Option<String>,
    /// Ids of the retrieved passages.
    pub retrieved_ids: Vec<String>,
    /// Wall time of this turn's generation (shared with the episodes batched with it), in
    /// milliseconds.
    pub generation_ms: u64,
    /// Wall time of this turn's search, in milliseconds.
    pub search_ms: u64,
}

/// Everything an episode did, ready for tables and training.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trajectory {
    /// Who generated.
    pub role: Role,
    /// The prompt.
    pub prompt: String,
    /// Everything after the prompt: generated turns and `<information>` blocks.
    pub response: String,
    /// The turns.
    pub turns: Vec<Turn>,
    /// How it ended.
    pub outcome: Outcome,
    /// Token ids of `response` (generated and retrieved), when the policy gives ids.
    pub token_ids: Vec<u32>,
    /// 1 for generated tokens, 0 for retrieved ones, 2 for [`Written`] ones (trained as
    /// written, never sampled): what training may learn from.
    pub loss_mask: Vec<u8>,
    /// Natural-log probability per token of `token_ids` (0 for retrieved and written tokens).
    pub logprobs: Vec<f32>,
    /// Whether `token_ids`, `loss_mask` and `logprobs` are exact; false when the policy
    /// backend cannot give token ids or log-probs (e.g. some OpenAI-compatible servers).
    pub tokens_exact: bool,
    /// Tokens of the prompt, when known.
    pub prompt_tokens: Option<usize>,
    /// Token ids of the prompt (empty when the policy gives no ids).
    pub prompt_ids: Vec<u32>,
    /// The version of the policy's weights that generated it.
    pub policy_version: u64,
    /// The precision of those weights, where the spec chooses it (the `candle` backend).
    pub precision: Option<Precision>,
    /// How the keys and values behind it were cached, where the spec chooses it.
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Searches guidance opened where the model opened its final tag ([`Written::searches`]).
    pub searches_written: usize,
}

impl Trajectory {
    /// The search queries, in order.
    pub fn queries(&self) -> Vec<&str> {
        self.turns.iter().filter_map(|t| t.query.as_deref()).collect()
    }

    /// Tokens the policy generated.
    pub fn generated_tokens(&self) -> usize {
        self.turns.iter().map(|t| t.tokens).sum()
    }

    fn ending(mut self, outcome: Outcome) -> Trajectory {
        self.outcome = outcome;
        self
    }
}

/// Why the loop itself failed (a backend failure, not a model mistake).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The policy failed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The search backend failed.
    #[error(transparent)]
    Search(#[from] SearchError),
    /// A backend answered something other than what was asked (fewer answers than requests).
    #[error("{0}")]
    Contract(String),
}

/// What the loop needs besides the episodes.
pub struct AgentRun<'a> {
    /// Who is generating.
    pub role: Role,
    /// The model.
    pub policy: &'a dyn Policy,
    /// The search tool.
    pub search: &'a dyn Search,
    /// Passages per search.
    pub top_k: usize,
    /// Budgets.
    pub limits: AgentLimits,
    /// Sampling parameters.
    pub sampling: Sampling,
}

/// The seed of turn `turn` of an episode seeded `seed`.
pub fn turn_seed(seed: u64, turn: usize) -> u64 {
    seed ^ (turn as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where the wall time of a batch of episodes went. Episodes overlap, so each instant counts
/// once: as generation while any episode waits on the policy, else as search while any waits
/// on the search tool; the rest is the loop's own work (and idling).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BusyTime {
    /// Time with a generation in flight.
    pub generation: Duration,
    /// Time with a search and no generation in flight.
    pub search: Duration,
}

/// Counts calls in flight and accumulates [`BusyTime`] as they change.
struct BusyClock(Mutex<(usize, usize, Instant, BusyTime)>);

/// What an episode is waiting on.
#[derive(Clone, Copy)]
enum Waiting {
    Policy,
    Search,
}

impl BusyClock {
    fn new() -> BusyClock {
        BusyClock(Mutex::new((0, 0, Instant::now(), BusyTime::default())))
    }

    /// Awaits `call`, counting it as `what` in flight (until it ends or is dropped).
    async fn time<T>(&self, what: Waiting, call: impl Future<Output = T>) -> T {
        struct InFlight<'a>(&'a BusyClock, Waiting);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.change(self.1, false);
            }
        }
        self.change(what, true);
        let _in_flight = InFlight(self, what);
        call.await
    }

    fn change(&self, what: Waiting, starts: bool) {
        let mut state = self.0.lock().expect("busy clock lock");
        let (generating, searching, since, totals) = &mut *state;
        let now = Instant::now();
        if *generating > 0 {
            totals.generation += now - *since;
        } else if *searching > 0 {
            totals.search += now - *since;
        }
        *since = now;
        let count = match what {
            Waiting::Policy => generating,
            Waiting::Search => searching,
        };
        *count = if starts { *count + 1 } else { *count - 1 };
    }

    fn totals(&self) -> BusyTime {
        self.0.lock().expect("busy clock lock").3
    }
}

impl AgentRun<'_> {
    /// Runs every episode to its end, all of them concurrently. Results are in episode order.
    pub async fn run(&self, episodes: &[Episode]) -> Result<Vec<Trajectory>, AgentError> {
        Ok(self.run_timed(episodes).await?.0)
    }

    /// [`Self::run`], with where the wall time went.
    pub async fn run_timed(&self, episodes: &[Episode]) -> Result<(Vec<Trajectory>, BusyTime), AgentError> {
        self.run_at_most(episodes, episodes.len(), || ()).await
    }

    /// [`Self::run_timed`] with at most `in_flight` episodes running at once: the next starts
    /// as soon as any ends, so the policy's batch stays full until the last episodes (batches
    /// run one after another would each wait for their slowest, decoding a few rows a step).
    /// `done` is called once per episode, as each ends; results are in episode order.
    pub async fn run_at_most(
        &self,
        episodes: &[Episode],
        in_flight: usize,
        mut done: impl FnMut(),
    ) -> Result<(Vec<Trajectory>, BusyTime), AgentError> {
        use futures::{StreamExt, TryStreamExt};
        let clock = BusyClock::new();
        // The futures are made up front (an episode starts when first polled): a closure that
        // makes them inside the stream would be too general a type for a `Send` future.
        let started: Vec<_> = episodes
            .iter()
            .enumerate()
            .map(|(i, episode)| {
                let clock = &clock;
                async move { Ok::<_, AgentError>((i, self.run_one(episode, clock).await?)) }
            })
            .collect();
        // Unordered: an ended episode frees its place even while an earlier one still runs.
        let mut running = futures::stream::iter(started).buffer_unordered(in_flight.max(1));
        let mut ended = Vec::with_capacity(episodes.len());
        while let Some(trajectory) = running.try_next().await? {
            ended.push(trajectory);
            done();
        }
        ended.sort_by_key(|(i, _)| *i);
        Ok((ended.into_iter().map(|(_, trajectory)| trajectory).collect(), clock.totals()))
    }

    /// One episode, turn by turn.
    async fn run_one(&self, episode: &Episode, busy: &BusyClock) -> Result<Trajectory, AgentError> {
        let prompt_ids = self.policy.tokenize(&episode.prompt).await?;
        let mut trajectory = Trajectory {
            role: self.role,
            prompt: episode.prompt.clone(),
            response: String::new(),
            turns: Vec::new(),
            outcome: Outcome::TurnLimit,
            token_ids: Vec::new(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            tokens_exact: prompt_ids.is_some(),
            prompt_tokens: prompt_ids.as_ref().map(Vec::len),
            prompt_ids: prompt_ids.clone().unwrap_or_default(),
            policy_version: self.policy.version(),
            precision: self.policy.precision(),
            kv_cache_dtype: self.policy.kv_cache_dtype(),
            searches_written: 0,
        };
        if let Some(written) = &episode.written {
            self.write(&mut trajectory, &written.opening).await?;
        }
        let final_open = format!("<{}>", self.role.final_tag());
        for turn in 0..self.limits.max_turns {
            // The turn's text, as the protocol reads it: the first turn acts on the opening and
            // what followed it, as if generated whole.
            let opening = match &episode.written {
                Some(written) if turn == 0 => written.opening.clone(),
                _ => String::new(),
            };
            let stop_at_thought =
                episode.written.as_ref().is_some_and(|w| w.in_thought.get(turn).is_some_and(Option::is_some));
            // The final tag's opening stops the turn while the episode owes searches and a search
            // could still run (one asked for on the last turn is not).
            let last_turn = turn + 1 == self.limits.max_turns;
            let searches_owed = !last_turn
                && episode
                    .written
                    .as_ref()
                    .is_some_and(|w| trajectory.turns.iter().filter(|t| t.query.is_some()).count() < w.searches);
            let early_final = searches_owed.then_some(final_open.as_str());
            let seed = turn_seed(episode.seed, turn);
            let stops: Vec<&str> = stop_at_thought.then_some(THOUGHT_END).into_iter().chain(early_final).collect();
            let mut so_far = TurnSoFar { text: opening, tokens: 0, finish: FinishReason::Stop, generation_ms: 0 };
            self.go_on(&mut trajectory, &mut so_far, prompt_ids.as_deref(), seed, &stops, busy).await?;
            if stop_at_thought && so_far.text.ends_with(THOUGHT_END) && self.budget_left(&trajectory, &so_far) {
                // The thought closed where written text may go: unless the model said it already,
                // reopen the thought and write it there. Either way the model goes on with the
                // turn, seeded apart.
                if let Some(written) = episode.written.as_ref().and_then(|w| w.for_thought(turn, &so_far.text)) {
                    self.write_over(&mut trajectory, &mut so_far, THOUGHT_END, written).await?;
                }
                let stops: Vec<&str> = early_final.into_iter().collect();
                self.go_on(&mut trajectory, &mut so_far, prompt_ids.as_deref(), seed ^ 1, &stops, busy).await?;
            }
            if searches_owed && so_far.text.ends_with(&final_open) && self.budget_left(&trajectory, &so_far) {
                // The model opened its final tag before the searches it owes: the tag is taken
                // back and a search opened in its place, for the model to write the query.
                if self.write_over(&mut trajectory, &mut so_far, &final_open, SEARCH_OPEN).await? {
                    trajectory.searches_written += 1;
                }
                self.go_on(&mut trajectory, &mut so_far, prompt_ids.as_deref(), seed ^ 2, &[], busy).await?;
            }
            let TurnSoFar { text, tokens, finish, generation_ms } = so_far;
            trajectory.turns.push(Turn {
                text: text.clone(),
                tokens,
                finish,
                query: None,
                retrieved_ids: Vec::new(),
                generation_ms,
                search_ms: 0,
            });
            let query = match parse_turn(self.role, &text) {
                TurnAction::Final(text) => return Ok(trajectory.ending(Outcome::Final(text))),
                TurnAction::Malformed(error) => {
                    let over_budget =
                        finish == FinishReason::Length && trajectory.generated_tokens() >= self.limits.max_total_tokens;
                    let outcome = if over_budget { Outcome::TokenBudget } else { Outcome::FormatError(error) };
                    return Ok(trajectory.ending(outcome));
                }
                TurnAction::Search(_) if last_turn => return Ok(trajectory.ending(Outcome::TurnLimit)),
                TurnAction::Search(query) => query,
            };
            let clock = Instant::now();
            let hits = busy.time(Waiting::Search, self.search.search(std::slice::from_ref(&query), self.top_k)).await?;
            let hits = hits.into_iter().next().ok_or_else(|| {
                AgentError::Contract("the search backend answered no list of hits for a query".into())
            })?;
            let search_ms = clock.elapsed().as_millis() as u64;
            let block = information_block(&format_results(std::slice::from_ref(&hits)));
            let block_ids = if trajectory.tokens_exact { self.policy.tokenize(&block).await? } else { None };
            let turn_record = trajectory.turns.last_mut().expect("this turn was recorded");
            turn_record.query = Some(query);
            turn_record.retrieved_ids = hits.iter().map(|h| h.doc.id.clone()).collect();
            turn_record.search_ms = search_ms;
            trajectory.response.push_str(&block);
            match block_ids {
                Some(ids) => {
                    trajectory.loss_mask.extend(std::iter::repeat_n(0, ids.len()));
                    trajectory.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
                    trajectory.token_ids.extend(ids);
                }
                None => trajectory.tokens_exact = false,
            }
            let context = trajectory.prompt_tokens.unwrap_or(trajectory.prompt.len() / 4) + trajectory.token_ids.len();
            if trajectory.generated_tokens() >= self.limits.max_total_tokens {
                return Ok(trajectory.ending(Outcome::TokenBudget));
            }
            if context >= self.limits.context_limit {
                return Ok(trajectory.ending(Outcome::ContextLimit));
            }
        }
        Ok(trajectory)
    }

    /// The turn goes on: one more generation, appended to it and to the trajectory.
    async fn go_on(
        &self,
        trajectory: &mut Trajectory,
        so_far: &mut TurnSoFar,
        prompt_ids: Option<&[u32]>,
        seed: u64,
        stops: &[&str],
        busy: &BusyClock,
    ) -> Result<(), AgentError> {
        let (more, tokens, ms) = self.generate(trajectory, prompt_ids, seed, so_far.tokens, stops, busy).await?;
        so_far.text.push_str(&more.text);
        (so_far.finish, so_far.tokens, so_far.generation_ms) =
            (more.finish, so_far.tokens + tokens, so_far.generation_ms + ms);
        Ok(())
    }

    /// Whether the turn may still generate: within the turn's and the episode's token budgets.
    fn budget_left(&self, trajectory: &Trajectory, so_far: &TurnSoFar) -> bool {
        trajectory.generated_tokens() + so_far.tokens < self.limits.max_total_tokens
            && so_far.tokens < self.limits.max_turn_tokens
    }

    /// Takes `tag`, just sampled at the end of the turn, back and writes `written` in its place
    /// (after what the tag's first token held before it); false, changing nothing, when the
    /// tokens cannot be read back.
    async fn write_over(
        &self,
        trajectory: &mut Trajectory,
        so_far: &mut TurnSoFar,
        tag: &str,
        written: &str,
    ) -> Result<bool, AgentError> {
        let Some(reopened) = self.take_back(trajectory, so_far.tokens, tag).await? else { return Ok(false) };
        so_far.text.truncate(so_far.text.len() - reopened.taken_back.len());
        so_far.tokens -= reopened.tokens;
        let written = format!("{}{written}", reopened.kept);
        self.write(trajectory, &written).await?;
        so_far.text.push_str(&written);
        Ok(true)
    }

    /// One generation of a turn that has generated `in_turn` tokens so far, appended to the
    /// trajectory as sampled; stopping also at `stops`. Returns it, the tokens it generated and
    /// its wall time in milliseconds.
    async fn generate(
        &self,
        trajectory: &mut Trajectory,
        prompt_ids: Option<&[u32]>,
        seed: u64,
        in_turn: usize,
        stops: &[&str],
        busy: &BusyClock,
    ) -> Result<(Generation, usize, u64), AgentError> {
        let mut request = self.request(trajectory, prompt_ids, seed, in_turn);
        request.stop.extend(stops.iter().map(|stop| stop.to_string()));
        let clock = Instant::now();
        let generation = busy.time(Waiting::Policy, self.policy.generate(std::slice::from_ref(&request))).await?;
        let generation = generation.into_iter().next().ok_or_else(|| {
            AgentError::Contract(format!("policy `{}` answered no generation for a request", self.policy.name()))
        })?;
        let generation_ms = clock.elapsed().as_millis() as u64;
        let tokens = generation.token_ids.as_ref().map(Vec::len).unwrap_or_else(|| generation.text.len().div_ceil(4));
        trajectory.response.push_str(&generation.text);
        match (&generation.token_ids, &generation.logprobs) {
            (Some(ids), Some(logprobs)) if ids.len() == logprobs.len() => {
                trajectory.token_ids.extend(ids);
                trajectory.logprobs.extend(logprobs);
                trajectory.loss_mask.extend(std::iter::repeat_n(1, ids.len()));
            }
            _ => trajectory.tokens_exact = false,
        }
        Ok((generation, tokens, generation_ms))
    }

    /// Takes `tag`, which the model just sampled, back out of the trajectory, looking at most
    /// at the last `sampled` tokens; `None` when the tokens cannot be read back (the backend
    /// cannot decode, or they do not spell the response's end).
    ///
    /// Byte-level tokenizers merge runs of punctuation, so the tag usually ends tokens that
    /// began before it ("Orla.</think>" as "Orla", ".</", "think", ">"): what those tokens held
    /// before the tag is handed back to be written again.
    async fn take_back(
        &self,
        trajectory: &mut Trajectory,
        sampled: usize,
        tag: &str,
    ) -> Result<Option<Reopened>, AgentError> {
        if !trajectory.tokens_exact {
            let Some(kept) = trajectory.response.strip_suffix(tag) else { return Ok(None) };
            trajectory.response.truncate(kept.len());
            return Ok(Some(Reopened { taken_back: tag.into(), kept: String::new(), tokens: 0 }));
        }
        let ids = &trajectory.token_ids;
        // Every token holds a byte at least, so at most as many tokens as the tag has bytes
        // spell it: one decode of the last few tokens per try, never of the whole turn.
        for count in 1..=sampled.min(ids.len()).min(tag.len()) {
            let Some(tail) = self.policy.decode(&ids[ids.len() - count..]).await? else { return Ok(None) };
            let Some(at) = tail.rfind(tag) else { continue };
            if at + tag.len() != tail.len() || !trajectory.response.ends_with(&tail) {
                return Ok(None);
            }
            let keep = ids.len() - count;
            trajectory.token_ids.truncate(keep);
            trajectory.logprobs.truncate(keep);
            trajectory.loss_mask.truncate(keep);
            trajectory.response.truncate(trajectory.response.len() - tail.len());
            return Ok(Some(Reopened { kept: tail[..at].to_string(), taken_back: tail, tokens: count }));
        }
        Ok(None)
    }

    /// Appends `text` to the response as written, not sampled.
    async fn write(&self, trajectory: &mut Trajectory, text: &str) -> Result<(), AgentError> {
        trajectory.response.push_str(text);
        if !trajectory.tokens_exact {
            return Ok(());
        }
        match self.policy.tokenize(text).await? {
            Some(ids) => {
                trajectory.loss_mask.extend(std::iter::repeat_n(2, ids.len()));
                trajectory.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
                trajectory.token_ids.extend(ids);
            }
            _ => trajectory.tokens_exact = false,
        }
        Ok(())
    }

    /// The next generation of a turn that has generated `in_turn` tokens so far.
    fn request(
        &self,
        trajectory: &Trajectory,
        prompt_ids: Option<&[u32]>,
        seed: u64,
        in_turn: usize,
    ) -> GenerationRequest {
        let remaining = self.limits.max_total_tokens.saturating_sub(trajectory.generated_tokens() + in_turn);
        GenerationRequest {
            context: format!("{}{}", trajectory.prompt, trajectory.response),
            context_ids: match (prompt_ids, trajectory.tokens_exact) {
                (Some(prompt), true) => Some(prompt.iter().chain(&trajectory.token_ids).copied().collect()),
                _ => None,
            },
            max_tokens: self.limits.max_turn_tokens.saturating_sub(in_turn).min(remaining).max(1),
            stop: self.role.stop_strings(),
            sampling: self.sampling,
            seed,
            json_schema: None,
            ignore_eos: false,
        }
    }
}

#[cfg(test)]
mod backend_tests;
#[cfg(test)]
mod tests;
