use super::*;
use crate::weights::testing::{random, tiny_shape};

/// Two examples packed in one micro-batch, scored at some positions each.
const TOKENS_A: [u32; 7] = [1, 5, 9, 3, 3, 14, 2];
const TOKENS_B: [u32; 5] = [4, 0, 11, 7, 15];
const POSITIONS_A: [usize; 4] = [1, 3, 4, 6];
const POSITIONS_B: [usize; 3] = [2, 3, 4];
/// The loss's derivative per scored log-probability: any numbers will do.
const COEFFICIENTS: [f32; 7] = [0.7, -1.3, 0.4, 1.1, -0.2, 0.9, -0.6];

fn examples() -> [Example<'static>; 2] {
    [
        Example { tokens: &TOKENS_A, positions: &POSITIONS_A, block_inputs: None },
        Example { tokens: &TOKENS_B, positions: &POSITIONS_B, block_inputs: None },
    ]
}

fn loss(model: &TrainModel) -> f64 {
    let tape = model.forward(&examples(), 0.7).unwrap();
    tape.logprobs.iter().flatten().zip(COEFFICIENTS).map(|(&l, c)| f64::from(l) * f64::from(c)).sum()
}

fn gradient(model: &TrainModel) -> Grads {
    let tape = model.forward(&examples(), 0.7).unwrap();
    let dlogp = vec![COEFFICIENTS[..4].to_vec(), COEFFICIENTS[4..].to_vec()];
    let mut grads = model.zero_grads();
    model.backward(tape, &dlogp, &mut grads).unwrap();
    grads
}

/// Compares each tensor's gradient with central finite differences along the gradient's own
/// direction on a few coordinates.
fn check_gradients(model: &mut TrainModel, names: &[&str]) {
    let grads = gradient(model);
    let analytic: Vec<Vec<f32>> = grads.tensors().into_iter().cloned().collect();
    assert_eq!(analytic.len(), names.len(), "one name per trained tensor");
    for (t, grad) in analytic.iter().enumerate() {
        let norm: f64 = grad.iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>().sqrt();
        assert!(norm > 1e-6, "{}: the gradient is zero", names[t]);
        // Along the gradient direction: the derivative there is the gradient's norm.
        let h = 1e-2 / norm.max(1.0);
        let shift = |model: &mut TrainModel, sign: f64| {
            let tensor = &mut model.trained_mut()[t];
            tensor.iter_mut().zip(grad).for_each(|(w, g)| *w += (sign * h * f64::from(*g)) as f32);
        };
        shift(model, 1.0);
        let plus = loss(model);
        shift(model, -2.0);
        let minus = loss(model);
        shift(model, 1.0);
        let numeric = (plus - minus) / (2.0 * h);
        let expected = norm * norm;
        assert!(
            (numeric - expected).abs() <= 2e-3 * expected + 1e-6,
            "{}: finite differences give {numeric}, the backward pass {expected}",
            names[t]
        );
    }
}

fn weight_names(blocks: usize, untied: bool) -> Vec<String> {
    let mut names = vec!["embedding".to_string(), "output_norm".to_string()];
    if untied {
        names.push("output".into());
    }
    for b in 0..blocks {
        for part in ["attention_norm", "query", "key", "value", "attention_out", "ffn_norm", "gate", "up", "down"] {
            names.push(format!("block {b} {part}"));
        }
    }
    names
}

#[test]
fn every_weight_gradient_matches_finite_differences() {
    for tied in [true, false] {
        let mut model = TrainModel::new(random(tiny_shape(), tied, 7));
        let names = weight_names(2, !tied);
        check_gradients(&mut model, &names.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// Non-zero B everywhere, so that every adapter changes the model and its A has a gradient.
fn with_nonzero_b(mut adapters: Adapters) -> Adapters {
    for lora in adapters.blocks.iter_mut().flatten().flatten() {
        lora.b.iter_mut().enumerate().for_each(|(i, b)| *b = ((i % 5) as f32 - 2.0) * 0.1);
    }
    adapters
}

#[test]
fn every_adapter_gradient_matches_finite_differences() {
    let weights = random(tiny_shape(), true, 8);
    // B starts at zero (so the adapted model is the base model); make it non-zero to check A.
    let adapters = with_nonzero_b(new_adapters(&weights, &LoraMethod::everywhere(2, 4.0), 9));
    let mut model = TrainModel::new(weights);
    model.adapters = Some(adapters);
    let names: Vec<String> =
        (0..2).flat_map(|b| MODULES.iter().flat_map(move |m| [format!("{b} {m} A"), format!("{b} {m} B")])).collect();
    check_gradients(&mut model, &names.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn adapters_on_the_top_blocks_only_stop_the_backward_pass_there() {
    let weights = random(tiny_shape(), true, 8);
    let top = LoraMethod { top_layers: Some(1), ..LoraMethod::everywhere(2, 4.0) };
    let adapters = with_nonzero_b(new_adapters(&weights, &top, 9));
    assert!(adapters.blocks[0].iter().all(Option::is_none), "the lower block is adapted");
    assert!(adapters.blocks[1].iter().all(Option::is_some), "the top block is not adapted");
    let mut model = TrainModel::new(weights.clone());
    model.adapters = Some(adapters.clone());
    // Beside adapters on every block whose lower ones change nothing (B = 0), the top block's
    // gradients are the same numbers: the shorter backward pass drops no term.
    let mut everywhere = new_adapters(&weights, &LoraMethod::everywhere(2, 4.0), 9);
    everywhere.blocks[1] = adapters.blocks[1].clone();
    let mut full_depth = TrainModel::new(weights);
    full_depth.adapters = Some(everywhere);
    assert_eq!(
        model.forward(&examples(), 0.7).unwrap().logprobs,
        full_depth.forward(&examples(), 0.7).unwrap().logprobs
    );
    let (short, long) = (gradient(&model), gradient(&full_depth));
    let top_block = |grads: &Grads| grads.adapters.as_ref().unwrap().blocks[1].clone();
    assert_eq!(top_block(&short), top_block(&long));
    let names: Vec<String> = MODULES.iter().flat_map(|m| [format!("1 {m} A"), format!("1 {m} B")]).collect();
    check_gradients(&mut model, &names.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn merged_adapters_give_the_adapted_log_probabilities() {
    let weights = random(tiny_shape(), true, 8);
    let mut adapters = new_adapters(
        &weights,
        &LoraMethod { targets: vec!["q_proj".into(), "down_proj".into()], ..LoraMethod::everywhere(2, 4.0) },
        9,
    );
    for lora in adapters.blocks.iter_mut().flatten().flatten() {
        lora.b.iter_mut().enumerate().for_each(|(i, b)| *b = ((i % 3) as f32 - 1.0) * 0.2);
    }
    let mut model = TrainModel::new(weights);
    model.adapters = Some(adapters);
    let adapted = model.forward(&examples(), 1.0).unwrap().logprobs;
    let merged = TrainModel::new(model.serving_weights().into_owned()).forward(&examples(), 1.0).unwrap().logprobs;
    let base = TrainModel::new(model.weights.clone()).forward(&examples(), 1.0).unwrap().logprobs;
    let gap = |a: &Vec<Vec<f32>>, b: &Vec<Vec<f32>>| {
        a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
    };
    assert!(gap(&adapted, &merged) < 1e-4, "merged weights differ by {}", gap(&adapted, &merged));
    assert!(gap(&adapted, &base) > 1e-3, "the adapters changed nothing");
}

#[test]
fn the_reference_is_the_base_model_and_shares_the_blocks_below_the_adapters() {
    let weights = random(tiny_shape(), true, 8);
    let base = TrainModel::new(weights.clone()).score(&examples(), 0.7).unwrap();
    for top_layers in [Some(1), None] {
        let method = LoraMethod { top_layers, ..LoraMethod::everywhere(2, 4.0) };
        let mut model = TrainModel::new(weights.clone());
        model.adapters = Some(with_nonzero_b(new_adapters(&weights, &method, 9)));
        let tape = model.forward_with_reference(&examples(), 0.7).unwrap();
        assert_eq!(tape.reference.as_ref(), Some(&base), "top {top_layers:?}: the reference is not the base model");
        assert_ne!(tape.logprobs, base, "the adapters changed nothing");
        let scored = model.score_with_reference(&examples(), 0.7).unwrap();
        assert_eq!((&scored.policy, &scored.reference), (&tape.logprobs, &base));
        // The policy's tape is the one a forward pass without the reference keeps.
        let dlogp = vec![COEFFICIENTS[..4].to_vec(), COEFFICIENTS[4..].to_vec()];
        let mut grads = model.zero_grads();
        model.backward(tape, &dlogp, &mut grads).unwrap();
        assert_eq!(grads.tensors(), gradient(&model).tensors());
    }
}

#[test]
fn adapting_anew_merges_the_trained_adapters_into_the_base_and_serves_the_same_weights() {
    let weights = random(tiny_shape(), true, 8);
    let mut trainer = Trainer::new(TrainModel::new(weights.clone()), 64);
    trainer.model.adapters = Some(with_nonzero_b(new_adapters(&weights, &LoraMethod::everywhere(2, 4.0), 9)));
    trainer.reset_optimizer();
    let served = trainer.model.serving_weights().into_owned();
    let policy = TrainModel::new(served.clone()).score(&examples(), 0.7).unwrap();
    let trained = trainer.model.adapters.clone();
    let top = LoraMethod { top_layers: Some(1), ..LoraMethod::everywhere(2, 4.0) };
    trainer.adapt_anew(&top);
    let model = &trainer.model;
    // The warm start's adapters are kept and are in the base now; the fresh ones change
    // nothing yet (B = 0): the same weights are served, bit for bit.
    assert_eq!(model.merged, trained);
    assert_eq!(model.weights, served);
    assert_eq!(*model.serving_weights(), served);
    assert_eq!(model.score(&examples(), 0.7).unwrap(), policy);
    // The base is LoRA's reference: the policy as it was before the switch.
    assert_eq!(model.score_with_reference(&examples(), 0.7).unwrap().reference, policy);
    let fresh = model.adapters.as_ref().unwrap();
    assert!(fresh.blocks[0].iter().all(Option::is_none) && fresh.blocks[1].iter().all(Option::is_some));
    let lengths: Vec<usize> = model.trained().iter().map(|t| t.len()).collect();
    assert_eq!(trainer.adam.m.iter().map(Vec::len).collect::<Vec<_>>(), lengths, "moments for the fresh adapters");
    // Once only: a second switch keeps the adapters being trained.
    let before = trainer.model.adapters.clone();
    trainer.adapt_anew(&LoraMethod::everywhere(2, 4.0));
    assert_eq!(trainer.model.adapters, before);
}

fn batch() -> Vec<TrainSequence> {
    (0..5)
        .map(|i| {
            let tokens: Vec<u32> = (0..6 + i).map(|t| ((t * 7 + i * 3) % 16) as u32).collect();
            let mask = (0..tokens.len()).map(|t| u8::from(t >= 3)).collect();
            TrainSequence::new(tokens, mask)
        })
        .collect()
}

#[test]
fn a_step_is_deterministic_whatever_the_thread_count() {
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut trainer = Trainer::new(TrainModel::new(random(tiny_shape(), true, 1)), 16);
            for _ in 0..2 {
                trainer.supervised_step(&batch(), &OptimizerConfig::adamw(1e-2), 1).unwrap();
            }
            trainer.model.weights
        })
    };
    let one = run(1);
    assert_eq!(run(2), one, "two threads changed the weights");
    assert_eq!(run(1), one, "the same step gave other weights");
    assert_ne!(one, random(tiny_shape(), true, 1), "the step changed nothing");
}

#[test]
fn micro_batches_bound_the_tokens_and_accumulate_the_same_gradient() {
    let norm_with = |budget: usize| {
        let mut trainer = Trainer::new(TrainModel::new(random(tiny_shape(), true, 1)), budget);
        trainer.supervised_step(&batch(), &OptimizerConfig::adamw(1e-2), 1).unwrap()
    };
    let (whole, pieces) = (norm_with(1000), norm_with(8));
    assert_eq!(whole.micro_batches.len(), 1);
    assert_eq!(pieces.micro_batches.len(), 5);
    assert!((whole.grad_norm - pieces.grad_norm).abs() < 1e-5 * whole.grad_norm, "{whole:?} vs {pieces:?}");
    let loss = |r: &StepReport| r.micro_batches.iter().map(|m| m.loss).sum::<f64>();
    assert!((loss(&whole) - loss(&pieces)).abs() < 1e-5);
}

#[test]
fn supervised_steps_lower_the_loss_and_clipping_bounds_the_step() {
    let mut trainer = Trainer::new(TrainModel::new(random(tiny_shape(), true, 2)), 64);
    let loss = |r: &StepReport| r.micro_batches.iter().map(|m| m.loss).sum::<f64>();
    let first = trainer.supervised_step(&batch(), &OptimizerConfig::adamw(3e-2), 1).unwrap();
    let mut last = first.clone();
    for _ in 0..30 {
        last = trainer.supervised_step(&batch(), &OptimizerConfig::adamw(3e-2), 1).unwrap();
    }
    assert!(loss(&last) < 0.5 * loss(&first), "loss {} → {}", loss(&first), loss(&last));
    // A tiny clip norm scales the whole gradient down: Adam's first step is still ±lr.
    let before = trainer.model.weights.clone();
    let config = OptimizerConfig { clip_norm: 1e-9, ..OptimizerConfig::adamw(1e-3) };
    trainer.supervised_step(&batch(), &config, 1).unwrap();
    let moved =
        before.embedding.iter().zip(&trainer.model.weights.embedding).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(moved < 2e-2, "moved {moved}");
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let model = TrainModel::new(random(tiny_shape(), true, 2));
    let error = |tokens: &[u32], positions: &[usize]| {
        model
            .forward(&[Example { tokens, positions, block_inputs: None }], 1.0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(error(&[1, 99], &[1]).contains("token id 99"));
    assert!(error(&[1, 2, 3], &[0]).contains("position 0"));
    assert!(error(&[1, 2, 3], &[2, 1]).contains("position 1"));
    assert!(error(&vec![1; 65], &[1]).contains("context"));
}

#[test]
fn a_hugging_face_round_trip_keeps_every_log_probability() {
    let weights = random(tiny_shape(), false, 4);
    let dir = tempfile::tempdir().unwrap();
    weights.save_hf(dir.path(), None, Some(2)).unwrap();
    let back = crate::weights::LlamaWeights::load_hf(dir.path()).unwrap();
    let logprobs = |w| TrainModel::new(w).forward(&examples(), 1.0).unwrap().logprobs;
    assert_eq!(logprobs(back), logprobs(weights));
}

/// A GRPO group's shape: six rollouts of one prompt, scored on their responses, of which
/// three share a first turn (nine tokens, scored) and two another (seventeen), then an
/// unrelated sequence. The second shared turn's rows are not next to the prompt's, so its
/// rollouts attend to two runs of rows before their own.
fn group_of_rollouts() -> Vec<TrainSequence> {
    let prompt: Vec<u32> = (0..packing::MIN_SAVED as u32 + 6).map(|t| (t * 5 + 1) % 16).collect();
    let first_a: Vec<u32> = (0..9).map(|t| (t * 7 + 3) % 16).collect();
    let first_b: Vec<u32> = (0..17).map(|t| (t * 5 + 2) % 16).collect();
    let continuations: [(&[u32], &[u32]); 6] = [
        (&first_a, &[1, 2, 3]),
        (&first_a, &[4, 5]),
        (&first_a, &[6, 7, 8, 9]),
        (&[], &[10, 11, 12]),
        (&first_b, &[13, 14]),
        (&first_b, &[15, 0, 1]),
    ];
    let mut sequences: Vec<TrainSequence> = continuations
        .iter()
        .map(|(turn, rest)| {
            let tokens: Vec<u32> = [prompt.as_slice(), turn, rest].concat();
            let mask = (0..tokens.len()).map(|t| u8::from(t >= prompt.len())).collect();
            TrainSequence::new(tokens, mask)
        })
        .collect();
    let tokens: Vec<u32> = (0..9).map(|t| (t * 11 + 2) % 16).collect();
    let mask = vec![1; tokens.len()];
    sequences.push(TrainSequence::new(tokens, mask));
    sequences
}

#[test]
fn shared_rows_run_once_and_give_the_gradient_of_separate_sequences() {
    for lora in [false, true] {
        let weights = random(tiny_shape(), true, 11);
        let mut model = TrainModel::new(weights.clone());
        if lora {
            model.adapters = Some(with_nonzero_b(new_adapters(&weights, &LoraMethod::everywhere(2, 4.0), 3)));
        }
        let sequences = group_of_rollouts();
        let positions: Vec<Vec<usize>> = sequences.iter().map(TrainSequence::positions).collect();
        let examples: Vec<Example<'_>> = sequences
            .iter()
            .zip(&positions)
            .map(|(s, p)| Example { tokens: &s.tokens, positions: p, block_inputs: None })
            .collect();
        let dlogp: Vec<Vec<f32>> = positions
            .iter()
            .enumerate()
            .map(|(e, p)| (0..p.len()).map(|i| ((e * 3 + i) % 7) as f32 * 0.3 - 0.9).collect())
            .collect();
        // Together: the prompt (22 rows) and the two shared turns (9, 17) once, then each
        // sequence's own rows but its last token's (it predicts nothing).
        let tape = model.forward(&examples, 0.8).unwrap();
        assert_eq!(tape.rows(), 22 + 9 + (2 + 1 + 3) + 2 + 17 + (1 + 2) + 8);
        let together = tape.logprobs.clone();
        let mut shared = model.zero_grads();
        model.backward(tape, &dlogp, &mut shared).unwrap();
        // Apart: one forward and backward per sequence, accumulated.
        let mut apart = model.zero_grads();
        let mut separate = Vec::new();
        for (example, d) in examples.iter().zip(&dlogp) {
            let tape = model.forward(std::slice::from_ref(example), 0.8).unwrap();
            separate.extend(tape.logprobs.clone());
            model.backward(tape, std::slice::from_ref(d), &mut apart).unwrap();
        }
        let gap =
            together.iter().flatten().zip(separate.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(gap < 1e-5, "log-probabilities differ by {gap}");
        for (t, (a, b)) in shared.tensors().iter().zip(apart.tensors()).enumerate() {
            let norm = b.iter().map(|v| v * v).sum::<f32>().sqrt();
            let diff = a.iter().zip(b.iter()).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt();
            assert!(norm > 0.0, "tensor {t}: no gradient");
            assert!(
                diff <= 1e-5 * norm.max(1.0),
                "tensor {t} (lora: {lora}): gradients differ by {diff} (norm {norm})"
            );
        }
    }
}

#[test]
fn scoring_without_a_tape_gives_the_forward_pass_log_probabilities() {
    let model = TrainModel::new(random(tiny_shape(), true, 12));
    let sequences = group_of_rollouts();
    let positions: Vec<Vec<usize>> = sequences.iter().map(TrainSequence::positions).collect();
    let examples: Vec<Example<'_>> = sequences
        .iter()
        .zip(&positions)
        .map(|(s, p)| Example { tokens: &s.tokens, positions: p, block_inputs: None })
        .collect();
    let scored = model.score(&examples, 0.8).unwrap();
    assert_eq!(scored, model.forward(&examples, 0.8).unwrap().logprobs);
    assert_eq!(scored.iter().map(Vec::len).collect::<Vec<_>>(), positions.iter().map(Vec::len).collect::<Vec<_>>());
}

#[test]
fn rows_after_the_last_scored_token_are_not_run() {
    let sequence = |tail: &[u32]| {
        let mut tokens = vec![3, 1, 4, 1, 5, 9, 2];
        let mut mask = vec![0, 0, 1, 1, 1, 0, 1];
        tokens.extend(tail);
        mask.extend(vec![0; tail.len()]);
        TrainSequence::new(tokens, mask)
    };
    let (bare, tailed) = (vec![sequence(&[])], vec![sequence(&[6, 5, 3, 5])]);
    let model = TrainModel::new(random(tiny_shape(), true, 13));
    assert_eq!(logprobs(&model, &tailed, 1.0, 64).unwrap(), logprobs(&model, &bare, 1.0, 64).unwrap());
    let step = |batch: &[TrainSequence]| {
        let mut trainer = Trainer::new(TrainModel::new(random(tiny_shape(), true, 13)), 64);
        let report = trainer.supervised_step(batch, &OptimizerConfig::adamw(1e-2), 1).unwrap();
        (report.micro_batches[0].tokens, trainer.model.weights)
    };
    let (rows, weights) = step(&tailed);
    assert_eq!(rows, 6, "the last scored token and the four passage tokens after it are not rows");
    assert_eq!(weights, step(&bare).1);
}
