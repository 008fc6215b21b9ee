//! Continuous batching. One thread owns every running sequence and advances them all by one
//! forward step at a time; the requests of any `generate` call join at the next step and leave
//! as soon as they finish. The episodes of an agent loop each call on their own, so a
//! trajectory that stops early never waits for the slowest of its turn, and one trajectory's
//! tool result is read in the same steps as the others' decoding.
//!
//! The forward pass is row-local (see [`super::llama`]): which sequences share a step changes
//! no bit of any result, so the schedule is free to follow arrival order.

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use llguidance::Matcher;
use llguidance::api::TopLevelGrammar;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::oneshot;

use super::Inner;
use super::llama::{Chunk, KvCache, LlamaModel};
use crate::kernels::for_each_chunk_mut;
use crate::policy::sampling::sample;
use crate::policy::{FinishReason, Generation, GenerationRequest, PolicyError};

/// A request handed to the scheduler, with where its answer goes.
pub(super) struct Submitted {
    pub(super) request: GenerationRequest,
    pub(super) reply: oneshot::Sender<Result<Generation, PolicyError>>,
}

/// How long the scheduler waits for calls about to come: the rest of a burst when it was idle
/// (the episodes of an agent loop start together, one call each, and share their first step
/// and prompts), and the next turns of the requests it has just answered (an episode searches
/// and comes back within a millisecond or two; missing the next step would cost it a step, tens
/// to hundreds of milliseconds).
const GATHER: Duration = Duration::from_millis(5);

/// Cached sequences: token ids with the KV cache of exactly those tokens; and, while the model
/// keeps block inputs, those of finished sequences, kept longer than their caches (a token's
/// inputs are a tenth of its keys and values in F16, a twentieth in F32), for the trainer to
/// read after the rollouts.
pub(super) struct Sessions {
    pub(super) capacity: usize,
    pub(super) clock: u64,
    pub(super) entries: Vec<(Vec<u32>, KvCache, u64)>,
    /// Token ids with the block inputs of each (`tokens × hidden`), at most
    /// [`BLOCK_INPUTS_PER_CACHED_TOKEN`] × `capacity` tokens.
    inputs: Vec<(Vec<u32>, Vec<f32>, u64)>,
}

/// How many tokens' block inputs are kept per token of KV cache: a step's rollouts, whose
/// caches mostly make way for each other, keep their inputs until the update reads them.
const BLOCK_INPUTS_PER_CACHED_TOKEN: usize = 4;

impl Sessions {
    pub(super) fn new(capacity: usize) -> Sessions {
        Sessions { capacity, clock: 0, entries: Vec::new(), inputs: Vec::new() }
    }

    /// Forgets every cached sequence (their keys, values and block inputs were another
    /// model's).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.inputs.clear();
    }

    /// The cache of the longest cached prefix of `context`, leaving at least one token to feed.
    pub(super) fn lookup(&mut self, context: &[u32]) -> KvCache {
        self.clock += 1;
        let best = self
            .entries
            .iter_mut()
            .map(|entry| (shared_prefix(entry.0.iter().copied(), context), entry))
            .max_by_key(|(shared, _)| *shared);
        match best {
            Some((shared, entry)) if shared > 0 => {
                entry.2 = self.clock;
                entry.1.prefix(shared.min(context.len() - 1))
            }
            _ => KvCache::default(),
        }
    }

    /// The block inputs of every token of `tokens`, when a kept sequence begins with them.
    fn block_inputs_of(&mut self, tokens: &[u32]) -> Option<Vec<f32>> {
        self.clock += 1;
        let (held, inputs, used) = self.inputs.iter_mut().find(|(held, _, _)| held.starts_with(tokens))?;
        *used = self.clock;
        Some(inputs[..inputs.len() / held.len() * tokens.len()].to_vec())
    }

    /// Keeps `cache` (of `tokens`), dropping the sequences it extends and then the least
    /// recently used ones beyond the capacity; and its block inputs if it kept them.
    pub(super) fn store(&mut self, tokens: Vec<u32>, cache: KvCache) {
        assert_eq!(tokens.len(), cache.len(), "a cache of other tokens");
        self.clock += 1;
        if let Some(inputs) = cache.block_inputs().filter(|_| !tokens.is_empty()) {
            self.inputs.retain(|(kept, _, _)| !tokens.starts_with(kept));
            self.inputs.push((tokens.clone(), inputs.to_vec(), self.clock));
            evict(&mut self.inputs, self.capacity * BLOCK_INPUTS_PER_CACHED_TOKEN);
        }
        self.entries.retain(|(cached, _, _)| !tokens.starts_with(cached));
        self.entries.push((tokens, cache, self.clock));
        evict(&mut self.entries, self.capacity);
    }
}

/// Drops the least recently used of `entries` (token ids, what is kept of them, last use)
/// until they hold at most `capacity` tokens.
fn evict<T>(entries: &mut Vec<(Vec<u32>, T, u64)>, capacity: usize) {
    let mut total: usize = entries.iter().map(|e| e.0.len()).sum();
    while total > capacity {
        let Some(oldest) = entries.iter().enumerate().min_by_key(|(_, e)| e.2).map(|(i, _)| i) else { break };
        total -= entries.swap_remove(oldest).0.len();
    }
}

/// How many leading tokens `tokens` shares with `context`.
fn shared_prefix(tokens: impl Iterator<Item = u32>, context: &[u32]) -> usize {
    tokens.zip(context).take_while(|(a, b)| a == *b).count()
}

/// One request being continued.
struct Sequence {
    request: GenerationRequest,
    reply: oneshot::Sender<Result<Generation, PolicyError>>,
    context: Vec<u32>,
    cache: KvCache,
    /// Tokens to feed at the next step.
    pending: Vec<u32>,
    rng: ChaCha8Rng,
    picks: Vec<(u32, f32)>,
    limit: usize,
    finish: Option<FinishReason>,
    /// The request's JSON Schema as a grammar, tracking what has been sampled.
    constraint: Option<Matcher>,
    /// Why this request failed (its own problem: the others go on).
    failure: Option<String>,
    /// Unique among the running sequences.
    id: u64,
    /// The running sequence whose tokens this one's have been so far (the rollouts of one
    /// question, until they sample apart): this one is not fed, it samples from the leader's
    /// logits, and takes a copy of the leader's cache only when they part. A peaked policy
    /// samples a group's rollouts alike for long stretches, and each shared token is then
    /// computed once. By row-locality the logits are the ones it would have computed itself.
    follows: Option<u64>,
    /// Its caller stopped waiting (as seen at the top of this round of the loop).
    abandoned: bool,
}

impl Sequence {
    /// Its context and every token sampled so far.
    fn tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.context.iter().copied().chain(self.picks.iter().map(|(id, _)| *id))
    }

    /// The tokens its cache holds: the context and every pick but the last (not fed yet);
    /// none while it follows another (its cache is the leader's).
    fn fed(&self) -> impl Iterator<Item = u32> + '_ {
        self.tokens().take(self.cache.len())
    }

    /// The last token sampled: followers that sampled another than their leader's part.
    fn last_pick(&self) -> Option<u32> {
        self.picks.last().map(|(id, _)| *id)
    }

    /// Whether it has finished or failed (it leaves after this step).
    fn done(&self) -> bool {
        self.finish.is_some() || self.failure.is_some()
    }

    /// Whether it has been through no step yet.
    fn fresh(&self) -> bool {
        self.picks.is_empty()
    }
}

/// What callers send the scheduler thread.
pub(super) enum Message {
    /// Requests of one `generate` call.
    Requests(Vec<Submitted>),
    /// New weights: served to every request admitted after this message, once those admitted
    /// before it have finished; cached keys and values, computed by the old weights, are
    /// dropped. The sender hears when the swap is done.
    Replace(Box<LlamaModel>, std::sync::mpsc::Sender<()>),
    /// The block inputs of every token of each sequence at a block (see [`block_inputs`]).
    BlockInputs {
        sequences: Vec<Vec<u32>>,
        layer: usize,
        reply: std::sync::mpsc::Sender<Result<Vec<Vec<f32>>, String>>,
    },
}

/// The scheduler's loop; returns when every sender of `submissions` is gone (the policy was
/// dropped) and nothing is running.
pub(super) fn run(inner: &Inner, mut model: LlamaModel, submissions: Receiver<Message>, mut sessions: Sessions) {
    let mut running: Vec<Sequence> = Vec::new();
    // Requests the last step stopped at a stop string: their callers usually come right back
    // (an agent searches, then continues).
    let mut answered = 0;
    loop {
        let mut arrived = Vec::new();
        if running.is_empty() {
            match submissions.recv() {
                Ok(message) => arrived.push(message),
                Err(_) => return,
            }
            gather(&submissions, &mut arrived, usize::MAX);
        } else if answered > 0 {
            gather(&submissions, &mut arrived, answered);
        }
        arrived.extend(submissions.try_iter());
        // A caller that stopped waiting (its episode was dropped) frees its slot.
        // A caller may stop waiting at any moment: one look per sequence decides both who
        // parts from a leaving leader and who leaves, so no follower is left without one.
        for sequence in running.iter_mut() {
            sequence.abandoned = sequence.reply.is_closed();
        }
        part(&mut running, |leader, follower| leader.abandoned && !follower.abandoned);
        running.retain(|sequence| !sequence.abandoned);
        for message in arrived {
            match message {
                Message::Requests(batch) => {
                    for submitted in batch {
                        inner.admit(&model, submitted, &mut running, &mut sessions);
                    }
                }
                Message::Replace(new, done) => {
                    while !running.is_empty() {
                        inner.advance(&model, &mut running, &mut sessions);
                    }
                    let keep = model.keep_block_inputs;
                    model = *new;
                    model.keep_block_inputs = keep;
                    sessions.clear();
                    let _ = done.send(());
                }
                Message::BlockInputs { sequences, layer, reply } => {
                    // Keeping another block's inputs: sequences begun before finish first and
                    // what was kept is forgotten, so a cache never holds two blocks' inputs.
                    if model.keep_block_inputs != Some(layer) {
                        while !running.is_empty() {
                            inner.advance(&model, &mut running, &mut sessions);
                        }
                        model.keep_block_inputs = Some(layer);
                        sessions.clear();
                    }
                    let inputs = surviving_panics(|| block_inputs(&model, &mut sessions, &sequences, layer));
                    let _ = reply.send(inputs);
                }
            }
        }
        if running.is_empty() {
            continue;
        }
        answered = inner.advance(&model, &mut running, &mut sessions);
    }
}

impl Inner {
    /// One step of every running sequence; finished ones are answered and leave. Returns how
    /// many stopped at a stop string.
    fn advance(&self, model: &LlamaModel, running: &mut Vec<Sequence>, sessions: &mut Sessions) -> usize {
        // A failing forward pass, or a bug that panics, fails the requests of this step; the
        // scheduler lives on for the next calls.
        let stepped = surviving_panics(|| self.step(model, running));
        if let Err(message) = stepped {
            for sequence in running.drain(..) {
                let _ = sequence.reply.send(Err(self.error(&message)));
            }
            return 0;
        }
        let (done, rest): (Vec<Sequence>, Vec<Sequence>) =
            std::mem::take(running).into_iter().partition(Sequence::done);
        *running = rest;
        let answered = done.iter().filter(|sequence| sequence.finish == Some(FinishReason::Stop)).count();
        for sequence in done {
            let result = match sequence.failure {
                Some(message) => Err(self.error(message)),
                None => self.finish(sequence.context, sequence.picks, sequence.cache, sequence.finish, sessions),
            };
            let _ = sequence.reply.send(result);
        }
        answered
    }
}

/// The residual stream entering block `layer`, the one `model` keeps inputs of, at every token
/// of each of `sequences`: as kept when the tokens were served, else computed now (and kept, so
/// that the rollouts of a group compute their prompt once). By row-locality both ways give the
/// same bits.
fn block_inputs(
    model: &LlamaModel,
    sessions: &mut Sessions,
    sequences: &[Vec<u32>],
    layer: usize,
) -> Result<Vec<Vec<f32>>, String> {
    debug_assert_eq!(model.keep_block_inputs, Some(layer), "the caller keeps this block's inputs");
    // Everything kept is read before anything is computed: what is computed may evict it.
    let mut inputs: Vec<Option<Vec<f32>>> = sequences.iter().map(|s| sessions.block_inputs_of(s)).collect();
    for (sequence, inputs) in sequences.iter().zip(&mut inputs) {
        if inputs.is_some() || sequence.is_empty() {
            continue;
        }
        let mut cache = sessions.lookup(sequence);
        if cache.block_inputs().is_none() {
            cache = KvCache::default();
        }
        let pending = &sequence[cache.len()..];
        model.forward(&mut [Chunk { cache: &mut cache, tokens: pending }]).map_err(|e| e.to_string())?;
        *inputs = cache.block_inputs().map(<[f32]>::to_vec);
        sessions.store(sequence.clone(), cache);
    }
    Ok(inputs.into_iter().map(Option::unwrap_or_default).collect())
}

/// Where the running sequence `id` is (ids, unlike indices, survive sequences leaving).
fn position(running: &[Sequence], id: u64) -> usize {
    running.iter().position(|s| s.id == id).expect("a follower's leader is running")
}

/// Each follower for which `apart(leader, follower)` holds leaves its leader: the first of them
/// to have sampled a given token takes a copy of the leader's cache (the tokens both have been
/// fed) and goes on alone, and leads those of the same leader that sampled the same token.
fn part(running: &mut [Sequence], apart: impl Fn(&Sequence, &Sequence) -> bool) {
    // (former leader, last token sampled, new leader) of this call's partings.
    let mut parted: Vec<(u64, Option<u32>, u64)> = Vec::new();
    for i in 0..running.len() {
        let Some(leader) = running[i].follows else { continue };
        let at = position(running, leader);
        if !apart(&running[at], &running[i]) {
            continue;
        }
        let sampled = running[i].last_pick();
        if let Some(&(_, _, new)) = parted.iter().find(|p| p.0 == leader && p.1 == sampled) {
            running[i].follows = Some(new);
            continue;
        }
        let cache = running[at].cache.clone();
        let follower = &mut running[i];
        follower.pending = follower.tokens().skip(cache.len()).collect();
        follower.cache = cache;
        follower.follows = None;
        parted.push((leader, sampled, follower.id));
    }
}

/// `work`'s result, or a bug that panicked in it as an error: the scheduler lives on.
fn surviving_panics<T>(work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let what =
            panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
        Err(format!("internal error (please report it): {}", what.unwrap_or_default()))
    })
}

/// Receives for up to [`GATHER`], until `enough` requests have arrived.
fn gather(submissions: &Receiver<Message>, arrived: &mut Vec<Message>, enough: usize) {
    let deadline = Instant::now() + GATHER;
    let requests = |arrived: &Vec<Message>| {
        arrived.iter().map(|m| if let Message::Requests(batch) = m { batch.len() } else { 0 }).sum::<usize>()
    };
    while requests(arrived) < enough {
        match submissions.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(message) => arrived.push(message),
            Err(_) => break,
        }
    }
}

impl Inner {
    /// Starts a request: its context, and the longest cached prefix of it (a finished
    /// sequence's or a running one's), or a leader of this step with the same context to follow.
    /// Bad requests are answered at once.
    fn admit(&self, model: &LlamaModel, submitted: Submitted, running: &mut Vec<Sequence>, sessions: &mut Sessions) {
        let Submitted { request, reply } = submitted;
        let context = match self.context(&request) {
            Ok(context) => context,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let constraint = match request.json_schema.as_ref().map(|schema| self.constraint(schema)).transpose() {
            Ok(constraint) => constraint,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let limit = request.max_tokens.min(model.shape.context.saturating_sub(context.len()));
        if limit == 0 {
            let _ = reply.send(self.finish(context, Vec::new(), KvCache::default(), None, sessions));
            return;
        }
        // Another rollout of the same context, admitted in this step, leads; this one follows.
        let follows = running.iter().find(|s| s.fresh() && s.follows.is_none() && s.context == context).map(|s| s.id);
        let mut cache = KvCache::default();
        if follows.is_none() {
            cache = sessions.lookup(&context);
            // A running sequence can share more: one of the same prompt a step ahead.
            if let Some((shared, sequence)) =
                running.iter().map(|s| (shared_prefix(s.fed(), &context), s)).max_by_key(|(shared, _)| *shared)
            {
                let usable = shared.min(context.len() - 1);
                if usable > cache.len() {
                    cache = sequence.cache.prefix(usable);
                }
            }
        }
        running.push(Sequence {
            id: running.iter().map(|s| s.id + 1).max().unwrap_or(0),
            pending: if follows.is_some() { Vec::new() } else { context[cache.len()..].to_vec() },
            rng: ChaCha8Rng::seed_from_u64(request.seed),
            request,
            reply,
            context,
            cache,
            picks: Vec::new(),
            limit,
            finish: None,
            constraint,
            failure: None,
            follows,
            abandoned: false,
        });
    }

    /// The request's context as token ids, checked.
    fn context(&self, request: &GenerationRequest) -> Result<Vec<u32>, PolicyError> {
        let context = match &request.context_ids {
            Some(ids) => ids.clone(),
            None => self.tokenize(&request.context)?,
        };
        let vocabulary = self.vocabulary;
        if context.is_empty() {
            return Err(self.error("empty context"));
        }
        if let Some(id) = context.iter().find(|&&id| id as usize >= vocabulary) {
            return Err(self.error(format!("token id {id} outside the vocabulary of {vocabulary}")));
        }
        Ok(context)
    }

    /// A grammar for `schema`, at its start.
    fn constraint(&self, schema: &serde_json::Value) -> Result<Matcher, PolicyError> {
        let grammars = self
            .grammars
            .get_or_init(|| super::grammar_engine(&self.tokenizer, &self.stops, self.vocabulary))
            .as_ref()
            .map_err(|e| self.error(format!("no constrained decoding here: {e}")))?;
        let parser = grammars
            .create_parser(TopLevelGrammar::from_json_schema(schema.clone()))
            .map_err(|e| self.error(format!("the JSON Schema cannot be decoded under: {e}")))?;
        Ok(Matcher::new(Ok(parser)))
    }

    /// One forward step of every running sequence, then one sampled token each. A sequence's
    /// own problem (its grammar) is recorded in its `failure`; an error here fails the step.
    fn step(&self, model: &LlamaModel, running: &mut [Sequence]) -> Result<(), String> {
        let mut chunks: Vec<Chunk<'_>> = running
            .iter_mut()
            .filter(|s| s.follows.is_none())
            .map(|s| Chunk { cache: &mut s.cache, tokens: &s.pending })
            .collect();
        #[cfg(test)]
        self.rows_fed.fetch_add(chunks.iter().map(|c| c.tokens.len()).sum(), std::sync::atomic::Ordering::Relaxed);
        let mut logits = model.forward(&mut chunks).map_err(|e| e.to_string())?.into_iter();
        drop(chunks);
        let mut next: Vec<Vec<f32>> = running
            .iter()
            .map(|s| match s.follows {
                Some(_) => Vec::new(),
                None => logits.next().expect("one row of logits per fed sequence"),
            })
            .collect();
        for (i, sequence) in running.iter().enumerate() {
            if let Some(leader) = sequence.follows {
                next[i] = next[position(running, leader)].clone();
            }
        }
        // Through the forward pass's fork-join, whose helpers are still spinning from it.
        let mut picks: Vec<(&mut Sequence, Vec<f32>)> = running.iter_mut().zip(next).collect();
        for_each_chunk_mut(&mut picks, 1, model.threads(), |_, pick| {
            let (sequence, logits) = &mut pick[0];
            if let Err(message) = self.pick(sequence, std::mem::take(logits)) {
                sequence.failure = Some(message);
            }
        });
        part(running, |leader, follower| {
            !follower.done() && (leader.done() || leader.last_pick() != follower.last_pick())
        });
        Ok(())
    }

    /// Samples the next token of `sequence` from `logits`, under its grammar if it has one.
    fn pick(&self, sequence: &mut Sequence, mut logits: Vec<f32>) -> Result<(), String> {
        let request = &sequence.request;
        match &mut sequence.constraint {
            // The grammar alone says when the text may end.
            Some(grammar) => {
                let allowed = grammar.compute_mask_or_eos().map_err(|e| e.to_string())?;
                let mut any = false;
                for (id, logit) in logits.iter_mut().enumerate() {
                    if id < allowed.len() && allowed.is_allowed(id as u32) {
                        any = true;
                    } else {
                        *logit = f32::NEG_INFINITY;
                    }
                }
                if !any {
                    return Err("the JSON Schema allows no token of this vocabulary here".into());
                }
            }
            None if request.ignore_eos => {
                for &id in &self.stops {
                    if let Some(logit) = logits.get_mut(id as usize) {
                        *logit = f32::NEG_INFINITY;
                    }
                }
            }
            None => {}
        }
        let (id, logprob) = sample(&logits, request.sampling, &mut sequence.rng);
        sequence.picks.push((id, logprob));
        sequence.pending = vec![id];
        let grammar_done = match &mut sequence.constraint {
            Some(grammar) if !self.stops.contains(&id) => {
                grammar.consume_token(id).map_err(|e| e.to_string())?;
                grammar.is_stopped()
            }
            _ => false,
        };
        sequence.finish = if self.stops.contains(&id) || grammar_done {
            Some(FinishReason::Eos)
        } else if self.ends_with_stop(&sequence.picks, &request.stop).map_err(|e| e.to_string())? {
            Some(FinishReason::Stop)
        } else if sequence.picks.len() >= sequence.limit {
            Some(FinishReason::Length)
        } else {
            None
        };
        Ok(())
    }

    /// The generation of a finished sequence; its cache is kept for later turns.
    fn finish(
        &self,
        context: Vec<u32>,
        picks: Vec<(u32, f32)>,
        cache: KvCache,
        finish: Option<FinishReason>,
        sessions: &mut Sessions,
    ) -> Result<Generation, PolicyError> {
        let ids: Vec<u32> = picks.iter().map(|(id, _)| *id).collect();
        let text = self.decode(&ids)?;
        let mut fed = context;
        fed.extend(ids.iter().take(ids.len().saturating_sub(1)));
        if fed.len() == cache.len() {
            sessions.store(fed, cache);
        }
        Ok(Generation {
            text,
            token_ids: Some(ids),
            logprobs: Some(picks.iter().map(|(_, lp)| *lp).collect()),
            finish: finish.unwrap_or(FinishReason::Length),
        })
    }

    /// Whether the text of `picks` has just come to contain a stop string. Only the last
    /// tokens are decoded: a stop string that appeared earlier would have stopped generation.
    fn ends_with_stop(&self, picks: &[(u32, f32)], stops: &[String]) -> Result<bool, PolicyError> {
        let Some(longest) = stops.iter().map(String::len).max() else { return Ok(false) };
        let tail: Vec<u32> = picks[picks.len().saturating_sub(longest + 1)..].iter().map(|(id, _)| *id).collect();
        let text = self.decode(&tail)?;
        Ok(stops.iter().any(|stop| text.contains(stop.as_str())))
    }
}
