//! The trainer: a differentiable llama on the CPU ([`model`]), AdamW ([`optim`]), and the
//! optimizer step that every training stage runs ([`Trainer::step`]).
//!
//! A loss is given as its derivative with respect to each scored token's log-probability: a
//! supervised loss (`−mean log p`), GRPO's clipped surrogate and REINFORCE all reduce to that,
//! so one backward pass serves them all. Examples are packed into micro-batches of at most
//! `micro_batch_tokens` rows whose gradients accumulate into one optimizer step: memory is
//! bounded by the micro-batch, whatever the batch. Consecutive examples that begin alike (a
//! GRPO group's rollouts of one prompt) run their common prefix once ([`packing`]).
//!
//! **Invariant:** a step is deterministic: the same weights, batch and settings give the same
//! weights bit for bit, on any number of threads (every sum runs in an order fixed by shapes).

mod gemm;
pub mod model;
pub mod objective;
pub mod optim;
pub mod packing;

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::model::{
    Adapters, BatchError, Example, Grads, Lora, MODULES, PROJECTIONS, Tape, TrainModel, WithReference,
};
pub use self::objective::{ClippedObjective, TokenTerms, baseline_advantages, group_advantages};
pub use self::optim::{AdamW, OptimizerConfig, Schedule, global_norm};
pub use self::packing::micro_batches;
use crate::weights::LlamaWeights;

/// What is trained.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Method {
    /// Every weight (the default for a 135M model).
    Full,
    /// Low-rank adapters on some projections; the base weights stay frozen (and serve as the
    /// reference policy).
    Lora(LoraMethod),
}

sesa_engine::deserialize_tagged!(Method, "kind", { "full" => Full, "lora" => Lora(settings) });

/// Low-rank adapters: their rank, scale and projections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoraMethod {
    /// Rank of each adapter.
    pub rank: usize,
    /// Scale numerator: adapters add `alpha / rank · B·A`.
    pub alpha: f32,
    /// Projections to adapt, among `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`.
    #[serde(default = "all_modules")]
    pub targets: Vec<String>,
    /// Adapt only the top this many blocks (those nearest the output; all of them when it is
    /// at least the model's depth). The backward pass stops at the lowest adapted block, so a
    /// step's backward work shrinks in proportion, and the forward pass keeps no activations
    /// below it. Absent: every block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_layers: Option<usize>,
}

impl LoraMethod {
    /// Adapters of `rank` and `alpha` on every projection of every block.
    pub fn everywhere(rank: usize, alpha: f32) -> LoraMethod {
        LoraMethod { rank, alpha, targets: all_modules(), top_layers: None }
    }
}

fn all_modules() -> Vec<String> {
    MODULES.iter().map(|m| m.to_string()).collect()
}

impl Method {
    /// `full` or `lora`.
    pub fn name(&self) -> &'static str {
        match self {
            Method::Full => "full",
            Method::Lora(_) => "lora",
        }
    }

    /// What is wrong with it, as (key, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        match self {
            Method::Full => Vec::new(),
            Method::Lora(LoraMethod { rank, alpha, targets, top_layers }) => {
                let mut problems = Vec::new();
                if *top_layers == Some(0) {
                    problems.push(("top_layers", "must be at least 1 (leave it out to adapt every block)".to_string()));
                }
                if !(1..=4_096).contains(rank) {
                    problems.push(("rank", format!("must be between 1 and 4096, got {rank}")));
                }
                if !(alpha.is_finite() && *alpha > 0.0) {
                    problems.push(("alpha", format!("must be a positive number, got {alpha}")));
                }
                if targets.is_empty() {
                    problems.push(("targets", "name at least one projection".to_string()));
                }
                for target in targets {
                    if !MODULES.contains(&target.as_str()) {
                        problems.push(("targets", format!("`{target}` is not one of {}", MODULES.join(", "))));
                    }
                }
                problems
            }
        }
    }
}

/// Adapters as `method` says: A uniform in ±1/√inputs (Kaiming-like), B zero, so the adapted
/// model starts as the base model.
pub fn new_adapters(weights: &LlamaWeights, method: &LoraMethod, seed: u64) -> Adapters {
    let LoraMethod { rank, alpha, targets, top_layers } = method;
    let rank = *rank;
    let s = &weights.shape;
    let dims = s.block_dims();
    let first = s.layers - top_layers.unwrap_or(s.layers).min(s.layers);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let blocks = (0..s.layers)
        .map(|l| {
            std::array::from_fn(|m| {
                let (outputs, inputs) = dims[PROJECTIONS[m]];
                (l >= first && targets.iter().any(|t| t == MODULES[m])).then(|| {
                    let bound = 1.0 / (inputs as f32).sqrt();
                    Lora {
                        a: (0..rank * inputs).map(|_| rng.random_range(-bound..bound)).collect(),
                        b: vec![0.0; outputs * rank],
                    }
                })
            })
        })
        .collect();
    Adapters { rank, scale: alpha / rank as f32, blocks }
}

impl TrainModel {
    /// A model to train from `weights` by `method`: full fine-tuning, or fresh adapters
    /// (seed 0) on frozen weights.
    pub fn for_method(weights: LlamaWeights, method: &Method) -> TrainModel {
        let mut model = TrainModel::new(weights);
        if let Method::Lora(lora) = method {
            model.adapters = Some(new_adapters(&model.weights, lora, 0));
        }
        model
    }
}

impl Adapters {
    /// The weights with every adapter merged in (`W + scale·B·A`): what serving and export use.
    pub fn merged(&self, base: &LlamaWeights) -> LlamaWeights {
        let mut merged = base.clone();
        self.merge_into(&mut merged);
        merged
    }

    /// Adds every adapter to its weight in place (`W += scale·B·A`).
    fn merge_into(&self, weights: &mut LlamaWeights) {
        for (block, adapters) in weights.blocks.iter_mut().zip(&self.blocks) {
            let mut tensors = block.tensors_mut().map(Some);
            let targets = PROJECTIONS.map(|t| tensors[t].take().expect("distinct"));
            for (weight, lora) in targets.into_iter().zip(adapters) {
                let Some(lora) = lora else { continue };
                let inputs = lora.a.len() / self.rank;
                let outputs = lora.b.len() / self.rank;
                let scaled_b: Vec<f32> = lora.b.iter().map(|b| self.scale * b).collect();
                gemm::gemm(
                    outputs,
                    self.rank,
                    inputs,
                    gemm::View::rows(&scaled_b, self.rank),
                    gemm::View::rows(&lora.a, inputs),
                    1.0,
                    gemm::Out::rows(weight, inputs),
                );
            }
        }
    }

    /// The tensors (each adapter's A, then its B), in a fixed order.
    pub fn tensors(&self) -> Vec<&Vec<f32>> {
        self.blocks.iter().flatten().flatten().flat_map(|l| [&l.a, &l.b]).collect()
    }

    /// [`Adapters::tensors`], mutable.
    pub fn tensors_mut(&mut self) -> Vec<&mut Vec<f32>> {
        self.blocks.iter_mut().flatten().flatten().flat_map(|l| [&mut l.a, &mut l.b]).collect()
    }
}

impl TrainModel {
    /// Merges the adapters into the base weights and trains fresh ones as `method` says (seed
    /// 0), keeping the merged ones in [`TrainModel::merged`]: the served policy is unchanged,
    /// and from here on the base (LoRA's reference policy) is what was trained so far. This is
    /// how a run warm-starts every block and then runs RL on a few. Done once, and only with
    /// adapters: a model that merged adapters already, or that trains every weight (whose
    /// checkpoints hold the weights themselves), is left as it is. Whether it switched.
    pub fn adapt_anew(&mut self, method: &LoraMethod) -> bool {
        if self.merged.is_some() {
            return false;
        }
        let Some(trained) = self.adapters.take() else { return false };
        trained.merge_into(&mut self.weights);
        self.merged = Some(trained);
        self.adapters = Some(new_adapters(&self.weights, method, 0));
        true
    }
}

/// The trained tensors of `weights`, in a fixed order.
fn weight_tensors(weights: &LlamaWeights) -> Vec<&Vec<f32>> {
    let mut tensors = vec![&weights.embedding, &weights.output_norm];
    tensors.extend(weights.output.as_ref());
    for b in &weights.blocks {
        tensors.extend(b.tensors());
    }
    tensors
}

fn weight_tensors_mut(weights: &mut LlamaWeights) -> Vec<&mut Vec<f32>> {
    let mut tensors = vec![&mut weights.embedding, &mut weights.output_norm];
    tensors.extend(weights.output.as_mut());
    for b in &mut weights.blocks {
        tensors.extend(b.tensors_mut());
    }
    tensors
}

impl TrainModel {
    /// The trained tensors, in the optimizer's order.
    pub fn trained(&self) -> Vec<&Vec<f32>> {
        match &self.adapters {
            Some(adapters) => adapters.tensors(),
            None => weight_tensors(&self.weights),
        }
    }

    /// The trained tensors, mutable, in the optimizer's order.
    pub fn trained_mut(&mut self) -> Vec<&mut Vec<f32>> {
        match &mut self.adapters {
            Some(adapters) => adapters.tensors_mut(),
            None => weight_tensors_mut(&mut self.weights),
        }
    }

    /// The weights a policy serves: the base weights (borrowed: 540 MB for SmolLM2), or a
    /// copy with the adapters merged.
    pub fn serving_weights(&self) -> std::borrow::Cow<'_, LlamaWeights> {
        match &self.adapters {
            Some(adapters) => std::borrow::Cow::Owned(adapters.merged(&self.weights)),
            None => std::borrow::Cow::Borrowed(&self.weights),
        }
    }
}

impl Grads {
    /// Sets every gradient to zero, keeping the buffers: a step's 500 MB of fresh gradient
    /// memory would otherwise be faulted in page by page at every step.
    pub fn zero(&mut self) {
        use rayon::prelude::*;
        let tensors: Vec<&mut Vec<f32>> = match (&mut self.adapters, &mut self.base) {
            (Some(adapters), _) => adapters.tensors_mut(),
            (None, Some(base)) => weight_tensors_mut(base),
            (None, None) => Vec::new(),
        };
        for tensor in tensors {
            tensor.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
        }
    }

    /// The gradient tensors, in the optimizer's order.
    pub fn tensors(&self) -> Vec<&Vec<f32>> {
        match (&self.adapters, &self.base) {
            (Some(adapters), _) => adapters.tensors(),
            (None, Some(base)) => weight_tensors(base),
            (None, None) => Vec::new(),
        }
    }
}

/// One sequence to train on: its tokens and which of them are learned from (1) or only read
/// (0: the prompt, retrieved passages).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSequence {
    /// Prompt and response token ids.
    pub tokens: Vec<u32>,
    /// Per token: 1 when its prediction is trained.
    pub mask: Vec<u8>,
    /// The served model's residual stream entering the trainer's lowest trained block at each
    /// of [`Self::read`]'s tokens, when the caller has it (see [`Example::block_inputs`]).
    pub block_inputs: Option<std::sync::Arc<[f32]>>,
}

impl TrainSequence {
    /// A sequence to train on as `mask` says, its passes run from the first block.
    pub fn new(tokens: Vec<u32>, mask: Vec<u8>) -> TrainSequence {
        TrainSequence { tokens, mask, block_inputs: None }
    }

    /// Positions whose prediction is trained (never the first token: nothing predicts it).
    pub fn positions(&self) -> Vec<usize> {
        (1..self.tokens.len()).filter(|&i| self.mask.get(i).copied().unwrap_or(0) != 0).collect()
    }

    /// The tokens a pass reads: those before the last trained one (attention is causal, so
    /// nothing after it matters, such as the passages of a search a rollout never answered
    /// after); none when nothing is trained.
    pub fn read(&self) -> &[u32] {
        let last = self.mask.iter().take(self.tokens.len()).rposition(|&m| m != 0).filter(|&p| p >= 1);
        &self.tokens[..last.unwrap_or(0)]
    }
}

/// What one micro-batch did.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    /// The step's sequences it holds.
    pub sequences: std::ops::Range<usize>,
    /// The sum of the loss values the callback returned for its sequences.
    pub loss: f64,
    /// Rows run (prompt included; a shared prefix once).
    pub tokens: usize,
    /// Tokens scored.
    pub scored: usize,
    /// Forward and backward wall time.
    pub wall_ms: f64,
    /// The share of `wall_ms` that computed the reference policy's log-probabilities.
    pub reference_ms: f64,
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The optimizer step this was (1-based, counted over the trainer's life).
    pub optimizer_step: u64,
    /// The micro-batches, in order.
    pub micro_batches: Vec<MicroBatch>,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate used.
    pub lr: f64,
    /// Optimizer wall time.
    pub optimizer_ms: f64,
}

/// A loss, given a sequence's index, its scored log-probabilities and, when the step computes
/// them ([`Trainer::step`]'s `reference`), the reference policy's: its value and its derivative
/// with respect to each log-probability.
pub type LossFn<'a> = dyn FnMut(usize, &[f32], Option<&[f32]>) -> (f64, Vec<f32>) + 'a;

/// How a step's sequences run: each one's scored positions and the tokens it needs, and the
/// micro-batches of at most `budget` rows.
struct Packed<'a> {
    positions: Vec<Vec<usize>>,
    /// Each sequence up to its last scored token ([`TrainSequence::read`] and that token).
    tokens: Vec<&'a [u32]>,
    block_inputs: Vec<Option<&'a [f32]>>,
    micro_batches: Vec<std::ops::Range<usize>>,
}

impl<'a> Packed<'a> {
    fn new(sequences: &'a [TrainSequence], budget: usize) -> Packed<'a> {
        let positions: Vec<Vec<usize>> = sequences.iter().map(TrainSequence::positions).collect();
        let tokens: Vec<&[u32]> =
            sequences.iter().map(|s| &s.tokens[..(s.read().len() + 1).min(s.tokens.len())]).collect();
        let micro_batches = micro_batches(&tokens, budget.max(1));
        let block_inputs = sequences.iter().map(|s| s.block_inputs.as_deref()).collect();
        Packed { positions, tokens, block_inputs, micro_batches }
    }

    /// The examples of the sequences in `range`.
    fn examples(&self, range: std::ops::Range<usize>) -> Vec<Example<'_>> {
        range
            .map(|i| Example {
                tokens: self.tokens[i],
                positions: &self.positions[i],
                block_inputs: self.block_inputs[i],
            })
            .collect()
    }
}

/// The scored log-probabilities of each sequence under `model` at `temperature`, by
/// micro-batches of at most `budget` tokens, without a backward pass.
pub fn logprobs(
    model: &TrainModel,
    sequences: &[TrainSequence],
    temperature: f32,
    budget: usize,
) -> Result<Vec<Vec<f32>>, BatchError> {
    Ok(scores(model, sequences, temperature, budget, false)?.policy)
}

/// [`logprobs`] and, in the same passes, the reference policy's (the base model's, adapters
/// off; see [`TrainModel::score_with_reference`]).
pub fn logprobs_with_reference(
    model: &TrainModel,
    sequences: &[TrainSequence],
    temperature: f32,
    budget: usize,
) -> Result<WithReference, BatchError> {
    scores(model, sequences, temperature, budget, true)
}

/// The passes of [`logprobs`], with the reference's log-probabilities when `reference`.
fn scores(
    model: &TrainModel,
    sequences: &[TrainSequence],
    temperature: f32,
    budget: usize,
    reference: bool,
) -> Result<WithReference, BatchError> {
    let packed = Packed::new(sequences, budget);
    let mut out = WithReference::default();
    for range in packed.micro_batches.iter().cloned() {
        let examples = packed.examples(range);
        if reference {
            let scored = model.score_with_reference(&examples, temperature)?;
            out.policy.extend(scored.policy);
            out.reference.extend(scored.reference);
            out.reference_ms += scored.reference_ms;
        } else {
            out.policy.extend(model.score(&examples, temperature)?);
        }
    }
    Ok(out)
}

/// A model with the state its optimizer keeps.
pub struct Trainer {
    /// The model.
    pub model: TrainModel,
    /// The optimizer's moments.
    pub adam: AdamW,
    /// Tokens per micro-batch at most.
    pub micro_batch_tokens: usize,
    /// The gradient buffers, kept between steps.
    grads: Option<Grads>,
}

impl Trainer {
    /// A trainer for `model`, with fresh optimizer state.
    pub fn new(model: TrainModel, micro_batch_tokens: usize) -> Trainer {
        let lengths: Vec<usize> = model.trained().iter().map(|t| t.len()).collect();
        Trainer { model, adam: AdamW::new(&lengths), micro_batch_tokens: micro_batch_tokens.max(1), grads: None }
    }

    /// [`TrainModel::adapt_anew`], with fresh optimizer state for the fresh adapters.
    pub fn adapt_anew(&mut self, method: &LoraMethod) {
        if self.model.adapt_anew(method) {
            self.reset_optimizer();
        }
    }

    /// Forgets the optimizer's moments: the next step starts AdamW afresh, shaped as what is
    /// trained now (which [`TrainModel::adapt_anew`] changes; the gradient buffers go too).
    pub fn reset_optimizer(&mut self) {
        let lengths: Vec<usize> = self.model.trained().iter().map(|t| t.len()).collect();
        self.adam = AdamW::new(&lengths);
        self.grads = None;
    }

    /// The scored log-probabilities of each sequence under the current weights at
    /// `temperature`, by micro-batches, without a backward pass.
    pub fn logprobs(&self, sequences: &[TrainSequence], temperature: f32) -> Result<Vec<Vec<f32>>, BatchError> {
        logprobs(&self.model, sequences, temperature, self.micro_batch_tokens)
    }

    /// One optimizer step over `sequences`. `loss` gets a sequence's index and its scored
    /// log-probabilities, and returns its share of the step's loss and that share's derivative
    /// with respect to each log-probability. The learning rate is `optimizer`'s schedule at this
    /// optimizer step, of a schedule that ends at optimizer step `last_step` (counted over the
    /// trainer's life, so that a run's stages and a resumed run follow one schedule). With
    /// `reference`, each micro-batch's forward pass also gives `loss` the reference policy's
    /// log-probabilities (the base model's: adapters off), sharing the blocks below the lowest
    /// adapted one ([`TrainModel::forward_with_reference`]).
    pub fn step(
        &mut self,
        sequences: &[TrainSequence],
        temperature: f32,
        optimizer: &OptimizerConfig,
        last_step: u64,
        reference: bool,
        loss: &mut LossFn<'_>,
    ) -> Result<StepReport, BatchError> {
        let lr = optimizer.lr_at(self.adam.step + 1, last_step);
        let packed = Packed::new(sequences, self.micro_batch_tokens);
        let mut grads = match self.grads.take() {
            Some(mut grads) => {
                grads.zero();
                grads
            }
            None => self.model.zero_grads(),
        };
        let mut micro = Vec::new();
        for range in packed.micro_batches.iter().cloned() {
            let clock = Instant::now();
            let examples = packed.examples(range.clone());
            let tape = if reference {
                self.model.forward_with_reference(&examples, temperature)?
            } else {
                self.model.forward(&examples, temperature)?
            };
            let mut total = 0.0;
            let mut derivatives = Vec::with_capacity(examples.len());
            for (k, (i, logprobs)) in range.clone().zip(&tape.logprobs).enumerate() {
                let (value, derivative) = loss(i, logprobs, tape.reference.as_ref().map(|r| r[k].as_slice()));
                if derivative.len() != logprobs.len() {
                    return Err(BatchError(format!(
                        "the loss gave {} derivatives for {} log-probabilities",
                        derivative.len(),
                        logprobs.len()
                    )));
                }
                total += value;
                derivatives.push(derivative);
            }
            let (rows, reference_ms) = (tape.rows(), tape.reference_ms);
            self.model.backward(tape, &derivatives, &mut grads)?;
            micro.push(MicroBatch {
                sequences: range.clone(),
                loss: total,
                tokens: rows,
                scored: packed.positions[range].iter().map(Vec::len).sum(),
                wall_ms: clock.elapsed().as_secs_f64() * 1e3,
                reference_ms,
            });
        }
        let clock = Instant::now();
        let grad_tensors = grads.tensors();
        let grad_slices: Vec<&[f32]> = grad_tensors.iter().map(|g| g.as_slice()).collect();
        let grad_norm = global_norm(&grad_slices);
        let scale = if optimizer.clip_norm > 0.0 && grad_norm > optimizer.clip_norm {
            (optimizer.clip_norm / grad_norm) as f32
        } else {
            1.0
        };
        let params: Vec<&mut [f32]> = self.model.trained_mut().into_iter().map(|p| p.as_mut_slice()).collect();
        self.adam.update(optimizer, lr, params, grad_slices, scale);
        drop(grad_tensors);
        self.grads = Some(grads);
        Ok(StepReport {
            optimizer_step: self.adam.step,
            micro_batches: micro,
            grad_norm,
            lr,
            optimizer_ms: clock.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// One supervised step: minimises the token-mean negative log-likelihood of the masked
    /// tokens. A micro-batch's reported `loss` is its summed negative log-likelihood.
    pub fn supervised_step(
        &mut self,
        sequences: &[TrainSequence],
        optimizer: &OptimizerConfig,
        last_step: u64,
    ) -> Result<StepReport, BatchError> {
        let scored: usize = sequences.iter().map(|s| s.positions().len()).sum::<usize>().max(1);
        let weight = 1.0 / scored as f32;
        self.step(sequences, 1.0, optimizer, last_step, false, &mut |_, logprobs, _| {
            (-logprobs.iter().map(|&l| f64::from(l)).sum::<f64>(), vec![-weight; logprobs.len()])
        })
    }
}

#[cfg(test)]
mod tests;
