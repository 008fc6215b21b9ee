//! Tests with the real SmolLM2-135M GGUF (fetched into the model cache on first use).

use super::llama::{Chunk, KvCache};
use super::*;
use crate::policy::testing::{smollm2_candle, smollm2_gguf};
use crate::policy::{FinishReason, Sampling};

fn load_weights() -> (LlamaWeights, Tokenizer) {
    let path = smollm2_gguf();
    let mut file = File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let weights = LlamaWeights::from_gguf(&content, &mut file).unwrap();
    (weights, tokenizer::from_gguf(&content).unwrap().0)
}

fn load_model(precision: Precision, kv_cache_dtype: KvCacheDtype) -> (LlamaModel, Tokenizer) {
    let (weights, tokenizer) = load_weights();
    (LlamaModel::new(&weights, precision, kv_cache_dtype), tokenizer)
}

const PROMPT: &str = "<|im_start|>user\nWho wrote the novel Dracula, and when?<|im_end|>\n<|im_start|>assistant\n";

fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, false).unwrap().get_ids().to_vec()
}

fn feed(model: &LlamaModel, cache: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    model.forward(&mut [Chunk { cache, tokens }]).unwrap().remove(0)
}

/// The property the KV cache reuse and batching rest on: logits do not depend on how the
/// tokens before were chunked, on a cached prefix, or on other sequences in the batch.
/// With either precision, and either KV cache type.
#[test]
fn logits_are_bit_identical_however_the_context_is_chunked_or_batched() {
    for numerics in [
        (Precision::F32, KvCacheDtype::F32),
        (Precision::Int8, KvCacheDtype::F32),
        (Precision::Int8, KvCacheDtype::F16),
    ] {
        logits_do_not_depend_on_chunks_or_batches(numerics);
    }
}

fn logits_do_not_depend_on_chunks_or_batches(numerics: (Precision, KvCacheDtype)) {
    let (model, tokenizer) = load_model(numerics.0, numerics.1);
    let prompt = ids(&tokenizer, PROMPT);
    let whole = feed(&model, &mut KvCache::default(), &prompt);

    let mut cache = KvCache::default();
    feed(&model, &mut cache, &prompt[..7]);
    for &token in &prompt[7..prompt.len() - 3] {
        feed(&model, &mut cache, &[token]);
    }
    let chunked = feed(&model, &mut cache, &prompt[prompt.len() - 3..]);
    assert_eq!(chunked, whole, "chunked prefill and decoding changed the logits ({numerics:?})");

    let mut prefix = cache.prefix(5);
    assert_eq!(prefix.len(), 5);
    assert_eq!(feed(&model, &mut prefix, &prompt[5..]), whole, "a cached prefix changed the logits ({numerics:?})");

    let other = ids(&tokenizer, "<|im_start|>user\nName a river in Spain.<|im_end|>\n");
    let (mut a, mut b) = (KvCache::default(), KvCache::default());
    let batched = model
        .forward(&mut [Chunk { cache: &mut a, tokens: &other }, Chunk { cache: &mut b, tokens: &prompt }])
        .unwrap();
    assert_eq!(batched[1], whole, "batching with another sequence changed the logits ({numerics:?})");
    assert_eq!(batched[0], feed(&model, &mut KvCache::default(), &other));
}

/// Int8 weights and an F16 KV cache move log-probabilities a little, not the ranking: after a
/// prompt and thirty generated tokens, the next token's log-probabilities under each against
/// F32's.
#[test]
fn int8_weights_and_an_f16_kv_cache_keep_log_probabilities_close_to_f32() {
    let (weights, tokenizer) = load_weights();
    let mut tokens = ids(&tokenizer, PROMPT);
    let f32_model = LlamaModel::new(&weights, Precision::F32, KvCacheDtype::F32);
    let mut cache = KvCache::default();
    let mut logits = feed(&f32_model, &mut cache, &tokens);
    for _ in 0..30 {
        let next = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        tokens.push(next);
        logits = feed(&f32_model, &mut cache, &[next]);
    }
    let log_softmax = |v: &[f32]| {
        let max = v.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
        let total = v.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
        v.iter().map(|x| x - max - total).collect::<Vec<f32>>()
    };
    let exact = log_softmax(&logits);
    let mut order: Vec<usize> = (0..exact.len()).collect();
    order.sort_by(|a, b| exact[*b].total_cmp(&exact[*a]));
    // The bounds: a little over the gaps measured (int8 0.2, F16 KV cache 0.0012).
    for (numerics, bound) in
        [((Precision::Int8, KvCacheDtype::F32), 0.25), ((Precision::F32, KvCacheDtype::F16), 0.0015)]
    {
        let model = LlamaModel::new(&weights, numerics.0, numerics.1);
        let other = log_softmax(&feed(&model, &mut KvCache::default(), &tokens));
        let gaps: Vec<f32> = order[..10].iter().map(|&t| (exact[t] - other[t]).abs()).collect();
        eprintln!("{numerics:?} against F32, top-10 log-probability gaps {gaps:?}");
        let top = other.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_eq!(top, order[0], "the most likely token ({numerics:?})");
        assert!(gaps.iter().all(|gap| *gap < bound), "log-probabilities moved by {gaps:?} ({numerics:?})");
    }
}

/// The forward pass against candle-transformers' quantized llama on the file's own weights.
/// candle rounds every activation row to 8 bits before each projection (its quantized dot
/// product), this pass keeps F32: logits agree to a few percent of their range, not to f32
/// precision (measured: 2.3 % at most, 0.5 % on average, after thirty tokens), and the
/// ranking agrees.
#[test]
fn the_forward_pass_agrees_with_candle_quantized_llama() {
    use candle_transformers::models::quantized_llama::ModelWeights;

    let (model, tokenizer) = load_model(Precision::F32, KvCacheDtype::F32);
    let prompt = ids(&tokenizer, PROMPT);
    let ours = feed(&model, &mut KvCache::default(), &prompt);

    let path = smollm2_gguf();
    let mut file = File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut reference = ModelWeights::from_gguf(content, &mut file, &candle_core::Device::Cpu).unwrap();
    let input = candle_core::Tensor::new(prompt.as_slice(), &candle_core::Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let theirs: Vec<f32> = reference.forward(&input, 0).unwrap().squeeze(0).unwrap().to_vec1().unwrap();

    let scale = theirs.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    let largest = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let mean = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).sum::<f32>() / ours.len() as f32;
    eprintln!("largest difference {largest}, mean {mean}, scale {scale}");
    assert!(largest < 0.05 * scale && mean < 0.01 * scale, "logits differ by up to {largest}, {mean} on average");
    let top = |v: &[f32]| {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|a, b| v[*b].total_cmp(&v[*a]));
        order.truncate(3);
        order
    };
    assert_eq!(top(&ours), top(&theirs), "the three most likely next tokens");
}

/// Both in-process backends must cut text into the same ids (trajectories record them).
#[cfg(feature = "mistralrs")]
#[tokio::test]
async fn the_tokenizer_matches_mistralrs() {
    let candle = smollm2_candle();
    let mistralrs = crate::policy::testing::smollm2(1).await;
    for text in [
        PROMPT,
        "<search>capital of Australia</search>\n<information>Doc 1 (Canberra): Canberra is the capital.</information>",
        "Numbers 1234 and 3.14, naïve café, 東京, emoji 🙂, tabs\tand  double  spaces\n\n",
        "It's what they'll do; I'd've known. <answer>Bram Stoker</answer>",
    ] {
        let ours = candle.tokenize(text).await.unwrap().unwrap();
        let theirs = mistralrs.tokenize(text).await.unwrap().unwrap();
        assert_eq!(ours, theirs, "{text:?}");
        assert_eq!(candle.decode(&ours).unwrap(), text.replace("<|im_start|>", "").replace("<|im_end|>", ""));
    }
}

fn request(context: &str, seed: u64, stop: &[&str]) -> GenerationRequest {
    GenerationRequest {
        context: context.into(),
        context_ids: None,
        max_tokens: 40,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        sampling: Sampling { temperature: 0.7, top_p: 0.9 },
        seed,
        json_schema: None,
        ignore_eos: false,
    }
}

#[tokio::test]
async fn a_seed_reproduces_its_trajectory_whatever_was_cached_or_batched() {
    let policy = smollm2_candle();
    let single = policy.generate(&[request(PROMPT, 11, &[])]).await.unwrap().remove(0);
    // Now the prompt is cached and the request shares the batch with others (the two prompt
    // requests start together: the second follows the first until they sample apart).
    let batch = policy
        .generate(&[request(PROMPT, 12, &[]), request(PROMPT, 11, &[]), request("Hello", 13, &[])])
        .await
        .unwrap();
    assert_eq!(batch[1], single);
    assert_ne!(batch[0].token_ids, single.token_ids, "another seed should sample otherwise");
    let ids = single.token_ids.as_ref().unwrap();
    let logprobs = single.logprobs.as_ref().unwrap();
    assert_eq!(ids.len(), logprobs.len());
    assert!(logprobs.iter().all(|lp| *lp <= 0.0 && lp.is_finite()));
    assert_eq!(policy.decode(ids).unwrap(), single.text);
    assert!(matches!(single.finish, FinishReason::Eos | FinishReason::Length));

    // A later turn continues from the cache of the first: the same as from scratch.
    let follow = format!(
        "{PROMPT}{}<|im_end|>\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n",
        single.text
    );
    let cached = policy.generate(&[request(&follow, 5, &[])]).await.unwrap().remove(0);
    let fresh = smollm2_candle();
    assert_eq!(fresh.generate(&[request(&follow, 5, &[])]).await.unwrap().remove(0), cached);

    // Two of one prompt on an empty cache: the prompt is read once, and each still samples its
    // own way.
    let fresh = smollm2_candle();
    let pair = fresh.generate(&[request(PROMPT, 12, &[]), request(PROMPT, 11, &[])]).await.unwrap();
    assert_eq!(pair[1], single);
    assert_eq!(pair[0], batch[0]);
}

/// Rollouts of one context follow one leader while they sample alike: what they share is fed
/// once, and each gives exactly what it gives alone, whether it parts from its leader on the
/// way, outlives it, or loses it to a caller that stopped waiting.
#[tokio::test]
async fn rollouts_of_one_context_feed_what_they_share_once() {
    let sampled = |seed, max_tokens| GenerationRequest { max_tokens, ..request(PROMPT, seed, &[]) };
    // The leader stops first (its limit of one token); a rollout of the same seed goes on, and
    // another seed samples the same first tokens, then parts.
    let requests = [sampled(11, 1), sampled(11, 40), sampled(SAME_START_AS_11, 40)];
    let alone = smollm2_candle();
    let mut expected = Vec::new();
    for request in &requests {
        expected.push(alone.generate(std::slice::from_ref(request)).await.unwrap().remove(0));
    }
    let policy = smollm2_candle();
    assert_eq!(policy.generate(&requests).await.unwrap(), expected);

    // Fed: the context and every token sampled but the last. Each token of a shared prefix
    // counts once.
    let context = policy.inner.tokenize(PROMPT).unwrap();
    let fed: Vec<Vec<u32>> = expected
        .iter()
        .map(|g| {
            let ids = g.token_ids.as_ref().unwrap();
            context.iter().chain(&ids[..ids.len() - 1]).copied().collect()
        })
        .collect();
    let parted_at = fed[1].iter().zip(&fed[2]).take_while(|(a, b)| a == b).count();
    // Past the leader's one token: the second and third part from it together, and the third
    // then follows the second until it samples apart.
    assert!(parted_at > context.len() + 1 && parted_at < fed[2].len(), "seed {SAME_START_AS_11} parts on the way");
    let prefixes: std::collections::HashSet<&[u32]> =
        fed.iter().flat_map(|tokens| (1..=tokens.len()).map(move |n| &tokens[..n])).collect();
    let separately: usize = fed.iter().map(Vec::len).sum();
    assert!(prefixes.len() < separately - 2 * context.len());
    assert_eq!(policy.inner.rows_fed.load(std::sync::atomic::Ordering::Relaxed), prefixes.len());

    let policy = smollm2_candle();
    let leader = tokio::time::timeout(std::time::Duration::from_millis(60), policy.generate(&requests[1..2]));
    let (stopped, follower) = tokio::join!(leader, policy.generate(&requests[1..2]));
    assert!(stopped.is_err(), "the leader's caller stopped waiting");
    assert_eq!(follower.unwrap()[0], expected[1]);
    // What the two shared was fed once, by the leader while it ran, then by the follower.
    assert_eq!(policy.inner.rows_fed.load(std::sync::atomic::Ordering::Relaxed), fed[1].len());
}

/// A seed whose rollout of [`PROMPT`] samples its first tokens as seed 11's does.
const SAME_START_AS_11: u64 = 12;

/// Continuous batching: calls in flight together, joining at different steps, give exactly
/// what each gives alone.
#[tokio::test]
async fn concurrent_calls_give_what_each_gives_alone() {
    let other = "<|im_start|>user\nName a river in Spain.<|im_end|>\n<|im_start|>assistant\n";
    let requests = [request(PROMPT, 11, &[]), request(other, 3, &[]), request(PROMPT, 12, &["."])];
    let policy = smollm2_candle();
    let first = policy.generate(&requests[..1]);
    // The first is decoding when the others arrive; the third shares its running prompt.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (first, second, third) = tokio::join!(first, policy.generate(&requests[1..2]), policy.generate(&requests[2..]));
    let together = [first.unwrap(), second.unwrap(), third.unwrap()].concat();

    let alone = smollm2_candle();
    for (request, together) in requests.iter().zip(&together) {
        assert_eq!(&alone.generate(std::slice::from_ref(request)).await.unwrap()[0], together);
    }
    assert!(together.iter().all(|g| !g.text.is_empty()));
    assert_ne!(together[0].text, together[1].text, "different prompts, different texts");
}

#[tokio::test]
async fn generation_stops_right_after_a_stop_string() {
    let policy = smollm2_candle();
    let context =
        "<|im_start|>user\nCount from 1 to 20, separated by commas.<|im_end|>\n<|im_start|>assistant\n1, 2, 3,";
    let generation = policy.generate(&[request(context, 1, &[" 6"])]).await.unwrap().remove(0);
    assert_eq!(generation.finish, FinishReason::Stop, "{:?}", generation.text);
    assert!(generation.text.ends_with(" 6") || generation.text.ends_with(" 6,"), "{:?}", generation.text);
}

#[tokio::test]
async fn a_json_schema_constrains_the_text_to_valid_json() {
    let policy = smollm2_candle();
    let context = "<|im_start|>user\nWho wrote Dracula, and in which year? Answer in JSON.<|im_end|>\n\
                   <|im_start|>assistant\n";
    let mut constrained = request(context, 3, &[]);
    constrained.max_tokens = 80;
    constrained.json_schema = Some(serde_json::json!({
        "type": "object",
        "properties": {"author": {"type": "string", "maxLength": 24}, "year": {"type": "integer"}},
        "required": ["author", "year"],
        "additionalProperties": false
    }));
    let generation = policy.generate(std::slice::from_ref(&constrained)).await.unwrap().remove(0);
    let value: serde_json::Value = serde_json::from_str(generation.text.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", generation.text));
    assert!(value["author"].is_string() && value["year"].is_i64(), "{value}");
    assert_eq!(value.as_object().unwrap().len(), 2, "{value}");
    assert_eq!(generation.finish, FinishReason::Eos);
    let ids = generation.token_ids.as_ref().unwrap();
    assert_eq!(policy.decode(ids).unwrap(), generation.text);
    assert!(generation.logprobs.as_ref().unwrap().iter().all(|lp| *lp <= 0.0 && lp.is_finite()));
    // Unconstrained, the same seed writes prose; constrained again, the same JSON.
    let free = policy.generate(&[request(context, 3, &[])]).await.unwrap().remove(0);
    assert!(serde_json::from_str::<serde_json::Value>(free.text.trim()).is_err(), "{:?}", free.text);
    assert_eq!(policy.generate(&[constrained]).await.unwrap().remove(0), generation);

    let mut impossible = request(context, 3, &[]);
    impossible.json_schema = Some(serde_json::json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}));
    let error = policy.generate(&[impossible]).await.unwrap_err().to_string();
    assert!(error.contains("JSON Schema"), "{error}");
}

#[test]
fn sessions_serve_the_longest_shared_prefix_and_evict_the_least_recently_used() {
    let (model, tokenizer) = load_model(Precision::F32, KvCacheDtype::F32);
    let cached = |text: &str| {
        let tokens = ids(&tokenizer, text);
        let mut cache = KvCache::default();
        feed(&model, &mut cache, &tokens);
        (tokens, cache)
    };
    let (short, short_cache) = cached("<|im_start|>user\nOne two");
    let (long, long_cache) = cached("<|im_start|>user\nOne two three four five");
    let (other, other_cache) = cached("Something else entirely, at some length");
    let capacity = long.len().max(other.len()) + 1;
    assert!(other.len() + long.len() > capacity);
    let mut sessions = Sessions::new(capacity);
    sessions.store(short.clone(), short_cache);
    sessions.store(long.clone(), long_cache);
    assert_eq!(sessions.entries.len(), 1, "the longer sequence replaces the one it extends");
    let mut context = long[..long.len() - 1].to_vec();
    context.push(9);
    assert_eq!(sessions.lookup(&context).len(), long.len() - 1, "the shared prefix");
    assert_eq!(sessions.lookup(&long).len(), long.len() - 1, "at least one token is left to feed");
    assert_eq!(sessions.lookup(&[12345]).len(), 0);
    sessions.store(other.clone(), other_cache);
    assert_eq!(sessions.entries.len(), 1);
    assert_eq!(sessions.entries[0].0, other, "the least recently used sequence went first");
}

fn greedy(prompt: &str, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        context: prompt.into(),
        context_ids: None,
        max_tokens,
        stop: Vec::new(),
        sampling: Sampling::GREEDY,
        seed: 0,
        json_schema: None,
        ignore_eos: true,
    }
}

/// The largest gap between the log-probabilities `policy` recorded while generating from
/// [`PROMPT`] and those `trainer` gives the same tokens.
async fn trainer_server_gap(policy: &CandlePolicy, trainer: crate::train::TrainModel, tokenizer: &Tokenizer) -> f32 {
    // With `ignore_eos` the server records log-probabilities of the distribution without the
    // end-of-sequence tokens: not what the model computes.
    let request = GenerationRequest { ignore_eos: false, ..greedy(PROMPT, 24) };
    let generation = policy.generate(&[request]).await.unwrap().remove(0);
    let recorded = generation.logprobs.unwrap();
    let generated = generation.token_ids.unwrap();
    let mut tokens = ids(tokenizer, PROMPT);
    let first = tokens.len();
    tokens.extend(&generated);
    let positions: Vec<usize> = (first..tokens.len()).collect();
    let tape = trainer
        .forward(&[crate::train::Example { tokens: &tokens, positions: &positions, block_inputs: None }], 1.0)
        .unwrap();
    tape.logprobs[0].iter().zip(&recorded).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
}

/// The trainer's log-probabilities of a recorded trajectory agree with those the serving
/// forward pass recorded while generating it: the two passes compute the same function with
/// other summation orders (packed FMA panels vs matrixmultiply), so they differ by rounding.
#[tokio::test]
async fn the_trainer_scores_recorded_tokens_as_the_server_generated_them() {
    let policy = smollm2_candle();
    let (weights, tokenizer) = tokio::task::spawn_blocking(load_weights).await.unwrap();
    let gap = trainer_server_gap(&policy, crate::train::TrainModel::new(weights), &tokenizer).await;
    assert!(gap < TRAINER_SERVER_TOLERANCE, "log-probabilities differ by up to {gap}");
}

/// LoRA is served merged (`W + scale·B·A` in one matrix) and trained unmerged (`x·Wᵀ` plus
/// `scale·(x·Aᵀ)·Bᵀ`): the served policy's log-probabilities are the trainer's all the same.
#[tokio::test]
async fn lora_adapters_served_merged_score_as_the_trainer_scores_them() {
    let policy = smollm2_candle();
    let (weights, tokenizer) = tokio::task::spawn_blocking(load_weights).await.unwrap();
    let mut adapters = crate::train::new_adapters(&weights, &crate::train::LoraMethod::everywhere(4, 8.0), 5);
    // B starts at zero; give it values so that the adapters change what is served.
    for lora in adapters.blocks.iter_mut().flatten().flatten() {
        lora.b.iter_mut().enumerate().for_each(|(i, b)| *b = ((i % 7) as f32 - 3.0) * 2e-3);
    }
    let mut trainer = crate::train::TrainModel::new(weights);
    trainer.adapters = Some(adapters);
    let base = policy.generate(&[greedy(PROMPT, 24)]).await.unwrap().remove(0);
    policy.load_weights(&trainer.serving_weights(), 1).unwrap();
    let merged = policy.generate(&[greedy(PROMPT, 24)]).await.unwrap().remove(0);
    assert_ne!(merged.logprobs, base.logprobs, "the adapters changed nothing served");
    let gap = trainer_server_gap(&policy, trainer, &tokenizer).await;
    assert!(gap < TRAINER_SERVER_TOLERANCE, "log-probabilities differ by up to {gap}");
}

/// The largest difference allowed between the trainer's and the server's log-probability of a
/// token (nats).
/// Measured: 1.2e-5 over 24 tokens with libm's `expf` in the server, 1.5e-5 with `kernels::exp`.
const TRAINER_SERVER_TOLERANCE: f32 = 1e-4;

#[tokio::test]
async fn new_weights_are_served_from_the_next_request_without_stale_caches() {
    let policy = smollm2_candle();
    let before = policy.generate(&[greedy(PROMPT, 8)]).await.unwrap().remove(0);
    assert_eq!(policy.version(), 0);
    let (weights, _) = tokio::task::spawn_blocking(load_weights).await.unwrap();
    let mut changed = weights.clone();
    changed.output_norm.iter_mut().for_each(|w| *w *= -1.0);
    policy.load_weights(&changed, 3).unwrap();
    assert_eq!(policy.version(), 3);
    let after = policy.generate(&[greedy(PROMPT, 8)]).await.unwrap().remove(0);
    assert_ne!(after.token_ids, before.token_ids, "the new weights were not served");
    // Back to the loaded weights: the same tokens and log-probabilities as at first, so no
    // cache computed by the other weights was reused.
    policy.load_weights(&weights, 4).unwrap();
    let again = policy.generate(&[greedy(PROMPT, 8)]).await.unwrap().remove(0);
    assert_eq!((again.token_ids, again.logprobs), (before.token_ids, before.logprobs));
    let mut other = weights;
    other.shape.layers += 1;
    assert!(policy.load_weights(&other, 5).unwrap_err().to_string().contains("shape"));
}

/// SmolLM2's own template (from its GGUF, and from an export's `tokenizer_config.json`)
/// renders the loop's conversations exactly as ChatML does, so runs prompt it as before.
#[test]
fn smollm2_is_prompted_with_its_own_template() {
    let messages = [
        ChatMessage::new("system", "Search first."),
        ChatMessage::new("user", "Question: Where?"),
        ChatMessage::new("assistant", "<search>where</search>"),
        ChatMessage::new("user", "Question: Who?"),
    ];
    let chatml = crate::policy::ChatTemplate::Chatml.render(&messages);
    let files = ModelFiles::read(&smollm2_gguf()).unwrap();
    let format = files.chat_format("smollm2");
    assert!(format.is_model_template(), "the GGUF carries a usable template");
    assert_eq!(format.render(&messages), chatml);

    let exported = tempfile::tempdir().unwrap();
    files.export(&files.weights, exported.path()).unwrap();
    let reread = ModelFiles::read(exported.path()).unwrap().chat_format("export");
    assert!(reread.is_model_template(), "the export keeps the template");
    assert_eq!(reread.render(&messages), chatml);
    assert!(gguf_template_source(&smollm2_gguf()).unwrap().format().unwrap().is_model_template());
}

/// A trainer with adapters on the top blocks starts its passes from the residual stream the
/// served model kept at the lowest adapted block while it generated: the kept inputs are what
/// the model computes afresh (bit for bit, so resuming a run, which computes them, changes
/// nothing), and the trainer's log-probabilities and gradients from them are those it gets
/// running every block itself (within the two passes' rounding), rollouts sharing their prompt
/// in one prefix tree included.
#[tokio::test]
async fn served_block_inputs_start_the_trainer_at_its_lowest_adapted_block() {
    use crate::train::{Example, LoraMethod, Method, TrainModel, TrainSequence};
    let policy = smollm2_candle();
    let (weights, tokenizer) = tokio::task::spawn_blocking(load_weights).await.unwrap();
    let lora = LoraMethod { top_layers: Some(2), ..LoraMethod::everywhere(4, 8.0) };
    let mut trainer = TrainModel::for_method(weights, &Method::Lora(lora));
    for lora in trainer.adapters.iter_mut().flat_map(|a| a.blocks.iter_mut()).flatten().flatten() {
        lora.b.iter_mut().enumerate().for_each(|(i, b)| *b = ((i % 7) as f32 - 3.0) * 2e-3);
    }
    assert_eq!(trainer.first_trained_layer(), trainer.shape().layers - 2);
    policy.block_inputs(&[], 2).unwrap().expect("the candle backend keeps block inputs");

    let sampled =
        |seed| GenerationRequest { sampling: Sampling { temperature: 1.0, top_p: 1.0 }, seed, ..greedy(PROMPT, 20) };
    let generations = policy.generate(&[sampled(1), sampled(2), sampled(3)]).await.unwrap();
    let prompt = ids(&tokenizer, PROMPT);
    let sequences: Vec<TrainSequence> = generations
        .iter()
        .map(|g| {
            let tokens = [prompt.as_slice(), g.token_ids.as_ref().unwrap()].concat();
            let mask = (0..tokens.len()).map(|t| u8::from(t >= prompt.len())).collect();
            TrainSequence::new(tokens, mask)
        })
        .collect();
    let read: Vec<Vec<u32>> = sequences.iter().map(|s| s.read().to_vec()).collect();
    let kept = policy.block_inputs(&read, 2).unwrap().unwrap();
    let afresh = smollm2_candle().block_inputs(&read, 2).unwrap().unwrap();
    assert!(kept.iter().zip(&read).all(|(k, r)| k.len() == r.len() * trainer.shape().hidden));
    assert!(kept == afresh, "kept block inputs differ from those computed afresh");

    let positions: Vec<Vec<usize>> = sequences.iter().map(TrainSequence::positions).collect();
    fn examples<'a>(
        sequences: &'a [TrainSequence],
        positions: &'a [Vec<usize>],
        inputs: Option<&'a [Vec<f32>]>,
        without: Option<usize>,
    ) -> Vec<Example<'a>> {
        (0..sequences.len())
            .map(|i| Example {
                tokens: &sequences[i].tokens,
                positions: &positions[i],
                block_inputs: inputs.filter(|_| without != Some(i)).map(|all| all[i].as_slice()),
            })
            .collect()
    }
    let pass = |inputs| {
        let tape = trainer.forward(&examples(&sequences, &positions, inputs, None), 1.0).unwrap();
        let logprobs = tape.logprobs.clone();
        let ones: Vec<Vec<f32>> = logprobs.iter().map(|l| vec![1.0; l.len()]).collect();
        let mut grads = trainer.zero_grads();
        trainer.backward(tape, &ones, &mut grads).unwrap();
        let norm = crate::train::global_norm(&grads.tensors().iter().map(|g| g.as_slice()).collect::<Vec<_>>());
        (logprobs, norm)
    };
    let (served, served_norm) = pass(Some(&kept[..]));
    let (own, own_norm) = pass(None);
    let gap = served.iter().flatten().zip(own.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(gap < TRAINER_SERVER_TOLERANCE, "log-probabilities differ by up to {gap}");
    assert!((served_norm / own_norm - 1.0).abs() < 1e-3, "gradient norms {served_norm} and {own_norm}");

    let refused = trainer
        .forward(&examples(&sequences, &positions, Some(&kept), Some(1)), 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(refused.contains("give all or none"), "{refused}");
}
