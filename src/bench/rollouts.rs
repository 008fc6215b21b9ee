//! `sesa bench-rollouts`: the agent loop against the same tokens without it.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use sesa_stages::data::datasets::load_questions;
use sesa_stages::sections::ModelSection;

/// `sesa bench-rollouts`: solver trajectories with real search, against the same tokens
/// replayed without the loop (what the loop adds) and against raw generation of as many tokens
/// from the same prompts (the shape llama-batched-bench measures). The loop and the replay run
/// `repeats` times, alternately, each on a freshly loaded policy; medians are reported.
pub async fn bench_rollouts(
    spec_path: &Path,
    overrides: &[String],
    questions: &Path,
    trajectories: usize,
    repeats: usize,
    registry: &sesa_engine::Registry,
) -> Result<u8> {
    use std::collections::BTreeMap;

    use sesa_stages::agent::{Episode, Role};
    use sesa_stages::sections::AgentSetup;

    let pipeline = sesa_engine::load_pipeline(spec_path, overrides, registry)?;
    let spec = pipeline.spec();
    let setup = AgentSetup::from_spec(spec).await?;
    let template = setup.template(Role::Solver)?;
    let questions = load_questions(questions)?;
    let episodes: Vec<Episode> = questions
        .iter()
        .cycle()
        .take(trajectories)
        .enumerate()
        .map(|(i, q)| Episode {
            prompt: setup.policy.render_chat(&template.render(&BTreeMap::from([("question", q.question.clone())]))),
            seed: i as u64,
            written: None,
        })
        .collect();
    let sampling = setup.agent.sampling;
    drop(setup);

    // Each measurement runs on a freshly loaded policy, the others' memory freed. The
    // trajectories are the same every time (seeded, and batching changes no bit).
    let (mut loops, mut replays, mut results, mut busy) = (Vec::new(), Vec::new(), Vec::new(), Default::default());
    for _ in 0..repeats.max(1) {
        let setup = AgentSetup::from_spec(spec).await?;
        let run = setup.agent(Role::Solver);
        let clock = Instant::now();
        (results, busy) = run.run_timed(&episodes).await?;
        loops.push(clock.elapsed().as_secs_f64());
        drop(setup);
        // The same tokens without the loop: each trajectory's turns as plain generation
        // requests (its recorded context, its turn seed, as many tokens as the turn had), all
        // trajectories concurrently. The model reads and writes exactly what it did in the
        // loop; searching, parsing and the loop's bookkeeping are what is missing.
        let policy = AgentSetup::from_spec(spec).await?.policy;
        let clock = Instant::now();
        let replayed = futures::future::try_join_all(
            results.iter().zip(&episodes).map(|(t, e)| replay(policy.as_ref(), t, e.seed, sampling)),
        )
        .await?;
        replays.push(replayed.iter().all(|&r| r).then(|| clock.elapsed().as_secs_f64()));
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let loop_seconds = median(&mut loops.clone());
    let replays: Option<Vec<f64>> = replays.into_iter().collect();
    let replay_seconds = replays.clone().map(|mut r| median(&mut r));
    let tokens: usize = results.iter().map(|t| t.generated_tokens()).sum();
    let prompt_tokens: usize = results.iter().filter_map(|t| t.prompt_tokens).sum();
    let read_tokens: usize = results.iter().map(|t| t.token_ids.len().saturating_sub(t.generated_tokens())).sum();
    let searches: Vec<u64> =
        results.iter().flat_map(|t| &t.turns).filter(|t| t.query.is_some()).map(|t| t.search_ms).collect();

    // mistral.rs cannot generate past end-of-sequence, which raw generation of a fixed count needs.
    let past_eos = !matches!(spec.section::<ModelSection>().as_deref(), Some(ModelSection::Mistralrs(_)));
    let raw = if past_eos { Some(raw_generation(spec, &episodes, &results, sampling).await?) } else { None };

    let n = results.len().max(1);
    println!("trajectories      {}", results.len());
    println!("mean prompt       {} tokens", prompt_tokens / n);
    println!("mean generated    {} tokens", tokens / n);
    println!("mean tool results {} tokens (read by the model in the loop, not generated)", read_tokens / n);
    let runs = |values: &[f64]| values.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(", ");
    println!(
        "agent loop        {loop_seconds:.1} s (median of {}), {:.1} trajectories/min, {:.1} generated tokens/s ({tokens} tokens)",
        runs(&loops),
        results.len() as f64 * 60.0 / loop_seconds,
        tokens as f64 / loop_seconds
    );
    // Where the last loop's time went.
    let last: f64 = loops.last().copied().unwrap_or(loop_seconds);
    let (generation_seconds, search_seconds) = (busy.generation.as_secs_f64(), busy.search.as_secs_f64());
    let neither = last - generation_seconds - search_seconds;
    println!(
        "  inside (last)   generation {generation_seconds:.1} s, search alone {search_seconds:.2} s, neither {neither:.2} s ({:.2}% of the loop)",
        neither / last * 100.0
    );
    println!(
        "  searches        {}, {:.1} ms each on average (concurrent with generation)",
        searches.len(),
        searches.iter().sum::<u64>() as f64 / searches.len().max(1) as f64
    );
    if let (Some(replay_seconds), Some(replays)) = (replay_seconds, &replays) {
        println!(
            "same tokens       {replay_seconds:.1} s (median of {}) without the loop (every turn's context and generation replayed, no search)",
            runs(replays)
        );
        println!(
            "loop vs same      {:+.1}% wall time: what the agent loop adds",
            (loop_seconds / replay_seconds - 1.0) * 100.0
        );
    } else {
        println!("same tokens       n/a (the policy gives no exact token ids to replay)");
    }
    let Some(Raw { prefill_seconds, decode_seconds, first_tokens, decode_tokens }) = raw else {
        println!("raw generation    n/a (mistral.rs cannot generate past end-of-sequence)");
        return Ok(0);
    };
    let raw_seconds = prefill_seconds + decode_seconds;
    let raw_tokens = first_tokens + decode_tokens;
    println!(
        "raw generation    {raw_seconds:.1} s, {:.1} tokens/s ({raw_tokens} tokens): prompts + first tokens {prefill_seconds:.1} s ({} prompt tokens, {:.0} tokens/s), decoding {decode_seconds:.1} s ({:.1} tokens/s)",
        raw_tokens as f64 / raw_seconds,
        prompt_tokens,
        prompt_tokens as f64 / prefill_seconds,
        decode_tokens as f64 / decode_seconds
    );
    println!(
        "loop vs raw       {:+.1}% wall time for the same generated tokens (raw reads no tool results)",
        (loop_seconds / raw_seconds - 1.0) * 100.0
    );
    Ok(0)
}

/// Raw generation's timings and token counts.
struct Raw {
    prefill_seconds: f64,
    decode_seconds: f64,
    first_tokens: usize,
    decode_tokens: usize,
}

/// Raw generation of as many tokens per trajectory as `results` generated, from the same
/// prompts (no tool results), on a freshly loaded policy, as llama-batched-bench runs it: the
/// prompt and first token, then the rest from there (after EOS too).
async fn raw_generation(
    spec: &sesa_engine::spec::Spec,
    episodes: &[sesa_stages::agent::Episode],
    results: &[sesa_stages::agent::Trajectory],
    sampling: sesa_models::policy::Sampling,
) -> Result<Raw> {
    use sesa_models::policy::GenerationRequest;
    use sesa_stages::sections::AgentSetup;

    let request = |context: String, context_ids: Option<Vec<u32>>, max_tokens: usize, seed: u64, ignore_eos: bool| {
        GenerationRequest { ignore_eos, ..plain_request(context, context_ids, max_tokens, sampling, seed) }
    };
    let raw_policy = AgentSetup::from_spec(spec).await?.policy;
    let firsts: Vec<GenerationRequest> =
        episodes.iter().map(|e| request(e.prompt.clone(), None, 1, e.seed, true)).collect();
    let clock = Instant::now();
    let first = raw_policy.generate(&firsts).await?;
    let prefill_seconds = clock.elapsed().as_secs_f64();
    let mut rests = Vec::new();
    for ((episode, trajectory), first) in episodes.iter().zip(results).zip(&first) {
        let remaining = trajectory.generated_tokens().saturating_sub(1);
        if remaining == 0 {
            continue;
        }
        let ids = match (raw_policy.tokenize(&episode.prompt).await?, &first.token_ids) {
            (Some(mut prompt), Some(picked)) => Some({
                prompt.extend(picked);
                prompt
            }),
            _ => None,
        };
        rests.push(request(format!("{}{}", episode.prompt, first.text), ids, remaining, episode.seed, true));
    }
    let clock = Instant::now();
    let rest = raw_policy.generate(&rests).await?;
    let decode_seconds = clock.elapsed().as_secs_f64();
    let count = |g: &[sesa_models::policy::Generation]| -> usize {
        g.iter().map(|g| g.token_ids.as_ref().map_or(0, Vec::len)).sum()
    };
    let (first_tokens, decode_tokens) = (count(&first), count(&rest));
    Ok(Raw { prefill_seconds, decode_seconds, first_tokens, decode_tokens })
}

/// A request with no stop strings and no schema: the benchmark decides how many tokens.
fn plain_request(
    context: String,
    context_ids: Option<Vec<u32>>,
    max_tokens: usize,
    sampling: sesa_models::policy::Sampling,
    seed: u64,
) -> sesa_models::policy::GenerationRequest {
    sesa_models::policy::GenerationRequest {
        context,
        context_ids,
        max_tokens,
        stop: Vec::new(),
        sampling,
        seed,
        json_schema: None,
        ignore_eos: false,
    }
}

/// Replays `trajectory`'s turns as plain generation requests: each turn's recorded context,
/// its seed, as many tokens as it generated, and checks they are the same tokens. False when
/// the trajectory's token ids are not exact.
async fn replay(
    policy: &dyn sesa_models::policy::Policy,
    trajectory: &sesa_stages::agent::Trajectory,
    seed: u64,
    sampling: sesa_models::policy::Sampling,
) -> Result<bool> {
    let Some(prompt) = policy.tokenize(&trajectory.prompt).await?.filter(|_| trajectory.tokens_exact) else {
        return Ok(false);
    };
    // Turn t starts at the t-th run of generated tokens (mask 1).
    let mask = &trajectory.loss_mask;
    let starts = (0..mask.len()).filter(|&i| mask[i] == 1 && (i == 0 || mask[i - 1] == 0));
    for ((turn, start), record) in starts.enumerate().zip(&trajectory.turns) {
        let context: Vec<u32> = prompt.iter().chain(&trajectory.token_ids[..start]).copied().collect();
        let request = plain_request(
            String::new(),
            Some(context),
            record.tokens,
            sampling,
            sesa_stages::agent::turn_seed(seed, turn),
        );
        let generation = policy.generate(&[request]).await?.remove(0);
        let recorded = &trajectory.token_ids[start..start + record.tokens];
        anyhow::ensure!(
            generation.token_ids.as_deref() == Some(recorded),
            "the replay of turn {turn} diverged from the loop's tokens: the same seed and context \
             should give the same tokens"
        );
    }
    Ok(true)
}
