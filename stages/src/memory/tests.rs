//! Tests with the real all-MiniLM-L6-v2 weights (fetched into the model cache on first use),
//! and of the shipped seed skills and skill schema.

use std::path::Path;

use super::*;
use crate::sections::MemorySection;
use sesa_models::cache;

fn minilm() -> MiniLm {
    let home = cache::sesa_home();
    let directory = cache::fetch(&home, "all-minilm-l6-v2").expect("fetching all-minilm-l6-v2");
    MiniLm::load(&directory).unwrap()
}

/// Labelled pairs of skill-like texts (description + trigger, as the bank embeds them).
/// Paraphrases say the same strategy in other words; related pairs are different strategies
/// about the same kind of question; unrelated pairs share nothing.
const PARAPHRASES: &[(&str, &str)] = &[
    (
        "Decompose a multi-hop question and search one hop at a time.",
        "Split a multi-hop question into single hops and search for each hop in turn.",
    ),
    (
        "Search for the bridging entity first, not the final answer.",
        "First search for the bridge entity instead of searching for the final answer.",
    ),
    (
        "Check dates and numbers against the retrieved source text.",
        "Verify numbers and dates against the text of the retrieved source.",
    ),
    (
        "Rephrase a query that returned nothing useful using synonyms.",
        "When a query returns nothing useful, rephrase it with synonyms.",
    ),
    (
        "Compare two entities by searching each one separately.",
        "To compare two entities, search for each of them separately.",
    ),
    (
        "Disambiguate a common name by adding the person's occupation to the query.",
        "Add the person's occupation to the query to disambiguate a common name.",
    ),
];

const RELATED: &[(&str, &str)] = &[
    (
        "Decompose a multi-hop question and search one hop at a time.",
        "Compare two entities by searching each one separately.",
    ),
    (
        "Check dates and numbers against the retrieved source text.",
        "Rephrase a query that returned nothing useful using synonyms.",
    ),
    (
        "Search for the bridging entity first, not the final answer.",
        "Answer with the shortest exact span from the passage.",
    ),
    (
        "Disambiguate a common name by adding the person's occupation to the query.",
        "Resolve time-dependent facts by adding the year the question gives.",
    ),
];

const UNRELATED: &[(&str, &str)] = &[
    ("Decompose a multi-hop question and search one hop at a time.", "Paris is the capital of France."),
    ("Check dates and numbers against the retrieved source text.", "Bananas are rich in potassium."),
    ("Compare two entities by searching each one separately.", "The recipe needs two eggs and flour."),
];

fn similarities(embedder: &CachedEmbedder, pairs: &[(&str, &str)]) -> Vec<f32> {
    pairs
        .iter()
        .map(|(a, b)| {
            let v = embedder.embed(&[a, b]).unwrap();
            cosine(&v[0], &v[1])
        })
        .collect()
}

/// The measurement behind `memory.dedup_threshold`'s default (0.8 for MiniLM; the paper's 0.93
/// is for E5, whose cosines are compressed towards 1): every paraphrase lies above it, every
/// different skill below it.
#[test]
fn the_default_threshold_separates_paraphrases_from_different_skills() {
    let embedder = CachedEmbedder::new(Box::new(minilm()));
    let paraphrases = similarities(&embedder, PARAPHRASES);
    let related = similarities(&embedder, RELATED);
    let unrelated = similarities(&embedder, UNRELATED);
    let threshold = MemorySection::default_dedup_threshold();
    eprintln!("paraphrases {paraphrases:.3?}\nrelated     {related:.3?}\nunrelated   {unrelated:.3?}");
    let lowest_paraphrase = paraphrases.iter().copied().fold(f32::INFINITY, f32::min);
    let highest_other = related.iter().chain(&unrelated).copied().fold(f32::NEG_INFINITY, f32::max);
    assert!(lowest_paraphrase > threshold, "a paraphrase at {lowest_paraphrase:.3} would be admitted");
    assert!(highest_other <= threshold, "a different skill at {highest_other:.3} would be rejected");
}

#[test]
fn minilm_vectors_are_unit_length_and_batching_does_not_change_them() {
    let model = minilm();
    let texts = ["a short one", "a much longer text about searching for the founder of a company", "x"];
    let batch = model.embed_batch(&texts).unwrap();
    assert_eq!(batch.len(), 3);
    for (text, vector) in texts.iter().zip(&batch) {
        assert_eq!(vector.len(), 384);
        assert!((cosine(vector, vector) - 1.0).abs() < 1e-4);
        let alone = model.embed_batch(&[text]).unwrap().remove(0);
        assert!(cosine(vector, &alone) > 0.9999, "padding changed the vector of {text:?}");
    }
}

/// The packed forward pass against candle-transformers' BERT, the reference implementation,
/// one text at a time (no padding on either side). Enough texts for several passes on
/// several workers.
#[test]
fn the_packed_encoder_agrees_with_candle_bert() {
    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::{BertModel, Config};

    let directory = cache::fetch(&cache::sesa_home(), "all-minilm-l6-v2").unwrap();
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(directory.join("config.json")).unwrap()).unwrap();
    let weights = [directory.join("model.safetensors")];
    // SAFETY: the model cache is not written while the test reads it.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&weights, DType::F32, &Device::Cpu) }.unwrap();
    let reference = BertModel::load(vb, &config).unwrap();
    let mut tokenizer = tokenizers::Tokenizer::from_file(directory.join("tokenizer.json")).unwrap();
    tokenizer.with_padding(None);
    let texts: Vec<String> = (0..90)
        .map(|i| format!("Question {i}: which {} came first?", "river and mountain range ".repeat(i % 13)))
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let packed = minilm().embed_batch(&texts).unwrap();
    for (text, vector) in texts.iter().zip(&packed) {
        let encoding = tokenizer.encode(*text, true).unwrap();
        let ids = Tensor::new(encoding.get_ids(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let hidden = reference.forward(&ids, &ids.zeros_like().unwrap(), None).unwrap();
        let mean: Vec<f32> = hidden.mean(1).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
        let largest = mean.iter().zip(vector).map(|(r, v)| (r / norm - v).abs()).fold(0.0f32, f32::max);
        assert!(largest < 1e-5, "{text:?}: components differ by up to {largest}");
    }
}

#[test]
fn the_cache_embeds_each_text_once() {
    struct Counting(std::sync::Mutex<usize>);
    impl Embedder for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            *self.0.lock().unwrap() += texts.len();
            HashedWords::new(8).embed_batch(texts)
        }
    }
    let counting = std::sync::Arc::new(Counting(std::sync::Mutex::new(0)));
    struct Shared(std::sync::Arc<Counting>);
    impl Embedder for Shared {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.embed_batch(texts)
        }
    }
    let cache = CachedEmbedder::new(Box::new(Shared(counting.clone())));
    let first = cache.embed(&["a b", "c", "a b"]).unwrap();
    let second = cache.embed(&["c", "d"]).unwrap();
    assert_eq!(*counting.0.lock().unwrap(), 3, "a b, c, d: once each");
    assert_eq!(first[0], first[2]);
    assert_eq!(first[1], second[0]);
}

#[test]
fn the_seed_skills_load_and_are_distinct_under_the_default_threshold() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/skills/seed.yaml");
    let file = SkillFile::load(&path).unwrap();
    assert_eq!(file.skills.len(), 15);
    assert!(file.skills.iter().all(|s| s.meta.seed));
    let embedder = CachedEmbedder::new(Box::new(minilm()));
    let mut bank = SkillBank::new(MemorySection::default_bank_config());
    for skill in &file.skills {
        let vector = embedder.embed(&[skill.text.embedding_text().as_str()]).unwrap().remove(0);
        let events = bank.admit(skill.id.clone(), skill.text.clone(), skill.meta.clone(), vector);
        assert_eq!(events.last().unwrap().kind, SkillEventKind::Added, "{}: {:?}", skill.id, events);
    }
}

#[test]
fn bad_skill_files_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let write = |text: &str| {
        let path = dir.path().join("bank.yaml");
        std::fs::write(&path, text).unwrap();
        SkillFile::load(&path).unwrap_err().to_string()
    };
    let error = write("skills:\n  - id: a\n    text: {description: d, trigger: t, query_template: q, colour: red}\n");
    assert!(error.contains("skills[0].text: unknown field `colour`"), "{error}");
    let error = write(
        "skills:\n  - {id: a, text: {description: d, trigger: t, query_template: q}}\n  - {id: a, text: {description: e, trigger: t, query_template: q}}\n",
    );
    assert!(error.contains("skills[1].id: `a` is empty or not unique"), "{error}");
    let error =
        write("skills:\n  - {id: a, text: {description: \"<answer>x</answer>\", trigger: t, query_template: q}}\n");
    assert!(error.contains("holds protocol tags"), "{error}");
}

#[test]
fn snapshots_read_back_into_the_same_skills() {
    let skills = vec![
        Skill {
            id: "seed-01".into(),
            text: SkillText {
                description: "d".into(),
                trigger: "t".into(),
                avoid: vec!["x".into(), "y".into()],
                query_template: "q".into(),
            },
            meta: SkillMeta { seed: true, ..SkillMeta::default() },
        },
        Skill {
            id: "s10-0".into(),
            text: SkillText { description: "e".into(), trigger: "u".into(), avoid: vec![], query_template: "r".into() },
            meta: SkillMeta {
                retrievals: 4,
                helps: 2,
                harms: 3,
                origin_step: 10,
                origin_failures: vec!["f7-1-2".into()],
                seed: false,
                version_added: 5,
            },
        },
    ];
    let batch = skills_batch(6, &skills).unwrap();
    let back: Vec<(u64, Skill)> = skills_from_batch(&batch).unwrap();
    assert_eq!(back, skills.into_iter().map(|s| (6, s)).collect::<Vec<_>>());
}

/// Real failures of the SmolLM2 solver on HotpotQA (recorded from `sesa ask`), distilled by the
/// same small model as judge, on both in-process backends: the JSON-schema constraint must give
/// well-formed skills.
#[tokio::test(flavor = "multi_thread")]
async fn the_local_model_distils_failures_into_well_formed_skills() {
    let candle = tokio::task::spawn_blocking(sesa_models::policy::testing::smollm2_candle).await.unwrap();
    distils_one_well_formed_skill(&candle).await;
    #[cfg(feature = "mistralrs")]
    distils_one_well_formed_skill(&sesa_models::policy::testing::smollm2(1).await).await;
}

async fn distils_one_well_formed_skill(policy: &dyn sesa_models::policy::Policy) {
    let failures = [
        FailureRecord {
            id: "f1-0-0".into(),
            question: "Which magazine was started first, Arthur's Magazine or First for Women?".into(),
            target: "Arthur's Magazine".into(),
            predicted: Some("First for Women".into()),
            skill_ids: vec![],
            digest: "searched \"Arthur's Magazine First for Women started\"; answered from one passage about First for Women".into(),
            searches: vec!["Arthur's Magazine First for Women started".into()],
            solved_searches: vec![],
        },
        FailureRecord {
            id: "f1-1-0".into(),
            question: "The director of the romantic comedy \"Big Stone Gap\" is based in what New York city?".into(),
            target: "Greenwich Village, New York City".into(),
            predicted: Some("Big Stone Gap".into()),
            skill_ids: vec!["seed-02".into()],
            digest: "searched \"Big Stone Gap\"; answered with the film's title instead of the director's city".into(),
            searches: vec!["Big Stone Gap".into()],
            solved_searches: vec![],
        },
    ];
    let template = crate::agent::PromptTemplate::load_kind(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/prompts/distill.yaml"),
        crate::agent::DISTILL_PROMPT,
    )
    .unwrap();
    let distiller = Distiller {
        policy,
        template: &template,
        max_skills: 1,
        max_tokens: 320,
        sampling: sesa_models::policy::Sampling::GREEDY,
    };
    let batches: [&[FailureRecord]; 1] = [&failures];
    let distilled = distiller.distill(&batches, &[7]).await.unwrap();
    eprintln!("{}: {distilled:#?}", policy.name());
    let out = &distilled[0];
    assert_eq!(out.malformed, Vec::<String>::new(), "{}", policy.name());
    assert_eq!(out.candidates.len(), 1);
    let skill = &out.candidates[0];
    assert_eq!(skill.sanitized().as_ref(), Some(skill), "candidates come out sanitised");
}
