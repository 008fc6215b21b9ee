//! The differentiable llama: a forward pass that keeps what the backward pass needs (a
//! [`Tape`]), and the backward pass written out by hand over the same matrix products.
//!
//! Why by hand and not candle's autograd: candle keeps every intermediate of every op (about
//! 8 GB for one 512-token SmolLM2 sequence) and ran a LoRA step at a third of PyTorch's speed
//! here; a llama block's gradients are a dozen well-known formulas, each a matrix product that
//! matrixmultiply runs near the machine's peak. The finite-difference test in `tests.rs`
//! checks every one of them on a tiny random model.
//!
//! The examples of a micro-batch are packed into one matrix of rows (no padding); attention
//! stays within each example, and examples that begin alike share the rows of their common
//! prefix (see [`super::packing`]). Logits are computed only at the positions whose log-probability
//! is asked for: the output projection is a fifth of SmolLM2's work per token, and prompt
//! and retrieved tokens are never trained on.

use rayon::prelude::*;

use super::gemm::{Out, SharedMut, View, gemm, gemm_serial};
use super::packing::{Layout, Segment, prob_offsets};
use crate::kernels::exp_in_place;
use crate::weights::{BlockWeights, LlamaShape, LlamaWeights};

/// The projections LoRA can adapt, in a block's order.
pub const MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// Where each of [`MODULES`] is among a block's tensors (`weights::BLOCK_TENSORS`).
pub const PROJECTIONS: [usize; 7] = [1, 2, 3, 4, 6, 7, 8];

/// A low-rank adapter of one projection: `W + scale · B·A`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lora {
    /// `rank × inputs`.
    pub a: Vec<f32>,
    /// `outputs × rank`.
    pub b: Vec<f32>,
}

/// The adapters of a model: per block, one optional adapter per projection of [`MODULES`].
#[derive(Debug, Clone, PartialEq)]
pub struct Adapters {
    /// Rank of every adapter.
    pub rank: usize,
    /// `alpha / rank`.
    pub scale: f32,
    /// `blocks × 7`.
    pub blocks: Vec<[Option<Lora>; 7]>,
}

/// A model being trained: its weights and, with LoRA, the adapters (then the weights stay
/// frozen).
pub struct TrainModel {
    /// The base weights (trained in full fine-tuning).
    pub weights: LlamaWeights,
    /// LoRA adapters, the only trained parameters when present.
    pub adapters: Option<Adapters>,
    /// Adapters trained earlier and since merged into `weights` ([`TrainModel::adapt_anew`]):
    /// kept because `weights` can only be rebuilt from the model's files with them.
    pub merged: Option<Adapters>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Gradients, shaped like what is trained.
pub struct Grads {
    /// Of the base weights (full fine-tuning).
    pub base: Option<LlamaWeights>,
    /// Of the adapters (LoRA).
    pub adapters: Option<Adapters>,
}

/// One sequence to score: `tokens[p]` is predicted from `tokens[..p]` at each of `positions`.
pub struct Example<'a> {
    /// The whole sequence, prompt included.
    pub tokens: &'a [u32],
    /// Positions (≥ 1, increasing) whose token's log-probability is computed.
    pub positions: &'a [usize],
    /// The residual stream entering the lowest trained block at each token but the last (at
    /// least `(tokens.len() − 1) × hidden` numbers), as the served model computed it
    /// ([`crate::policy::Policy::block_inputs`]): the frozen blocks below are then not run.
    /// All examples of a pass have them, or none.
    pub block_inputs: Option<&'a [f32]>,
}

/// Why a batch cannot be run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BatchError(pub String);

/// A projection's dimensions and adapter, for one block.
struct Projection<'a> {
    weight: &'a [f32],
    inputs: usize,
    outputs: usize,
    lora: Option<&'a Lora>,
}

struct LayerTape {
    /// Block input, its RMS scales and normed rows.
    x: Vec<f32>,
    scale1: Vec<f32>,
    normed1: Vec<f32>,
    /// Queries and keys after RoPE, values.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention probabilities: per segment, per head, `len × width`.
    probs: Vec<f32>,
    attended: Vec<f32>,
    x2: Vec<f32>,
    scale2: Vec<f32>,
    normed2: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    activated: Vec<f32>,
    /// `x·Aᵀ` of each adapted projection, by module.
    lora_inputs: [Vec<f32>; 7],
}

/// What the forward pass keeps for the backward pass.
pub struct Tape {
    tokens: Vec<u32>,
    /// The rows of each example's own tokens and of each shared prefix.
    segments: Vec<Segment>,
    /// Row position of each row within its example.
    positions: Vec<usize>,
    /// The lowest block whose activations are kept: nothing below it is trained.
    first_layer: usize,
    /// The kept blocks' activations, from `first_layer` up.
    layers: Vec<LayerTape>,
    final_x: Vec<f32>,
    final_scale: Vec<f32>,
    /// Rows whose next token is scored, their target tokens and normed states.
    scored_rows: Vec<usize>,
    scored_targets: Vec<u32>,
    scored_normed: Vec<f32>,
    /// Softmax of the scored rows' (temperature-scaled) logits.
    softmax: Vec<f32>,
    temperature: f32,
    /// Log-probabilities, per example, at its positions.
    pub logprobs: Vec<Vec<f32>>,
    /// The reference policy's (the base model's) log-probabilities at the same positions, when
    /// asked for ([`TrainModel::forward_with_reference`]).
    pub reference: Option<Vec<Vec<f32>>>,
    /// Wall time of the reference's own blocks and output projection.
    pub reference_ms: f64,
}

/// Log-probabilities of the policy and of its reference, per example at its positions.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WithReference {
    /// The policy's.
    pub policy: Vec<Vec<f32>>,
    /// The reference policy's (the base model's, adapters off).
    pub reference: Vec<Vec<f32>>,
    /// Wall time of the reference's own share of the passes, in milliseconds.
    pub reference_ms: f64,
}

/// What the output projection gives at the scored rows.
struct Head {
    final_scale: Vec<f32>,
    scored_normed: Vec<f32>,
    softmax: Vec<f32>,
    logprobs: Vec<f32>,
}

impl Tape {
    /// Rows (tokens) in the micro-batch.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }
}

impl TrainModel {
    /// A model to train from `weights` (full fine-tuning unless adapters are added).
    pub fn new(weights: LlamaWeights) -> TrainModel {
        let (cos, sin) = weights.shape.rope_tables();
        TrainModel { weights, adapters: None, merged: None, cos, sin }
    }

    /// The shapes.
    pub fn shape(&self) -> &LlamaShape {
        &self.weights.shape
    }

    /// Zero gradients for what is trained.
    pub fn zero_grads(&self) -> Grads {
        match &self.adapters {
            Some(adapters) => Grads {
                base: None,
                adapters: Some(Adapters {
                    blocks: adapters
                        .blocks
                        .iter()
                        .map(|block| {
                            block
                                .clone()
                                .map(|lora| lora.map(|l| Lora { a: vec![0.0; l.a.len()], b: vec![0.0; l.b.len()] }))
                        })
                        .collect(),
                    ..adapters.clone()
                }),
            },
            None => Grads { base: Some(zeros_like(&self.weights)), adapters: None },
        }
    }

    /// Block `layer`'s projections, with their adapters when `adapted` (without: the base
    /// model, which is LoRA's reference policy).
    fn projections(&self, layer: usize, adapted: bool) -> [Projection<'_>; 7] {
        let tensors = self.weights.blocks[layer].tensors();
        let dims = self.shape().block_dims();
        std::array::from_fn(|m| Projection {
            weight: tensors[PROJECTIONS[m]],
            inputs: dims[PROJECTIONS[m]].1,
            outputs: dims[PROJECTIONS[m]].0,
            lora: self.adapters.as_ref().filter(|_| adapted).and_then(|a| a.blocks[layer][m].as_ref()),
        })
    }

    /// The lowest block with anything trained in it (the model's depth when nothing is):
    /// gradients need not flow below it.
    pub fn first_trained_layer(&self) -> usize {
        match &self.adapters {
            None => 0,
            Some(adapters) => adapters
                .blocks
                .iter()
                .position(|block| block.iter().any(Option::is_some))
                .unwrap_or(adapters.blocks.len()),
        }
    }

    fn scale(&self) -> f32 {
        self.adapters.as_ref().map_or(0.0, |a| a.scale)
    }

    /// Runs `examples` packed into one micro-batch and keeps the tape; log-probabilities are
    /// those of the logits divided by `temperature` (the sampling distribution's).
    pub fn forward(&self, examples: &[Example<'_>], temperature: f32) -> Result<Tape, BatchError> {
        self.run(examples, temperature, true, false)
    }

    /// [`Self::forward`], and in [`Tape::reference`] the log-probabilities of the reference
    /// policy, the base model (adapters off). The blocks below the lowest adapted one are the
    /// same in both, so they run once: with adapters on the top 8 of 30 blocks, the reference
    /// costs 8 blocks' forward instead of a whole second pass. Without adapters the reference
    /// is the model itself.
    pub fn forward_with_reference(&self, examples: &[Example<'_>], temperature: f32) -> Result<Tape, BatchError> {
        self.run(examples, temperature, true, true)
    }

    /// The log-probabilities [`Self::forward`] computes, without a tape: each layer's
    /// activations are freed as the next is computed (a reference or old-policy pass needs no
    /// backward, and its gigabytes of activations cost their memory traffic for nothing).
    pub fn score(&self, examples: &[Example<'_>], temperature: f32) -> Result<Vec<Vec<f32>>, BatchError> {
        Ok(self.run(examples, temperature, false, false)?.logprobs)
    }

    /// [`Self::score`] and the reference policy's log-probabilities, sharing the blocks below
    /// the lowest adapted one as [`Self::forward_with_reference`] does.
    pub fn score_with_reference(
        &self,
        examples: &[Example<'_>],
        temperature: f32,
    ) -> Result<WithReference, BatchError> {
        let tape = self.run(examples, temperature, false, true)?;
        Ok(WithReference {
            policy: tape.logprobs,
            reference: tape.reference.unwrap_or_default(),
            reference_ms: tape.reference_ms,
        })
    }

    /// The forward pass; `keep`: whether the tape keeps the activations of every block from
    /// the lowest trained one up (the backward pass needs no others); `reference`: whether it
    /// also runs the blocks from the lowest adapted one up with the adapters off.
    fn run(&self, examples: &[Example<'_>], temperature: f32, keep: bool, reference: bool) -> Result<Tape, BatchError> {
        let s = self.shape().clone();
        let (hidden, vocabulary) = (s.hidden, s.vocabulary);
        for (e, example) in examples.iter().enumerate() {
            if example.tokens.len() > s.context {
                return Err(BatchError(format!(
                    "example {e}: {} tokens exceed the model's context of {}",
                    example.tokens.len(),
                    s.context
                )));
            }
            if let Some(&bad) = example.tokens.iter().find(|&&t| t as usize >= vocabulary) {
                return Err(BatchError(format!("example {e}: token id {bad} outside the vocabulary of {vocabulary}")));
            }
            let mut previous = 0;
            for &p in example.positions {
                if p == 0 || p >= example.tokens.len() || p <= previous && previous > 0 {
                    return Err(BatchError(format!(
                        "example {e}: position {p} is not an increasing position in 1..{}",
                        example.tokens.len()
                    )));
                }
                previous = p;
            }
        }
        // A sequence's last token predicts nothing scored: it needs no row.
        let sequences: Vec<&[u32]> = examples.iter().map(|e| &e.tokens[..e.tokens.len().saturating_sub(1)]).collect();
        let layout = Layout::new(&sequences);
        let mut scored_rows = Vec::new();
        let mut scored_targets = Vec::new();
        for (e, example) in examples.iter().enumerate() {
            for &p in example.positions {
                scored_rows.push(layout.row(e, p - 1));
                scored_targets.push(example.tokens[p]);
            }
        }
        let split = self.first_trained_layer();
        let start = self.given_inputs_start(examples, &sequences, split)?;
        let mut x = Vec::with_capacity(layout.rows() * hidden);
        if start == 0 {
            for &t in &layout.tokens {
                x.extend_from_slice(&self.weights.embedding[t as usize * hidden..][..hidden]);
            }
        } else {
            x.resize(layout.rows() * hidden, 0.0);
            for (e, example) in examples.iter().enumerate() {
                let given = example.block_inputs.unwrap_or_default();
                for (p, state) in given.chunks_exact(hidden).take(sequences[e].len()).enumerate() {
                    x[layout.row(e, p) * hidden..][..hidden].copy_from_slice(state);
                }
            }
        }
        let Layout { tokens, positions, segments, .. } = layout;
        let first_layer = if keep { split } else { s.layers };
        let mut reference_input = None;
        let mut layers = Vec::with_capacity(s.layers - first_layer);
        for l in start..s.layers {
            if reference && l == split {
                reference_input = Some(x.clone());
            }
            let (next, tape) = self.block(l, x, &positions, &segments, true);
            x = next;
            if l >= first_layer {
                layers.push(tape);
            }
        }
        if reference && split >= s.layers {
            reference_input = Some(x.clone());
        }
        let per_example = |scored: &[f32]| {
            let mut taken = 0;
            examples
                .iter()
                .map(|e| {
                    taken += e.positions.len();
                    scored[taken - e.positions.len()..taken].to_vec()
                })
                .collect::<Vec<_>>()
        };
        let clock = std::time::Instant::now();
        let reference = reference_input.map(|mut x| {
            for l in split..s.layers {
                x = self.block(l, x, &positions, &segments, false).0;
            }
            per_example(&self.head(&x, &scored_rows, &scored_targets, temperature).logprobs)
        });
        let reference_ms = clock.elapsed().as_secs_f64() * 1e3;
        let Head { final_scale, scored_normed, softmax, logprobs } =
            self.head(&x, &scored_rows, &scored_targets, temperature);
        Ok(Tape {
            tokens,
            segments,
            positions,
            first_layer,
            layers,
            final_x: x,
            final_scale,
            scored_rows,
            scored_targets,
            scored_normed,
            softmax,
            temperature,
            logprobs: per_example(&logprobs),
            reference,
            reference_ms,
        })
    }

    /// The block the pass starts at: the lowest trained one when every example brings its
    /// inputs (checked against `rows`, each example's tokens that need a row), else 0.
    fn given_inputs_start(&self, examples: &[Example<'_>], rows: &[&[u32]], split: usize) -> Result<usize, BatchError> {
        let given = examples.iter().filter(|e| e.block_inputs.is_some()).count();
        if given == 0 {
            return Ok(0);
        }
        if given < examples.len() {
            return Err(BatchError(format!(
                "block inputs for {given} of {} examples: give all or none",
                examples.len()
            )));
        }
        if split == 0 || split >= self.shape().layers {
            return Err(BatchError(format!("block inputs for a model trained from block {split}: nothing to skip")));
        }
        let hidden = self.shape().hidden;
        for (e, (example, rows)) in examples.iter().zip(rows).enumerate() {
            let have = example.block_inputs.map_or(0, <[f32]>::len);
            if have < rows.len() * hidden {
                return Err(BatchError(format!(
                    "example {e}: block inputs for {} tokens, {} needed",
                    have / hidden,
                    rows.len()
                )));
            }
        }
        Ok(split)
    }

    /// Block `l` over the rows `x` (consumed): its output, and the activations its backward
    /// pass needs; with the adapters when `adapted`.
    fn block(
        &self,
        l: usize,
        x: Vec<f32>,
        positions: &[usize],
        segments: &[Segment],
        adapted: bool,
    ) -> (Vec<f32>, LayerTape) {
        let s = self.shape();
        let n = positions.len();
        let block = &self.weights.blocks[l];
        let [pq, pk, pv, po, pg, pu, pd] = self.projections(l, adapted);
        let mut lora_inputs: [Vec<f32>; 7] = Default::default();
        let (scale1, normed1) = rms_norm(&x, &block.attention_norm, s.eps);
        let mut q = self.project(&pq, &normed1, n, &mut lora_inputs[0]);
        let mut k = self.project(&pk, &normed1, n, &mut lora_inputs[1]);
        let v = self.project(&pv, &normed1, n, &mut lora_inputs[2]);
        self.rotate(&mut q, positions, s.heads, false);
        self.rotate(&mut k, positions, s.kv_heads, false);
        let (probs, attended) = self.attention(&q, &k, &v, segments);
        let o = self.project(&po, &attended, n, &mut lora_inputs[3]);
        let x2: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let (scale2, normed2) = rms_norm(&x2, &block.ffn_norm, s.eps);
        let gate = self.project(&pg, &normed2, n, &mut lora_inputs[4]);
        let up = self.project(&pu, &normed2, n, &mut lora_inputs[5]);
        let mut activated = negative_exps(&gate, s.ffn);
        activated.par_iter_mut().zip(&gate).zip(&up).for_each(|((a, g), u)| *a = g / (1.0 + *a) * u);
        let down = self.project(&pd, &activated, n, &mut lora_inputs[6]);
        let next: Vec<f32> = x2.iter().zip(&down).map(|(a, b)| a + b).collect();
        debug_assert_eq!(activated.len(), n * s.ffn);
        debug_assert_eq!(k.len(), n * s.kv_width());
        let tape = LayerTape {
            x,
            scale1,
            normed1,
            q,
            k,
            v,
            probs,
            attended,
            x2,
            scale2,
            normed2,
            gate,
            up,
            activated,
            lora_inputs,
        };
        (next, tape)
    }

    /// The final norm and the output projection at the scored rows of `x`: their softmax at
    /// `temperature` and each one's log-probability of its target.
    fn head(&self, x: &[f32], scored_rows: &[usize], scored_targets: &[u32], temperature: f32) -> Head {
        let (hidden, vocabulary) = (self.shape().hidden, self.shape().vocabulary);
        let (final_scale, final_normed) = rms_norm(x, &self.weights.output_norm, self.shape().eps);
        let m = scored_rows.len();
        let mut scored_normed = Vec::with_capacity(m * hidden);
        for &r in scored_rows {
            scored_normed.extend_from_slice(&final_normed[r * hidden..][..hidden]);
        }
        let mut softmax = vec![0.0f32; m * vocabulary];
        let output = self.weights.output_matrix();
        gemm(
            m,
            hidden,
            vocabulary,
            View::rows(&scored_normed, hidden),
            View::transposed(output, hidden),
            0.0,
            Out::rows(&mut softmax, vocabulary),
        );
        let mut logprobs = vec![0.0f32; m];
        softmax.par_chunks_mut(vocabulary).zip(logprobs.par_iter_mut()).zip(scored_targets).for_each(
            |((row, logprob), &target)| {
                row.iter_mut().for_each(|z| *z /= temperature);
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter_mut().for_each(|z| *z -= max);
                let shifted_target = row[target as usize];
                exp_in_place(row);
                let sum: f32 = row.iter().sum();
                *logprob = shifted_target - sum.ln();
                row.iter_mut().for_each(|p| *p /= sum);
            },
        );
        Head { final_scale, scored_normed, softmax, logprobs }
    }

    /// `x·Wᵀ (+ scale·(x·Aᵀ)·Bᵀ)`, keeping `x·Aᵀ` in `lora_input`.
    fn project(&self, p: &Projection<'_>, x: &[f32], n: usize, lora_input: &mut Vec<f32>) -> Vec<f32> {
        let mut y = vec![0.0f32; n * p.outputs];
        gemm(
            n,
            p.inputs,
            p.outputs,
            View::rows(x, p.inputs),
            View::transposed(p.weight, p.inputs),
            0.0,
            Out::rows(&mut y, p.outputs),
        );
        if let Some(lora) = p.lora {
            let rank = lora.a.len() / p.inputs;
            let mut xa = vec![0.0f32; n * rank];
            gemm(
                n,
                p.inputs,
                rank,
                View::rows(x, p.inputs),
                View::transposed(&lora.a, p.inputs),
                0.0,
                Out::rows(&mut xa, rank),
            );
            let scaled: Vec<f32> = xa.iter().map(|v| v * self.scale()).collect();
            gemm(
                n,
                rank,
                p.outputs,
                View::rows(&scaled, rank),
                View::transposed(&lora.b, rank),
                1.0,
                Out::rows(&mut y, p.outputs),
            );
            *lora_input = xa;
        }
        y
    }

    /// Backward of [`Self::project`]: adds `dy·W (+ scale·dy·B·A)` to `dx` (when the input's
    /// gradient is needed) and the weight's (or the adapter's) gradient to `grad`.
    #[allow(clippy::too_many_arguments)]
    fn project_back(
        &self,
        p: &Projection<'_>,
        x: &[f32],
        lora_input: &[f32],
        dy: &[f32],
        n: usize,
        mut dx: Option<&mut [f32]>,
        weight_grad: Option<&mut Vec<f32>>,
        lora_grad: Option<&mut Lora>,
    ) {
        if let Some(dx) = dx.as_deref_mut() {
            gemm(
                n,
                p.outputs,
                p.inputs,
                View::rows(dy, p.outputs),
                View::rows(p.weight, p.inputs),
                1.0,
                Out::rows(dx, p.inputs),
            );
        }
        if let Some(grad) = weight_grad {
            gemm(
                p.outputs,
                n,
                p.inputs,
                View::transposed(dy, p.outputs),
                View::rows(x, p.inputs),
                1.0,
                Out::rows(grad, p.inputs),
            );
        }
        if let (Some(lora), Some(grad)) = (p.lora, lora_grad) {
            let rank = lora.a.len() / p.inputs;
            let scale = self.scale();
            // dB += scale · dyᵀ·(x·Aᵀ); d(x·Aᵀ) = scale · dy·B; dA += d(x·Aᵀ)ᵀ·x; dx += d(x·Aᵀ)·A.
            let scaled: Vec<f32> = lora_input.iter().map(|v| v * scale).collect();
            gemm(
                p.outputs,
                n,
                rank,
                View::transposed(dy, p.outputs),
                View::rows(&scaled, rank),
                1.0,
                Out::rows(&mut grad.b, rank),
            );
            let mut dxa = vec![0.0f32; n * rank];
            gemm(
                n,
                p.outputs,
                rank,
                View::rows(dy, p.outputs),
                View::rows(&lora.b, rank),
                0.0,
                Out::rows(&mut dxa, rank),
            );
            dxa.iter_mut().for_each(|v| *v *= scale);
            gemm(
                rank,
                n,
                p.inputs,
                View::transposed(&dxa, rank),
                View::rows(x, p.inputs),
                1.0,
                Out::rows(&mut grad.a, p.inputs),
            );
            if let Some(dx) = dx {
                gemm(
                    n,
                    rank,
                    p.inputs,
                    View::rows(&dxa, rank),
                    View::rows(&lora.a, p.inputs),
                    1.0,
                    Out::rows(dx, p.inputs),
                );
            }
        }
    }

    /// Rotates the pairs `(2i, 2i+1)` of every head by the row's position (backwards: by minus
    /// that angle, which is the transpose of the rotation).
    fn rotate(&self, x: &mut [f32], positions: &[usize], heads: usize, backwards: bool) {
        let head_dim = self.shape().head_dim;
        let half = head_dim / 2;
        let sign = if backwards { -1.0 } else { 1.0 };
        x.par_chunks_mut(heads * head_dim).zip(positions).for_each(|(row, &position)| {
            let (cos, sin) = (&self.cos[position * half..][..half], &self.sin[position * half..][..half]);
            for head in row.chunks_exact_mut(head_dim) {
                for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (a, b, s) = (pair[0], pair[1], sign * sin[i]);
                    pair[0] = a * cos[i] - b * s;
                    pair[1] = a * s + b * cos[i];
                }
            }
        });
    }

    /// Causal attention within each example (a shared prefix's rows first): the probabilities
    /// (per segment, per head) and the attended values.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], segments: &[Segment]) -> (Vec<f32>, Vec<f32>) {
        let s = self.shape();
        let (hidden, kv_width, head_dim, heads) = (s.hidden, s.kv_width(), s.head_dim, s.heads);
        let group = heads / s.kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let offsets = prob_offsets(segments, heads);
        let mut probs = vec![0.0f32; offsets.last().copied().unwrap_or(0)];
        let mut attended = vec![0.0f32; q.len()];
        let probs_ptr = SharedMut::new(&mut probs);
        let attended_ptr = SharedMut::new(&mut attended);
        let (probs_len, attended_len) = (probs.len(), attended.len());
        let jobs: Vec<(usize, usize)> = (0..segments.len()).flat_map(|e| (0..heads).map(move |h| (e, h))).collect();
        jobs.par_iter().for_each(|&(e, head)| {
            let segment = &segments[e];
            let (start, len, prefix_len, width) = (segment.start, segment.len, segment.prefix_len(), segment.width());
            let kv_offset = (head / group) * head_dim;
            let (mut key_buffer, mut value_buffer) = (Vec::new(), Vec::new());
            let (prefix_keys, key_row, key_at) =
                prefix_head(k, kv_width, kv_offset, head_dim, segment, &mut key_buffer);
            let (prefix_values, value_row, value_at) =
                prefix_head(v, kv_width, kv_offset, head_dim, segment, &mut value_buffer);
            // SAFETY: each job writes its own segment's head block of `probs` and its own
            // (rows, head columns) of `attended`.
            let p = unsafe { std::slice::from_raw_parts_mut(probs_ptr.get(), probs_len) };
            let out = unsafe { std::slice::from_raw_parts_mut(attended_ptr.get(), attended_len) };
            let block = &mut p[offsets[e * heads + head]..][..len * width];
            let queries = View::rows(q, hidden).at(start * hidden + head * head_dim);
            // Scores: the prefix's keys in the first `prefix_len` columns, then the segment's own.
            if prefix_len > 0 {
                gemm_serial(
                    len,
                    head_dim,
                    prefix_len,
                    queries,
                    View::transposed(prefix_keys, key_row).at(key_at),
                    0.0,
                    Out { data: block, offset: 0, row: width },
                );
            }
            causal_gemm(
                Causal::LowerOutput,
                len,
                head_dim,
                queries,
                View::transposed(k, kv_width).at(start * kv_width + kv_offset),
                0.0,
                Out { data: block, offset: prefix_len, row: width },
            );
            for (i, row) in block.chunks_exact_mut(width).enumerate() {
                let visible = &mut row[..=prefix_len + i];
                let max = visible.iter().map(|z| z * scale).fold(f32::NEG_INFINITY, f32::max);
                visible.iter_mut().for_each(|z| *z = *z * scale - max);
                exp_in_place(visible);
                let sum: f32 = visible.iter().sum();
                visible.iter_mut().for_each(|z| *z /= sum);
                row[prefix_len + i + 1..].iter_mut().for_each(|z| *z = 0.0);
            }
            let out_at = start * hidden + head * head_dim;
            if prefix_len > 0 {
                gemm_serial(
                    len,
                    prefix_len,
                    head_dim,
                    View::rows(block, width),
                    View::rows(prefix_values, value_row).at(value_at),
                    0.0,
                    Out { data: out, offset: out_at, row: hidden },
                );
            }
            causal_gemm(
                Causal::LowerFactor,
                len,
                head_dim,
                View::rows(block, width).at(prefix_len),
                View::rows(v, kv_width).at(start * kv_width + kv_offset),
                if prefix_len > 0 { 1.0 } else { 0.0 },
                Out { data: out, offset: out_at, row: hidden },
            );
        });
        (probs, attended)
    }

    /// Adds to `grads` the gradient of `Σ dlogp[e][i] · logprob[e][i]`: the loss's derivative
    /// with respect to each scored log-probability is all a loss needs to give.
    /// The tape is consumed: its buffers become the gradients' scratch space.
    pub fn backward(&self, mut tape: Tape, dlogp: &[Vec<f32>], grads: &mut Grads) -> Result<(), BatchError> {
        let s = self.shape().clone();
        let (hidden, kv_width, vocabulary) = (s.hidden, s.kv_width(), s.vocabulary);
        if dlogp.len() != tape.logprobs.len() || dlogp.iter().zip(&tape.logprobs).any(|(d, l)| d.len() != l.len()) {
            return Err(BatchError("one loss derivative per scored position is needed".into()));
        }
        let n = tape.rows();
        let m = tape.scored_rows.len();
        let coefficients: Vec<f32> = dlogp.iter().flatten().copied().collect();
        // d(logit_j) = dlogp · (1[j = target] − p_j) / temperature.
        let mut dlogits = std::mem::take(&mut tape.softmax);
        dlogits.par_chunks_mut(vocabulary).zip(&coefficients).zip(&tape.scored_targets).for_each(
            |((row, &c), &target)| {
                let c = c / tape.temperature;
                row.iter_mut().for_each(|p| *p *= -c);
                row[target as usize] += c;
            },
        );
        let output = self.weights.output_matrix();
        let mut dscored = vec![0.0f32; m * hidden];
        gemm(
            m,
            vocabulary,
            hidden,
            View::rows(&dlogits, vocabulary),
            View::rows(output, hidden),
            0.0,
            Out::rows(&mut dscored, hidden),
        );
        if let Some(base) = grads.base.as_mut() {
            let target = match base.output.as_mut() {
                Some(output) => output,
                None => &mut base.embedding,
            };
            gemm(
                vocabulary,
                m,
                hidden,
                View::transposed(&dlogits, vocabulary),
                View::rows(&tape.scored_normed, hidden),
                1.0,
                Out::rows(target, hidden),
            );
        }
        drop(dlogits);
        let mut dnormed = vec![0.0f32; n * hidden];
        // A shared row scored for several sequences adds up their gradients.
        for (i, &r) in tape.scored_rows.iter().enumerate() {
            dnormed[r * hidden..][..hidden].iter_mut().zip(&dscored[i * hidden..][..hidden]).for_each(|(d, g)| *d += g);
        }
        let mut dx = vec![0.0f32; n * hidden];
        let output_norm_grad = grads.base.as_mut().map(|b| &mut b.output_norm);
        rms_norm_back(&tape.final_x, &tape.final_scale, &self.weights.output_norm, &dnormed, &mut dx, output_norm_grad);

        for l in (tape.first_layer..s.layers).rev() {
            let t = &tape.layers[l - tape.first_layer];
            let block = &self.weights.blocks[l];
            // Feed-forward: x_next = x2 + down(silu(gate) · up).
            let ffn = s.ffn;
            let mut dactivated = vec![0.0f32; n * ffn];
            self.module_back(l, 6, t, &t.activated, &dx, Some(&mut dactivated), grads);
            let mut dgate = vec![0.0f32; n * ffn];
            let mut dup = vec![0.0f32; n * ffn];
            let exps = negative_exps(&t.gate, ffn);
            dgate.par_iter_mut().zip(dup.par_iter_mut()).enumerate().for_each(|(i, (dg, du))| {
                let (g, u, da) = (t.gate[i], t.up[i], dactivated[i]);
                let sigmoid = 1.0 / (1.0 + exps[i]);
                *du = da * g * sigmoid;
                *dg = da * u * sigmoid * (1.0 + g * (1.0 - sigmoid));
            });
            drop(dactivated);
            let mut dnormed2 = vec![0.0f32; n * hidden];
            self.module_back(l, 4, t, &t.normed2, &dgate, Some(&mut dnormed2), grads);
            self.module_back(l, 5, t, &t.normed2, &dup, Some(&mut dnormed2), grads);
            drop((dgate, dup));
            // dx2 = dx + the norm's backward.
            let mut dx2 = dx;
            let norm_grad = grads.base.as_mut().map(|b| &mut b.blocks[l].ffn_norm);
            rms_norm_back(&t.x2, &t.scale2, &block.ffn_norm, &dnormed2, &mut dx2, norm_grad);
            // Attention: x2 = x + out(attention(rope(q), rope(k), v)).
            let mut dattended = vec![0.0f32; n * hidden];
            self.module_back(l, 3, t, &t.attended, &dx2, Some(&mut dattended), grads);
            let (mut dq, mut dk, dv) = self.attention_back(t, &dattended, &tape.segments);
            self.rotate(&mut dq, &tape.positions, s.heads, true);
            self.rotate(&mut dk, &tape.positions, s.kv_heads, true);
            // The block's input gradient feeds the blocks below and the embedding: in the lowest
            // trained block of LoRA, nothing.
            let mut dnormed1 = (l > tape.first_layer || grads.base.is_some()).then(|| vec![0.0f32; n * hidden]);
            for (m, dy) in [(0, &dq), (1, &dk), (2, &dv)] {
                self.module_back(l, m, t, &t.normed1, dy, dnormed1.as_deref_mut(), grads);
            }
            debug_assert_eq!(dk.len(), n * kv_width);
            dx = dx2;
            let Some(dnormed1) = dnormed1 else { break };
            let norm_grad = grads.base.as_mut().map(|b| &mut b.blocks[l].attention_norm);
            rms_norm_back(&t.x, &t.scale1, &block.attention_norm, &dnormed1, &mut dx, norm_grad);
        }
        if let Some(base) = grads.base.as_mut() {
            for (row, &token) in dx.chunks_exact(hidden).zip(&tape.tokens) {
                let target = &mut base.embedding[token as usize * hidden..][..hidden];
                target.iter_mut().zip(row).for_each(|(g, d)| *g += d);
            }
        }
        Ok(())
    }

    /// Backward of projection `m` (of [`MODULES`]) of block `l`, which was fed `x`: adds to `dx` (if any),
    /// and to the weight's gradient (full fine-tuning) or the adapter's (LoRA) in `grads`.
    #[allow(clippy::too_many_arguments)]
    fn module_back(
        &self,
        l: usize,
        m: usize,
        t: &LayerTape,
        x: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        grads: &mut Grads,
    ) {
        let projection = &self.projections(l, true)[m];
        let rows = dy.len() / projection.outputs;
        let weight_grad = grads.base.as_mut().and_then(|b| b.blocks[l].tensors_mut().into_iter().nth(PROJECTIONS[m]));
        let lora_grad = grads.adapters.as_mut().and_then(|a| a.blocks[l][m].as_mut());
        self.project_back(projection, x, &t.lora_inputs[m], dy, rows, dx, weight_grad, lora_grad);
    }

    /// Gradients of queries, keys and values from the gradient of the attended values.
    fn attention_back(&self, t: &LayerTape, dattended: &[f32], segments: &[Segment]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let s = self.shape();
        let (hidden, kv_width, head_dim, heads) = (s.hidden, s.kv_width(), s.head_dim, s.heads);
        let group = heads / s.kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let offsets = prob_offsets(segments, heads);
        let mut dq = vec![0.0f32; t.q.len()];
        let dq_ptr = SharedMut::new(&mut dq);
        let q_len = dq.len();
        // One job per segment and head (two cores stay busy with nine heads); each head's
        // share of its key/value head's gradients, and of its prefix's, goes to its own
        // block, summed below in job order, so the result does not depend on the schedule.
        let jobs: Vec<(usize, usize)> = (0..segments.len()).flat_map(|e| (0..heads).map(move |h| (e, h))).collect();
        let partials: Vec<[Vec<f32>; 4]> = jobs
            .par_iter()
            .map(|&(e, head)| {
                let segment = &segments[e];
                let (start, len, prefix_len, width) =
                    (segment.start, segment.len, segment.prefix_len(), segment.width());
                let kv_offset = (head / group) * head_dim;
                let probs = &t.probs[offsets[e * heads + head]..][..len * width];
                let q_at = start * hidden + head * head_dim;
                let kv_at = start * kv_width + kv_offset;
                let (mut key_buffer, mut value_buffer) = (Vec::new(), Vec::new());
                let (prefix_keys, key_row, key_at) =
                    prefix_head(&t.k, kv_width, kv_offset, head_dim, segment, &mut key_buffer);
                let (prefix_values, value_row, value_at) =
                    prefix_head(&t.v, kv_width, kv_offset, head_dim, segment, &mut value_buffer);
                let d_out = View::rows(dattended, hidden).at(q_at);
                let zeros = |rows: usize| vec![0.0f32; rows * head_dim];
                let (mut dk, mut dv, mut dk_prefix, mut dv_prefix) =
                    (zeros(len), zeros(len), zeros(prefix_len), zeros(prefix_len));
                // dV = Pᵀ·dO, for the segment's own values and the prefix's.
                let probs_t = View::transposed(probs, width);
                causal_gemm(
                    Causal::UpperFactor,
                    len,
                    head_dim,
                    probs_t.at(prefix_len),
                    d_out,
                    0.0,
                    Out::rows(&mut dv, head_dim),
                );
                gemm_serial(prefix_len, len, head_dim, probs_t, d_out, 0.0, Out::rows(&mut dv_prefix, head_dim));
                // dP = dO·Vᵀ, then dS = P ∘ (dP − rowsum(dP ∘ P)), times the score scale.
                let mut dscores = vec![0.0f32; len * width];
                let values_t = View::transposed(&t.v, kv_width);
                gemm_serial(
                    len,
                    head_dim,
                    prefix_len,
                    d_out,
                    View::transposed(prefix_values, value_row).at(value_at),
                    0.0,
                    Out { data: &mut dscores, offset: 0, row: width },
                );
                causal_gemm(
                    Causal::LowerOutput,
                    len,
                    head_dim,
                    d_out,
                    values_t.at(kv_at),
                    0.0,
                    Out { data: &mut dscores, offset: prefix_len, row: width },
                );
                for (i, (drow, prow)) in dscores.chunks_exact_mut(width).zip(probs.chunks_exact(width)).enumerate() {
                    let visible = prefix_len + i + 1;
                    let dot: f32 = drow[..visible].iter().zip(&prow[..visible]).map(|(d, p)| d * p).sum();
                    for (d, p) in drow[..visible].iter_mut().zip(&prow[..visible]) {
                        *d = p * (*d - dot) * scale;
                    }
                    drow[visible..].iter_mut().for_each(|d| *d = 0.0);
                }
                // dQ = dS·K (this head's own columns); dK = dSᵀ·Q.
                // SAFETY: each job writes its own segment's rows of its own head's columns.
                let dq = unsafe { std::slice::from_raw_parts_mut(dq_ptr.get(), q_len) };
                let keys = View::rows(&t.k, kv_width);
                if prefix_len > 0 {
                    gemm_serial(
                        len,
                        prefix_len,
                        head_dim,
                        View::rows(&dscores, width),
                        View::rows(prefix_keys, key_row).at(key_at),
                        0.0,
                        Out { data: dq, offset: q_at, row: hidden },
                    );
                }
                causal_gemm(
                    Causal::LowerFactor,
                    len,
                    head_dim,
                    View::rows(&dscores, width).at(prefix_len),
                    keys.at(kv_at),
                    if prefix_len > 0 { 1.0 } else { 0.0 },
                    Out { data: dq, offset: q_at, row: hidden },
                );
                let (dscores_t, queries) = (View::transposed(&dscores, width), View::rows(&t.q, hidden).at(q_at));
                causal_gemm(
                    Causal::UpperFactor,
                    len,
                    head_dim,
                    dscores_t.at(prefix_len),
                    queries,
                    0.0,
                    Out::rows(&mut dk, head_dim),
                );
                gemm_serial(prefix_len, len, head_dim, dscores_t, queries, 0.0, Out::rows(&mut dk_prefix, head_dim));
                [dk, dv, dk_prefix, dv_prefix]
            })
            .collect();
        let mut dk = vec![0.0f32; t.k.len()];
        let mut dv = vec![0.0f32; t.v.len()];
        for (&(e, head), [pk, pv, pk_prefix, pv_prefix]) in jobs.iter().zip(&partials) {
            let segment = &segments[e];
            let kv_offset = (head / group) * head_dim;
            let mut add = |rows: &mut dyn Iterator<Item = usize>, k_rows: &[f32], v_rows: &[f32]| {
                for (row, (k, v)) in rows.zip(k_rows.chunks_exact(head_dim).zip(v_rows.chunks_exact(head_dim))) {
                    let at = row * kv_width + kv_offset;
                    dk[at..at + head_dim].iter_mut().zip(k).for_each(|(d, x)| *d += x);
                    dv[at..at + head_dim].iter_mut().zip(v).for_each(|(d, x)| *d += x);
                }
            };
            add(&mut (segment.start..segment.start + segment.len), pk, pv);
            add(&mut segment.prefix_rows(), pk_prefix, pv_prefix);
        }
        (dq, dk, dv)
    }
}

/// One key/value head's columns of a segment's prefix rows in `x` (the layer's keys or values,
/// rows `kv_width` apart), as `(data, row stride, offset)` of a row-major matrix: the layer's own
/// rows when the prefix is one run of rows, else a copy gathered into `buffer` (a path through
/// the prefix tree is several runs; each job gathers its own head's columns, a small copy beside
/// the products that read it).
fn prefix_head<'a>(
    x: &'a [f32],
    kv_width: usize,
    kv_offset: usize,
    head_dim: usize,
    segment: &Segment,
    buffer: &'a mut Vec<f32>,
) -> (&'a [f32], usize, usize) {
    if let [run] = segment.prefix.as_slice() {
        return (x, kv_width, run.start * kv_width + kv_offset);
    }
    for row in segment.prefix_rows() {
        buffer.extend_from_slice(&x[row * kv_width + kv_offset..][..head_dim]);
    }
    (buffer.as_slice(), head_dim, 0)
}

/// Rows per block of a segment's attention to itself. Each block's products stop at the last
/// key its last row may see, so about half of the masked upper triangle is never computed
/// (smaller blocks skip more of it, but matrixmultiply runs short products less well). The
/// unit tests' sequences are a few tokens long: there, blocks of 3 put every product through
/// several blocks.
const CAUSAL_BLOCK: usize = if cfg!(test) { 3 } else { 32 };

/// Where a product with a segment's `len × len` causal attention matrix has its zeros.
#[derive(Clone, Copy)]
enum Causal {
    /// `C (len × len) ← A (len × inner) · B (inner × len)`, wanted on and below the diagonal
    /// (the scores).
    LowerOutput,
    /// `C (len × inner) ← L · B` with `L` zero above the diagonal (probabilities times values).
    LowerFactor,
    /// `C (len × inner) ← U · B` with `U` zero below the diagonal: a lower-triangular matrix
    /// read transposed (the gradients of keys and values).
    UpperFactor,
}

/// `C ← (the product `kind` names) + β·C`, by blocks of [`CAUSAL_BLOCK`] rows of C, each over
/// only the columns or inner indices its block can have non-zeros in.
fn causal_gemm(kind: Causal, len: usize, inner: usize, a: View<'_>, b: View<'_>, beta: f32, c: Out<'_>) {
    for r in (0..len).step_by(CAUSAL_BLOCK) {
        let rows = (r + CAUSAL_BLOCK).min(len) - r;
        let out = Out { data: &mut *c.data, offset: c.offset + r * c.row, row: c.row };
        match kind {
            Causal::LowerOutput => gemm_serial(rows, inner, r + rows, a.at(r * a.row), b, beta, out),
            Causal::LowerFactor => gemm_serial(rows, r + rows, inner, a.at(r * a.row), b, beta, out),
            Causal::UpperFactor => {
                gemm_serial(rows, len - r, inner, a.at(r * (a.row + a.col)), b.at(r * b.row), beta, out)
            }
        }
    }
}

/// `e^(−g)` of every gate value, a row of `width` at a time: the SiLU's exponentials, by the
/// serving pass's vectorised `exp` (the C library's runs one value at a time).
fn negative_exps(gate: &[f32], width: usize) -> Vec<f32> {
    let mut exps: Vec<f32> = gate.par_iter().map(|g| -g).collect();
    exps.par_chunks_mut(width).for_each(exp_in_place);
    exps
}

/// Each row's `1/rms` and the normed rows times `weight`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let width = weight.len();
    let mut out = vec![0.0f32; x.len()];
    let mut scales = vec![0.0f32; x.len() / width];
    out.par_chunks_mut(width).zip(x.par_chunks(width)).zip(scales.par_iter_mut()).for_each(|((out, row), scale)| {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        *scale = 1.0 / (mean_square + eps).sqrt();
        out.iter_mut().zip(row.iter().zip(weight)).for_each(|(o, (v, w))| *o = v * *scale * w);
    });
    (scales, out)
}

/// Adds the input gradient of [`rms_norm`] to `dx` and, when asked, the weight's to `dweight`.
fn rms_norm_back(
    x: &[f32],
    scales: &[f32],
    weight: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dweight: Option<&mut Vec<f32>>,
) {
    let width = weight.len();
    dx.par_chunks_mut(width).zip(x.par_chunks(width)).zip(dy.par_chunks(width)).zip(scales).for_each(
        |(((dx, x), dy), &s)| {
            // y = x·s·w with s = (mean(x²) + eps)^(-1/2): dx = s·w·dy − x·s³/width · Σ dy·w·x.
            let dot: f32 = dy.iter().zip(weight).zip(x).map(|((d, w), v)| d * w * v).sum();
            let k = s * s * s * dot / width as f32;
            for ((g, (d, w)), v) in dx.iter_mut().zip(dy.iter().zip(weight)).zip(x) {
                *g += s * w * d - v * k;
            }
        },
    );
    if let Some(dweight) = dweight {
        for ((x, dy), &s) in x.chunks_exact(width).zip(dy.chunks_exact(width)).zip(scales) {
            for ((g, d), v) in dweight.iter_mut().zip(dy).zip(x) {
                *g += d * v * s;
            }
        }
    }
}

fn zeros_like(weights: &LlamaWeights) -> LlamaWeights {
    let zero = |v: &Vec<f32>| vec![0.0f32; v.len()];
    LlamaWeights {
        shape: weights.shape.clone(),
        embedding: zero(&weights.embedding),
        blocks: weights
            .blocks
            .iter()
            .map(|b| BlockWeights::try_from_fn::<()>(|t| Ok(zero(b.tensors()[t]))).expect("infallible"))
            .collect(),
        output_norm: zero(&weights.output_norm),
        output: weights.output.as_ref().map(zero),
    }
}
