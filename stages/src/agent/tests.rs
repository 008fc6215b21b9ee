//! The loop with the scripted policy over a real BM25 index, including adversarial output.

use std::sync::Arc;

use super::*;
use crate::search::Bm25Index;
use sesa_models::policy::{ChatMessage, ScriptedPolicy};

fn index() -> (tempfile::TempDir, Arc<Bm25Index>) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        concat!(
            r#"{"id": "w1", "title": "Orla", "text": "Orla is the capital of Veltria."}"#,
            "\n",
            r#"{"id": "w2", "title": "Veltria", "text": "Veltria is a country. Its capital is Orla."}"#,
            "\n",
            r#"{"id": "w3", "title": "Bananas", "text": "Bananas are yellow."}"#,
            "\n"
        ),
    )
    .unwrap();
    Bm25Index::build(&corpus, &dir.path().join("index"), |_| {}).unwrap();
    let index = Arc::new(Bm25Index::open(&dir.path().join("index")).unwrap());
    (dir, index)
}

/// Searches once, then answers with the first title it was shown.
fn searcher_then_answerer(context: &str, _seed: u64) -> String {
    match context.rsplit_once("(Title: \"") {
        None => "<think>I should search.</think><search> capital of Veltria </search>".to_string(),
        Some((_, rest)) => {
            format!("<think>Found it.</think><answer>{}</answer><|im_end|>", rest.split('"').next().unwrap())
        }
    }
}

fn run(script: fn(&str, u64) -> String, limits: AgentLimits, episodes: &[Episode]) -> Vec<Trajectory> {
    run_policy(&ScriptedPolicy::new(script), limits, episodes)
}

fn run_policy(policy: &dyn Policy, limits: AgentLimits, episodes: &[Episode]) -> Vec<Trajectory> {
    let (_dir, index) = index();
    let agent = AgentRun { limits, ..solver(policy, &index) };
    tokio::runtime::Runtime::new().unwrap().block_on(agent.run(episodes)).unwrap()
}

/// A greedy solver with two passages a search and the default limits.
fn solver<'a>(policy: &'a dyn Policy, search: &'a dyn Search) -> AgentRun<'a> {
    AgentRun {
        role: Role::Solver,
        policy,
        search,
        top_k: 2,
        limits: AgentLimits::default(),
        sampling: Sampling::GREEDY,
    }
}

fn episode(seed: u64) -> Episode {
    let prompt = ChatMessage::new("user", "What is the capital of Veltria?");
    Episode::new(sesa_models::policy::ChatTemplate::Chatml.render(&[prompt]), seed)
}

#[test]
fn a_search_then_an_answer_is_recorded_turn_by_turn() {
    let trajectory = run(searcher_then_answerer, AgentLimits::default(), &[episode(1)]).remove(0);
    assert_eq!(trajectory.outcome, Outcome::Final("Orla".into()));
    assert_eq!(trajectory.queries(), ["capital of Veltria"]);
    assert_eq!(trajectory.turns[0].retrieved_ids, ["w2", "w1"]);
    assert_eq!(trajectory.turns.len(), 2);
    insta::assert_snapshot!(trajectory.response, @r#"
    <think>I should search.</think><search> capital of Veltria </search>
    <information>
    Doc 1 (Title: "Veltria")
    Veltria is a country. Its capital is Orla.

    Doc 2 (Title: "Orla")
    Orla is the capital of Veltria.</information>

    <think>Found it.</think><answer>Orla</answer>
    "#);
    // Token ids decode back to the response; the information block is masked out.
    assert!(trajectory.tokens_exact);
    let bytes: Vec<u8> = trajectory.token_ids.iter().map(|&id| id as u8).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), trajectory.response);
    let masked: Vec<u8> = trajectory
        .token_ids
        .iter()
        .zip(&trajectory.loss_mask)
        .filter(|(_, m)| **m == 0)
        .map(|(&id, _)| id as u8)
        .collect();
    let block_start = trajectory.response.find("\n<information>").unwrap();
    let block_end = trajectory.response.find("</information>\n\n").unwrap() + "</information>\n\n".len();
    assert_eq!(String::from_utf8(masked).unwrap(), &trajectory.response[block_start..block_end]);
    assert_eq!(trajectory.logprobs.len(), trajectory.token_ids.len());
    assert!(trajectory.logprobs.iter().all(|&lp| lp <= 0.0));
    assert_eq!(trajectory.generated_tokens(), trajectory.loss_mask.iter().filter(|&&m| m == 1).count());
}

#[test]
fn a_written_opening_is_continued_by_the_model_and_marked_as_written() {
    // The model sees the opening as its own and goes on from it: a turn that only closes
    // the search the opening began is acted on.
    let finish_search: fn(&str, u64) -> String = |context, _| match context.rsplit_once("(Title: \"") {
        None => {
            assert!(context.ends_with("<think>I need the capital.</think>\n<search>"), "{context}");
            "capital of Veltria</search>".to_string()
        }
        Some((_, rest)) => format!("<answer>{}</answer><|im_end|>", rest.split('"').next().unwrap()),
    };
    let opening = "<think>I need the capital.</think>\n<search>";
    let written = Written { opening: opening.to_string(), in_thought: Vec::new(), searches: 0 };
    let episode = Episode { written: Some(written), ..episode(1) };
    let trajectory = run(finish_search, AgentLimits::default(), &[episode]).remove(0);
    assert_eq!(trajectory.queries(), ["capital of Veltria"]);
    assert_eq!(trajectory.outcome, Outcome::Final("Orla".into()));
    assert!(trajectory.response.starts_with(opening));
    // The opening's tokens come first, marked 2, with no sampling probability; the model's
    // own are 1 and only they count as generated.
    let written = opening.len();
    assert_eq!(trajectory.loss_mask[..written], vec![2; written]);
    assert_eq!(trajectory.logprobs[..written], vec![0.0; written]);
    assert_eq!(trajectory.loss_mask[written], 1);
    assert_eq!(trajectory.generated_tokens(), trajectory.loss_mask.iter().filter(|&&m| m == 1).count());
    let bytes: Vec<u8> = trajectory.token_ids.iter().map(|&id| id as u8).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), trajectory.response);
}

/// Answers after one search unless told to go on; goes on as told.
fn stops_after_one_search(context: &str, _seed: u64) -> String {
    if context.ends_with("Next, the country of") {
        return " Orla.</think>\n<search>Orla country</search>".into();
    }
    match context.matches("<information>").count() {
        0 => "<think>Looking.</think>\n<search>capital of Veltria</search>".into(),
        1 => "<think>Found Orla.</think>\n<answer>Orla</answer>".into(),
        _ => "<answer>Veltria</answer>".into(),
    }
}

/// Goes on by itself where [`stops_after_one_search`] would answer.
fn goes_on(context: &str, seed: u64) -> String {
    match (context.matches("<information>").count(), context.ends_with("</think>")) {
        (1, false) => "<think>Found Orla. Next, the country of Orla.</think>\n<search>Orla country</search>".into(),
        (1, true) => "\n<search>Orla country</search>".into(),
        _ => stops_after_one_search(context, seed),
    }
}

#[test]
fn text_written_into_a_thought_makes_the_turn_go_on_unless_the_model_said_it() {
    let next = " Next, the country of";
    let written = Written { opening: String::new(), in_thought: vec![None, Some(next.to_string())], searches: 0 };
    let guided = Episode { written: Some(written), ..episode(1) };
    // A token per byte, and tokens that merge punctuation as byte-level BPE does: "Orla.</think>"
    // ends in ".</", "think", ">"; the "." taken back with the tag is written again.
    let bytes = ScriptedPolicy::new(stops_after_one_search);
    let merged = ScriptedVariant {
        script: ScriptedPolicy::new(stops_after_one_search),
        pause: std::time::Duration::ZERO,
        tokens: Tokens::MergedPunctuation,
    };
    for policy in [&bytes as &dyn Policy, &merged] {
        let trajectory = run_policy(policy, AgentLimits::default(), std::slice::from_ref(&guided)).remove(0);
        assert_eq!(trajectory.queries(), ["capital of Veltria", "Orla country"], "{}", policy.name());
        assert_eq!(trajectory.outcome, Outcome::Final("Veltria".into()));
        assert_eq!(
            trajectory.turns[1].text,
            "<think>Found Orla. Next, the country of Orla.</think>\n<search>Orla country</search>"
        );
        let ids = |mask: u8| -> Vec<u32> {
            trajectory
                .token_ids
                .iter()
                .zip(&trajectory.loss_mask)
                .filter(|(_, m)| **m == mask)
                .map(|(&id, _)| id)
                .collect()
        };
        let decode = |ids: &[u32]| futures::executor::block_on(policy.decode(ids)).unwrap().unwrap();
        let expected = if policy.name() == "scripted" { next.to_string() } else { format!(".{next}") };
        assert_eq!(decode(&ids(2)), expected, "{}", policy.name());
        assert_eq!(decode(&trajectory.token_ids), trajectory.response, "the ids spell the response");
        assert_eq!(trajectory.token_ids.len(), trajectory.logprobs.len());
        assert_eq!(trajectory.generated_tokens(), ids(1).len(), "taken-back tokens are not counted");
    }
    // Without token ids the text alone is reopened and written into.
    let untold = ScriptedVariant {
        script: ScriptedPolicy::new(stops_after_one_search),
        pause: std::time::Duration::ZERO,
        tokens: Tokens::Untold,
    };
    let trajectory = run_policy(&untold, AgentLimits::default(), std::slice::from_ref(&guided)).remove(0);
    assert!(!trajectory.tokens_exact && trajectory.token_ids.is_empty());
    assert_eq!(trajectory.queries(), ["capital of Veltria", "Orla country"]);
    assert_eq!(
        trajectory.turns[1].text,
        "<think>Found Orla. Next, the country of Orla.</think>\n<search>Orla country</search>"
    );
    assert!(trajectory.response.contains(&trajectory.turns[1].text), "{}", trajectory.response);
    // A model that goes on by itself is left alone: nothing is written.
    let trajectory = run(goes_on, AgentLimits::default(), &[guided]).remove(0);
    assert_eq!(trajectory.queries(), ["capital of Veltria", "Orla country"]);
    assert!(trajectory.loss_mask.iter().all(|&m| m != 2));
    // Without written text the first model answers after one search.
    let trajectory = run(stops_after_one_search, AgentLimits::default(), &[episode(1)]).remove(0);
    assert_eq!(trajectory.outcome, Outcome::Final("Orla".into()));
}

/// [`stops_after_one_search`], writing a query where a search was opened for it.
fn answers_early(context: &str, seed: u64) -> String {
    match context.ends_with("<search>") {
        true => "Orla country</search>".into(),
        false => stops_after_one_search(context, seed),
    }
}

#[test]
fn a_final_tag_opened_before_the_searches_owed_becomes_a_search() {
    let owing = |searches| Episode { written: Some(Written { searches, ..Written::default() }), ..episode(1) };
    let merged = ScriptedVariant {
        script: ScriptedPolicy::new(answers_early),
        pause: std::time::Duration::ZERO,
        tokens: Tokens::MergedPunctuation,
    };
    let untold = ScriptedVariant { tokens: Tokens::Untold, script: ScriptedPolicy::new(answers_early), ..merged };
    let bytes = ScriptedPolicy::new(answers_early);
    for policy in [&bytes as &dyn Policy, &merged, &untold] {
        let trajectory = run_policy(policy, AgentLimits::default(), &[owing(2)]).remove(0);
        assert_eq!(trajectory.queries(), ["capital of Veltria", "Orla country"], "{}", policy.name());
        assert_eq!(trajectory.outcome, Outcome::Final("Veltria".into()));
        assert_eq!(trajectory.searches_written, 1);
        assert_eq!(trajectory.turns[1].text, "<think>Found Orla.</think>\n<search>Orla country</search>");
        assert!(trajectory.response.contains(&trajectory.turns[1].text), "{}", trajectory.response);
        if !trajectory.tokens_exact {
            continue;
        }
        let written: Vec<u32> = trajectory
            .token_ids
            .iter()
            .zip(&trajectory.loss_mask)
            .filter(|(_, m)| **m == 2)
            .map(|(&id, _)| id)
            .collect();
        let decode = |ids: &[u32]| futures::executor::block_on(policy.decode(ids)).unwrap().unwrap();
        assert_eq!(decode(&written), "<search>", "{}", policy.name());
        assert_eq!(decode(&trajectory.token_ids), trajectory.response, "the ids spell the response");
        assert_eq!(trajectory.token_ids.len(), trajectory.logprobs.len());
        let sampled = trajectory.loss_mask.iter().filter(|&&m| m == 1).count();
        assert_eq!(trajectory.generated_tokens(), sampled, "taken-back tokens are not counted");
    }
    // Owing no more than it searched, searching on by itself, or on the last turn (where a
    // search would not run), nothing is written.
    let last_turn = AgentLimits { max_turns: 2, ..AgentLimits::default() };
    type Script = fn(&str, u64) -> String;
    let cases: [(Script, _, _, _); 3] = [
        (answers_early, AgentLimits::default(), 1, "Orla"),
        (goes_on, AgentLimits::default(), 2, "Veltria"),
        (answers_early, last_turn, 2, "Orla"),
    ];
    for (script, limits, searches, expected) in cases {
        let trajectory = run(script, limits, &[owing(searches)]).remove(0);
        assert_eq!(trajectory.outcome, Outcome::Final(expected.into()));
        assert_eq!(trajectory.searches_written, 0);
        assert!(trajectory.loss_mask.iter().all(|&m| m != 2));
    }
}

/// A test double: the scripted policy answering each call after `pause`, with its token per
/// byte, a tokenizer that merges runs of up to three ASCII punctuation bytes into one token
/// (id 256 + the bytes packed) as byte-level BPE does, or no token ids at all.
struct ScriptedVariant {
    script: ScriptedPolicy,
    pause: std::time::Duration,
    tokens: Tokens,
}

#[derive(PartialEq)]
enum Tokens {
    Bytes,
    MergedPunctuation,
    Untold,
}

impl ScriptedVariant {
    fn ids(text: &str) -> Vec<u32> {
        let bytes = text.as_bytes();
        let mut ids = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let run = bytes[at..].iter().take(3).take_while(|b| b.is_ascii_punctuation()).count();
            if run > 1 {
                ids.push(256 + bytes[at..at + run].iter().rev().fold(0, |packed, &b| packed << 8 | u32::from(b)));
                at += run;
            } else {
                ids.push(u32::from(bytes[at]));
                at += 1;
            }
        }
        ids
    }

    fn text(ids: &[u32]) -> String {
        let bytes = ids.iter().flat_map(|&id| match id {
            0..256 => vec![id as u8],
            _ => (id - 256).to_le_bytes().into_iter().take_while(|&b| b != 0).collect(),
        });
        String::from_utf8(bytes.collect()).unwrap()
    }
}

impl Policy for ScriptedVariant {
    fn name(&self) -> &str {
        match self.tokens {
            Tokens::Bytes => "slow scripted",
            Tokens::MergedPunctuation => "merged punctuation",
            Tokens::Untold => "no token ids",
        }
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        self.script.render_chat(messages)
    }

    fn tokenize<'a>(
        &'a self,
        text: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Vec<u32>>, sesa_models::policy::PolicyError>> {
        match self.tokens {
            Tokens::Bytes => self.script.tokenize(text),
            Tokens::MergedPunctuation => Box::pin(async move { Ok(Some(Self::ids(text))) }),
            Tokens::Untold => Box::pin(async { Ok(None) }),
        }
    }

    fn decode<'a>(
        &'a self,
        ids: &'a [u32],
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, sesa_models::policy::PolicyError>> {
        match self.tokens {
            Tokens::Bytes => self.script.decode(ids),
            Tokens::MergedPunctuation => Box::pin(async move { Ok(Some(Self::text(ids))) }),
            Tokens::Untold => Box::pin(async { Ok(None) }),
        }
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> futures::future::BoxFuture<'a, Result<Vec<sesa_models::policy::Generation>, sesa_models::policy::PolicyError>>
    {
        Box::pin(async move {
            tokio::time::sleep(self.pause).await;
            let mut generations = self.script.generate(requests).await?;
            for generation in &mut generations {
                let ids = (self.tokens == Tokens::MergedPunctuation).then(|| Self::ids(&generation.text));
                match ids {
                    Some(ids) => (generation.logprobs, generation.token_ids) = (Some(vec![-0.5; ids.len()]), Some(ids)),
                    None if self.tokens == Tokens::Untold => (generation.logprobs, generation.token_ids) = (None, None),
                    None => {}
                }
            }
            Ok(generations)
        })
    }
}

#[test]
fn adversarial_outputs_end_as_recorded_format_failures() {
    let prose: fn(&str, u64) -> String = |_, _| "The capital is Orla, I think.<|im_end|>".into();
    let unclosed: fn(&str, u64) -> String = |_, _| "<search>capital of<|im_end|>".into();
    let tag_in_query: fn(&str, u64) -> String = |_, _| "<search>x <information>y</information></search>".into();
    let empty: fn(&str, u64) -> String = |_, _| "<search></search>".into();
    let outcomes: Vec<Outcome> = [prose, unclosed, tag_in_query, empty]
        .into_iter()
        .map(|script| run(script, AgentLimits::default(), &[episode(1)]).remove(0).outcome)
        .collect();
    assert_eq!(
        outcomes,
        [
            Outcome::FormatError(FormatError::NoAction),
            Outcome::FormatError(FormatError::Unclosed("search".into())),
            Outcome::FormatError(FormatError::TagInQuery),
            Outcome::FormatError(FormatError::EmptyQuery),
        ]
    );
}

#[test]
fn budgets_end_episodes() {
    let always_search: fn(&str, u64) -> String = |_, _| "<search>Veltria</search>".into();
    let limits = AgentLimits { max_turns: 3, ..AgentLimits::default() };
    let trajectory = run(always_search, limits, &[episode(1)]).remove(0);
    assert_eq!(trajectory.outcome, Outcome::TurnLimit);
    assert_eq!(trajectory.turns.len(), 3);
    assert_eq!(trajectory.queries().len(), 2, "a search asked on the last turn is not run");

    let runaway: fn(&str, u64) -> String = |_, _| "blah ".repeat(1000);
    let limits = AgentLimits { max_turn_tokens: 64, max_total_tokens: 64, ..AgentLimits::default() };
    let trajectory = run(runaway, limits, &[episode(1)]).remove(0);
    assert_eq!(trajectory.outcome, Outcome::TokenBudget);
    assert_eq!(trajectory.generated_tokens(), 64);

    let limits = AgentLimits { context_limit: 60, ..AgentLimits::default() };
    let trajectory = run(always_search, limits, &[episode(1)]).remove(0);
    assert_eq!(trajectory.outcome, Outcome::ContextLimit);
}

#[test]
fn trajectories_do_not_depend_on_batching() {
    let seeded: fn(&str, u64) -> String = |context, seed| {
        if context.contains("<information>") {
            format!("<answer>{}</answer>", seed % 1000)
        } else {
            format!("<search>Veltria {}</search>", seed % 7)
        }
    };
    let batch = run(seeded, AgentLimits::default(), &[episode(1), episode(2), episode(3)]);
    let alone = run(seeded, AgentLimits::default(), &[episode(2)]);
    // Everything but the wall times.
    let key = |t: &Trajectory| {
        (t.response.clone(), t.token_ids.clone(), t.logprobs.clone(), t.outcome.clone(), t.queries().join("|"))
    };
    assert_eq!(key(&batch[1]), key(&alone[0]));
    assert_ne!(batch[0].response, batch[1].response);
}

/// With a bound on the episodes in flight, the next starts as soon as any ends: a long episode
/// does not hold back those after the short ones beside it (batches run one after another
/// would). Results come in episode order, each counted once.
#[tokio::test]
async fn a_bounded_run_starts_the_next_episode_when_any_ends() {
    let (_dir, index) = index();
    let pause = std::time::Duration::from_millis(150);
    // The first episode searches three times before it answers (four turns), the others once
    // (two).
    let uneven = |context: &str, seed: u64| {
        let read = context.matches("<information>").count();
        if read < if context.contains("three times") { 3 } else { 1 } {
            "<search> capital of Veltria </search>".to_string()
        } else {
            searcher_then_answerer(context, seed)
        }
    };
    let policy = ScriptedVariant { script: ScriptedPolicy::new(uneven), pause, tokens: Tokens::Bytes };
    let agent = solver(&policy, &index);
    let clock = Instant::now();
    let mut done = 0;
    let thorough = ChatMessage::new("user", "What is the capital of Veltria? Search three times.");
    let long = Episode::new(sesa_models::policy::ChatTemplate::Chatml.render(&[thorough]), 1);
    let (trajectories, _) = agent.run_at_most(&[long, episode(2), episode(3)], 2, || done += 1).await.unwrap();
    let wall = clock.elapsed();
    assert_eq!(done, 3);
    let turns: Vec<usize> = trajectories.iter().map(|t| t.turns.len()).collect();
    assert_eq!(turns, [4, 2, 2], "in episode order");
    // The third runs beside the first's last two turns: four turns in all, not six (in batches
    // of two) nor two (all at once).
    assert!(wall >= 4 * pause, "more than two episodes ran at once: {wall:?}");
    assert!(wall < 6 * pause, "the third episode waited for the first: {wall:?}");
}

/// Episodes wait on the policy at the same time, and that time counts once.
#[tokio::test]
async fn episodes_run_concurrently_and_overlapping_calls_count_once() {
    let (_dir, index) = index();
    let pause = std::time::Duration::from_millis(150);
    let policy = ScriptedVariant { script: ScriptedPolicy::new(searcher_then_answerer), pause, tokens: Tokens::Bytes };
    let agent = solver(&policy, &index);
    let clock = Instant::now();
    let (trajectories, busy) = agent.run_timed(&[episode(1), episode(2), episode(3), episode(4)]).await.unwrap();
    let wall = clock.elapsed();
    assert!(trajectories.iter().all(|t| t.turns.len() == 2 && t.outcome == Outcome::Final("Orla".into())));
    // Two turns of 150 ms each; one after another, the four episodes would take 1.2 s.
    assert!(wall < 4 * pause, "episodes ran one after another: {wall:?}");
    assert!(busy.generation >= 2 * pause && busy.generation <= wall, "{busy:?} in {wall:?}");
    assert!(busy.search < pause, "{busy:?}");
}
