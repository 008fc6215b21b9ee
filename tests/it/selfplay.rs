//! The SESA loop end to end with a scripted policy (a test double) on a small generated world:
//! fast, and exact about the loop's invariants and the differences between ablations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::{Array, Float64Array, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use sesa_engine::{ArtifactStore, Progress, ProgressMode, Run, RunOutcome, StopRequest, load_pipeline, read_table};
use sesa_models::policy::ScriptedPolicy;
use sesa_stages::agent::{PROPOSER_PROMPT, PromptTemplate, SOLVER_PROMPT};
use sesa_stages::data::world::{World, WorldConfig};
use sesa_stages::memory::{BankConfig, CachedEmbedder, HashedWords, SkillBank, UsageRule};
use sesa_stages::search::Bm25Index;
use sesa_stages::sections::AgentSection;
use sesa_stages::sections::MemorySection;
use sesa_stages::selfplay::{FailureQueue, InitialPolicy, LoopResources, SelfPlay, SkillMemory, Templates};

const QUEUE_CAPACITY: usize = 5;

fn prompts() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/prompts")
}

/// The text after the last `marker` in `text`, up to `end`.
fn after_last<'a>(text: &'a str, marker: &str, end: &str) -> &'a str {
    let rest = text.rsplit_once(marker).map_or("", |(_, r)| r);
    rest.split(end).next().unwrap_or(rest).trim()
}

fn encode(target: &str) -> String {
    target.chars().rev().collect::<String>().replace(' ', "_")
}

fn decode(code: &str) -> String {
    code.replace('_', " ").chars().rev().collect()
}

/// Plays every role. Proposals hide the target as a reversed code word (so the verifier can
/// answer and the answer is not in the question), some in the world's grammar; a third of
/// solver rollouts answer wrongly, by seed, so success rates vary, and a fifth search twice; a
/// SECRET- word (only evaluation questions have one) is decoded only with skills in the prompt,
/// so memory shows in evaluations; the distillation judge writes two skills per batch, the
/// second quoting the first failure's answer (a leak admission must reject).
fn script(context: &str, seed: u64) -> String {
    let response = context.rsplit_once("<|im_start|>assistant\n").map_or("", |(_, r)| r);
    let searched = response.matches("<information>").count();
    if context.contains("general strategies") {
        let first = after_last(context, "Failure 1:\nQuestion: ", "\n");
        let code = first.split_whitespace().find(|w| w.starts_with("CODE-")).unwrap_or("none");
        // A second skill leaks the first failure's answer: admission must reject it.
        let answer = after_last(context, "Failure 1:\nQuestion: ", "\nSolver").replace('\n', " ");
        let answer = answer.rsplit("Correct answer: ").next().unwrap_or("");
        return format!(
            r#"{{"skills": [{{"description": "Decode {code} before searching for it.", "trigger": "A question with a code word.", "avoid": ["guessing"], "query_template": "<code> decoded"}}, {{"description": "The answer is usually {answer}.", "trigger": "A question about a hidden entity.", "avoid": [], "query_template": "<entity>"}}]}}"#
        );
    }
    if context.contains("Materials:") {
        let question = after_last(context, "Question: ", "<|im_end|>");
        let code = question.split_whitespace().find_map(|w| w.strip_prefix("CODE-")).unwrap_or("");
        return format!("Answer: {}", decode(code.trim_end_matches('?')));
    }
    if context.contains("You write quiz questions") {
        let target = after_last(context, "Answer: ", ". Searches needed");
        // A search opened for it by guidance.
        if response.ends_with("<search>") {
            return format!("{target} once more</search>");
        }
        return match searched {
            0 => format!("<search>{target}</search>"),
            // A second search, which a hint can name without giving the answer away.
            1 => format!("<search>entity {}</search>", encode(target)),
            // Targets of odd length leak the answer: those proposals are invalid.
            _ if target.len() % 2 == 1 => format!("<question>Which entity is {target} in this world?</question>"),
            // Some read in the generated world's grammar (a one-hop question about the code word).
            _ if target.len().is_multiple_of(4) => {
                format!("<question>Who is CODE-{} married to?</question>", encode(target))
            }
            _ => format!("<question>Which entity hides behind the word CODE-{} here?</question>", encode(target)),
        };
    }
    let question = after_last(context, "Question: ", "<|im_end|>");
    // A search opened for it by a probe.
    if response.ends_with("<search>") {
        return format!("{question} once more</search>");
    }
    if searched == 0 {
        return format!("<search>{question}</search>");
    }
    // A fifth of the solver's turns after a first search search again (past the need at one
    // hop, for `excess_search_cost`); a hinted rollout answers after one, as it always has.
    if searched == 1 && seed % 5 == 4 && !context.contains("Hint: ") {
        return format!("<search>{question} more</search>");
    }
    if let Some(secret) = question.split_whitespace().find_map(|w| w.strip_prefix("SECRET-")) {
        return match context.contains("Search strategies that helped") {
            true => format!("<answer>{}</answer>", decode(secret)),
            false => "<answer>nobody</answer>".to_string(),
        };
    }
    match question.split_whitespace().find_map(|w| w.strip_prefix("CODE-")) {
        // A hint from the proposer's searches always helps.
        Some(code) if !seed.is_multiple_of(3) || context.contains("Hint: ") => {
            format!("<answer>{}</answer>", decode(code))
        }
        _ => "<answer>nobody</answer>".to_string(),
    }
}

struct Loop {
    _dir: tempfile::TempDir,
    run_dir: std::path::PathBuf,
    contexts: Arc<Mutex<Vec<String>>>,
}

/// One small world and its index for every loop test of this process (built once: faster).
pub(crate) fn world() -> &'static Path {
    static WORLD: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    WORLD
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let world = World::generate(WorldConfig { seed: 3, entities: 120, questions: 10 });
            world.write(&dir.path().join("world")).unwrap();
            Bm25Index::build(&dir.path().join("world/corpus.jsonl"), &dir.path().join("index"), |_| {}).unwrap();
            dir
        })
        .path()
}

const SPEC: &str = "\
name: scripted loop
seed: 5
steps: 4
stages:
  priming: {kind: priming, schedule: once, skills: SEEDS}
  propose:
    kind: propose
    after: [priming]
    targets: TARGETS
    batch: 6
    rules: {min_words: 4, min_searches: 1}
  verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}
  solve: {kind: solve, after: [verify], n_rollouts: 3}
  reward: {kind: reward, after: [solve], proposer: {shape: frontier, lambda: 0.5}}
  collect: {kind: collect, after: [reward]}
  consolidate: {kind: consolidate, after: [collect], schedule: {every: 2}, min_failures: 1, batch: 2}
";

/// The loop's resources with the scripted policy, recording every context it is given.
pub(crate) fn resources(dir: &Path, contexts: Arc<Mutex<Vec<String>>>) -> LoopResources {
    resources_with(dir, contexts, None, false, UsageRule::default())
}

/// How the scripted loop's memory credits and shows skills.
#[derive(Clone, Copy)]
struct MemoryRules {
    usage: UsageRule,
    /// Skills retrieved by pattern and shown as plans (`retrieve_by: pattern, show: plan`);
    /// else by question, in the prompt.
    plans: bool,
}

impl From<UsageRule> for MemoryRules {
    fn from(usage: UsageRule) -> MemoryRules {
        MemoryRules { usage, plans: false }
    }
}

/// [`resources`] with a `judge:` model, with `proposer_model`, a scripted proposer of its own
/// (the same script), and skills credited and shown by `memory`.
fn resources_with(
    dir: &Path,
    contexts: Arc<Mutex<Vec<String>>>,
    judge: Option<Arc<dyn sesa_models::policy::Policy>>,
    proposer_model: bool,
    memory: impl Into<MemoryRules>,
) -> LoopResources {
    let MemoryRules { usage, plans } = memory.into();
    use sesa_stages::sections::{RetrieveBy, ShowSkills};
    let proposer_policy: Option<Arc<dyn sesa_models::policy::Policy>> =
        proposer_model.then(|| Arc::new(ScriptedPolicy::new(script)) as _);
    let policy = ScriptedPolicy::new(move |context: &str, seed| {
        contexts.lock().unwrap().push(context.to_string());
        script(context, seed)
    });
    let load = |name: &str, kind| Some(PromptTemplate::load_kind(&prompts().join(name), kind).unwrap());
    let selfplay = SelfPlay {
        policy: Arc::new(policy),
        proposer_policy,
        judge,
        search: Arc::new(Arc::new(Bm25Index::open(&dir.join("index")).unwrap())),
        top_k: 2,
        agent: serde_yaml::from_str::<AgentSection>("{max_turns: 4, sampling: {temperature: 1.0}}").unwrap(),
        templates: Templates {
            solver: load("solver_small.yaml", SOLVER_PROMPT).unwrap(),
            proposer: load("proposer_small.yaml", PROPOSER_PROMPT),
            verifier: load("verifier.yaml", sesa_stages::agent::VERIFIER_PROMPT),
            judge: load("judge.yaml", sesa_stages::agent::JUDGE_PROMPT),
            distill: load("distill.yaml", sesa_stages::agent::DISTILL_PROMPT),
        },
        pool: Mutex::new(Vec::new()),
        initial: InitialPolicy::never_trained(),
    };
    let memory = SkillMemory {
        bank: Mutex::new(SkillBank::new(BankConfig { usage, ..MemorySection::default_bank_config() })),
        embedder: CachedEmbedder::new(Box::new(HashedWords::new(64))),
        top_k: 2,
        min_similarity: None,
        retrieve_by: if plans { RetrieveBy::Pattern } else { RetrieveBy::Question },
        show: if plans { ShowSkills::Plan } else { ShowSkills::Prompt },
        queue: Mutex::new(FailureQueue::new(QUEUE_CAPACITY)),
    };
    LoopResources::new(selfplay, Some(memory))
}

/// Runs SPEC with `edits` applied and returns the run's tables by name; with `crashed_after`,
/// the steps after that one are undone as by a crash and the run resumes with fresh resources.
async fn run_loop(edits: &[(&str, &str)]) -> (Loop, BTreeMap<String, Vec<(u64, RecordBatch)>>) {
    run_loop_interrupted(edits, None, UsageRule::default()).await
}

async fn run_loop_interrupted(
    edits: &[(&str, &str)],
    crashed_after: Option<u64>,
    memory: impl Into<MemoryRules>,
) -> (Loop, BTreeMap<String, Vec<(u64, RecordBatch)>>) {
    let memory = memory.into();
    let dir = tempfile::tempdir().unwrap();
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/skills/seed.yaml");
    let mut text = SPEC
        .replace("SEEDS", seeds.to_str().unwrap())
        .replace("TARGETS", world().join("world/targets.jsonl").to_str().unwrap());
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    let spec = dir.path().join("spec.yaml");
    std::fs::write(&spec, &text).unwrap();
    let pipeline = load_pipeline(&spec, &[], &sesa_stages::registry()).unwrap();

    let contexts = Arc::new(Mutex::new(Vec::new()));
    let root = ArtifactStore::open(dir.path().join("runs").to_str().unwrap()).unwrap();
    let mut run = Run::create(&root, pipeline, "test").await.unwrap();
    let first = resources_with(world(), contexts.clone(), None, false, memory);
    run = run.with_resources(|r| first.install(r));
    let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
    assert_eq!(run.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap(), RunOutcome::Completed);
    if let Some(after) = crashed_after {
        // As if the process died before the later steps committed: drop their commit records
        // and files, then resume with fresh resources rebuilt from the tables.
        let run_dir = dir.path().join("runs").join(run.id());
        for step in after + 1..=run.manifest().steps {
            std::fs::remove_file(run_dir.join(format!("commits/step-{step:08}.json"))).unwrap();
            for table in std::fs::read_dir(run_dir.join("tables")).unwrap() {
                let _ = std::fs::remove_dir_all(table.unwrap().path().join(format!("step={step}")));
            }
        }
        let mut resumed = Run::open(&root, run.id(), &sesa_stages::registry()).await.unwrap();
        assert_eq!(resumed.manifest().committed_steps, after);
        let fresh = resources_with(world(), contexts.clone(), None, false, memory);
        fresh.restore(&root, run.id()).await.unwrap();
        resumed = resumed.with_resources(|r| fresh.install(r));
        let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
        assert_eq!(resumed.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap(), RunOutcome::Completed);
    }
    let mut tables = BTreeMap::new();
    for table in [
        "proposals",
        "verifications",
        "rollouts",
        "rewards",
        "failures",
        "skills",
        "skill_events",
        "step_metrics",
        "evals",
    ] {
        tables.insert(table.to_string(), read_table(&root, run.id(), table).await.unwrap());
    }
    let run_dir = dir.path().join("runs").join(run.id());
    (Loop { _dir: dir, run_dir, contexts }, tables)
}

/// A list column of `batch`.
fn lists<'a>(batch: &'a RecordBatch, name: &str) -> &'a ListArray {
    batch.column_by_name(name).unwrap().as_any().downcast_ref::<ListArray>().unwrap()
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<String> {
    strings_of(batch.column_by_name(name).unwrap().as_any().downcast_ref::<StringArray>().unwrap())
}

fn strings_of(column: &StringArray) -> Vec<String> {
    column.iter().map(|v| v.unwrap_or_default().to_string()).collect()
}

fn booleans(batch: &RecordBatch, name: &str) -> Vec<bool> {
    let column = batch.column_by_name(name).unwrap().as_any().downcast_ref::<arrow_array::BooleanArray>().unwrap();
    (0..column.len()).map(|i| column.value(i)).collect()
}

/// A step's rollouts by question, in item order: each group's guided rows and its own.
fn groups(items: &[u64], guided: &[bool]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let questions: std::collections::BTreeSet<u64> = items.iter().copied().collect();
    questions.into_iter().map(|item| (0..items.len()).filter(|&j| items[j] == item).partition(|&j| guided[j])).collect()
}

fn unsigned(batch: &RecordBatch, name: &str) -> Vec<u64> {
    batch.column_by_name(name).unwrap().as_any().downcast_ref::<UInt64Array>().unwrap().values().to_vec()
}

fn floats(batch: &RecordBatch, name: &str) -> Vec<Option<f64>> {
    let column = batch.column_by_name(name).unwrap().as_any().downcast_ref::<Float64Array>().unwrap();
    (0..column.len()).map(|i| column.is_valid(i).then(|| column.value(i))).collect()
}

/// A step's `verifications` as each question's hop count, where it has one.
fn question_hops(verifications: &RecordBatch) -> BTreeMap<u64, u64> {
    unsigned(verifications, "item")
        .into_iter()
        .zip(verifications.column_by_name("hops").unwrap().as_any().downcast_ref::<UInt64Array>().unwrap())
        .filter_map(|(item, h)| h.map(|h| (item, h)))
        .collect()
}

/// Per step: its number, `rollouts`, the hop count of each question that has one, and `rewards`.
fn solver_steps(
    tables: &BTreeMap<String, Vec<(u64, RecordBatch)>>,
) -> impl Iterator<Item = (u64, &RecordBatch, BTreeMap<u64, u64>, &RecordBatch)> {
    tables["rollouts"].iter().zip(&tables["verifications"]).map(|((step, rollouts), (_, verifications))| {
        let rewards = &tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1;
        (*step, rollouts, question_hops(verifications), rewards)
    })
}

fn metric(tables: &BTreeMap<String, Vec<(u64, RecordBatch)>>, name: &str) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    for (step, batch) in &tables["step_metrics"] {
        let values = floats(batch, "value");
        for (metric, value) in strings(batch, "metric").iter().zip(values) {
            if metric == name {
                out.push((*step, value.unwrap()));
            }
        }
    }
    out
}

/// Which files of `table` exist, as `step=N/stage`.
fn writers(run_dir: &Path, table: &str) -> Vec<String> {
    let mut found = Vec::new();
    for partition in std::fs::read_dir(run_dir.join("tables").join(table)).unwrap() {
        let partition = partition.unwrap();
        for file in std::fs::read_dir(partition.path()).unwrap() {
            let name = file.unwrap().file_name().to_string_lossy().replace(".parquet", "");
            found.push(format!("{}/{name}", partition.file_name().to_string_lossy()));
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_loop_keeps_its_invariants() {
    let (lp, tables) = run_loop(&[]).await;
    // Only the solver sees skills: no other prompt holds a skills block, and every retrieval
    // event was written by `solve`.
    let contexts = lp.contexts.lock().unwrap();
    let with_skills: Vec<&String> = contexts.iter().filter(|c| c.contains("Search strategies that helped")).collect();
    assert!(!with_skills.is_empty(), "the solver saw skills");
    assert!(
        with_skills.iter().all(|c| c.contains("You answer questions by searching")),
        "only solver prompts hold skills"
    );
    for (step, batch) in &tables["skill_events"] {
        let events = strings(batch, "event");
        let retrieved = events.iter().filter(|e| *e == "retrieved").count();
        assert!(retrieved == 0 || retrieved == events.len(), "step {step}: retrievals share a file with other events");
    }
    let retrieval_writers: Vec<String> = writers(&lp.run_dir, "skill_events");
    assert!(retrieval_writers.iter().any(|w| w.ends_with("/solve")));
    assert!(!retrieval_writers.iter().any(|w| w.ends_with("/propose") || w.ends_with("/verify")));

    // The queue never holds more than its capacity, and it did fill up.
    let lengths = metric(&tables, "queue_length");
    assert!(!lengths.is_empty());
    assert!(lengths.iter().all(|(_, l)| *l <= QUEUE_CAPACITY as f64), "{lengths:?}");
    assert!(metric(&tables, "queue_dropped").iter().any(|(_, d)| *d > 0.0), "the queue never overflowed");

    // Consolidation ran on steps 2 and 4 only, and added distilled skills with their lineage.
    let distilled: Vec<u64> = metric(&tables, "distilled").iter().map(|(s, _)| *s).collect();
    assert_eq!(distilled, [2, 4]);
    let added: Vec<String> = tables["skill_events"]
        .iter()
        .flat_map(|(_, b)| strings(b, "event").into_iter().zip(strings(b, "skill_id")))
        .filter(|(e, id)| e == "added" && id.starts_with('s'))
        .map(|(_, id)| id)
        .collect();
    assert!(!added.is_empty(), "no distilled skill was admitted");
    // A candidate quoting its source failure's answer is rejected with the reason, never added.
    let leaks: Vec<(String, String)> = tables["skill_events"]
        .iter()
        .flat_map(|(_, b)| strings(b, "event").into_iter().zip(strings(b, "reason")))
        .filter(|(_, reason)| reason.contains("the answer of a failure it was distilled from"))
        .collect();
    assert!(!leaks.is_empty(), "no leaking candidate was rejected");
    assert!(leaks.iter().all(|(event, _)| event == "rejected"), "{leaks:?}");
    for (_, batch) in &tables["skills"] {
        assert!(strings(batch, "description").iter().all(|d| !d.starts_with("The answer is usually")));
    }

    // Skill usage counts only the rollouts of accepted proposed questions: at step 1 (seed
    // skills only, no eviction yet) the bank's retrievals are those of the proposed questions,
    // though reused or dummy questions retrieved skills too.
    let rollouts = &tables["rollouts"].iter().find(|(s, _)| *s == 1).unwrap().1;
    let (sources, items) = (strings(rollouts, "source"), unsigned(rollouts, "item"));
    let skill_ids = lists(rollouts, "skill_ids");
    let mut shown: BTreeMap<(bool, u64), usize> = BTreeMap::new();
    for i in 0..items.len() {
        shown.insert((sources[i] == "proposed", items[i]), skill_ids.value_length(i) as usize);
    }
    let counted: usize = shown.iter().filter(|((proposed, _), _)| *proposed).map(|(_, n)| n).sum();
    let uncounted: usize = shown.iter().filter(|((proposed, _), _)| !*proposed).map(|(_, n)| n).sum();
    assert!(counted > 0 && uncounted > 0, "step 1 has proposed ({counted}) and substitute ({uncounted}) retrievals");
    let retrievals = tables["skills"]
        .iter()
        .filter(|(s, _)| *s == 1)
        .map(|(_, b)| unsigned(b, "retrievals").iter().sum::<u64>())
        .max()
        .unwrap();
    assert_eq!(retrievals as usize, counted);

    // Frontier shaping: proposer rewards follow the shape at the recorded p̂.
    for (_, batch) in &tables["rewards"] {
        for ((role, reward), p) in
            strings(batch, "role").iter().zip(floats(batch, "reward")).zip(floats(batch, "p_hat"))
        {
            if let (true, Some(p)) = (role == "proposer", p) {
                let expected = if p > 0.0 && p < 1.0 { 4.0 * p * (1.0 - p) } else { -0.5 };
                assert!((reward.unwrap() - expected).abs() < 1e-12);
            }
        }
    }
    // Invalid proposals carry their reason.
    let reasons: Vec<String> = tables["proposals"].iter().flat_map(|(_, b)| strings(b, "reason")).collect();
    assert!(reasons.iter().any(|r| r == "the question contains the answer"), "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ablations_differ_exactly_where_they_should() {
    // − failure distillation: no collect, no consolidate; the bank keeps only its seeds.
    let (lp, tables) = run_loop(&[
        ("  collect: {kind: collect, after: [reward]}\n", ""),
        ("  consolidate: {kind: consolidate, after: [collect], schedule: {every: 2}, min_failures: 1, batch: 2}\n", ""),
    ])
    .await;
    let events: Vec<String> = tables["skill_events"].iter().flat_map(|(_, b)| strings(b, "event")).collect();
    assert!(events.iter().all(|e| e == "added" || e == "retrieved"), "{events:?}");
    let writers = writers(&lp.run_dir, "skill_events");
    assert!(writers.iter().all(|w| w.ends_with("/solve") || w == "step=1/priming"), "{writers:?}");
    assert!(tables["failures"].is_empty());

    // − frontier shaping: the proposer's reward is exactly 1 − p̂, failures of every question.
    let (_lp, tables) = run_loop(&[
        ("proposer: {shape: frontier, lambda: 0.5}", "proposer: {shape: adversarial}"),
        (
            "collect: {kind: collect, after: [reward]}",
            "collect: {kind: collect, after: [reward], frontier_only: false}",
        ),
    ])
    .await;
    let mut checked = 0;
    for (_, batch) in &tables["rewards"] {
        for ((role, reward), p) in
            strings(batch, "role").iter().zip(floats(batch, "reward")).zip(floats(batch, "p_hat"))
        {
            if let (true, Some(p)) = (role == "proposer", p) {
                assert_eq!(reward.unwrap(), 1.0 - p);
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

/// Invalid proposals are replaced by fallback questions no deeper than `fallback_max_hops`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_questions_can_be_limited_by_hop_count() {
    let questions = world().join("world/questions.jsonl");
    let verify = format!(
        "verify: {{kind: verify, after: [propose], noise: 2, invalid: reuse, pool_clear_interval: 1, fallback_questions: {}, fallback_max_hops: 1}}",
        questions.display()
    );
    let (_lp, tables) =
        run_loop(&[("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", &verify)]).await;
    let hops: BTreeMap<String, u8> = sesa_stages::data::datasets::load_questions(&questions)
        .unwrap()
        .into_iter()
        .map(|q| (q.question, q.hops.unwrap()))
        .collect();
    assert!(hops.values().any(|&h| h > 1), "the world has deeper questions to leave out");
    let mut reused = 0;
    for (_, batch) in &tables["verifications"] {
        for (source, question) in strings(batch, "source").iter().zip(strings(batch, "solver_question")) {
            if source == "substitute" && hops.contains_key(&question) {
                assert_eq!(hops[&question], 1, "{question}");
                reused += 1;
            }
        }
    }
    assert!(reused > 0, "no invalid proposal was replaced by a fallback question");
}

/// `min_substitutes`: that many of every step's replacements are substitutes even while the
/// reuse pool has questions; without it, once the pool fills, no substitute reaches the solver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_substitutes_keeps_fallback_questions_beside_a_full_pool() {
    let questions = world().join("world/questions.jsonl");
    // Per step: (replacements, substitutes among them).
    let counts = |tables: &BTreeMap<String, Vec<(u64, RecordBatch)>>| -> Vec<(usize, usize)> {
        tables["verifications"]
            .iter()
            .map(|(_, batch)| {
                let sources = strings(batch, "source");
                let replaced = sources.iter().filter(|s| *s != "proposed").count();
                (replaced, sources.iter().filter(|s| *s == "substitute").count())
            })
            .collect()
    };
    let mut per_arm = Vec::new();
    for extra in ["", ", min_substitutes: 2"] {
        let verify = format!(
            "verify: {{kind: verify, after: [propose], noise: 2, invalid: reuse, fallback_questions: {}{extra}}}",
            questions.display()
        );
        let (_lp, tables) =
            run_loop(&[("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", &verify)]).await;
        per_arm.push(counts(&tables));
    }
    let (pool_first, mixed) = (&per_arm[0], &per_arm[1]);
    assert!(
        pool_first.iter().skip(1).any(|&(replaced, substitutes)| replaced > 0 && substitutes == 0),
        "the pool should crowd substitutes out: {pool_first:?}"
    );
    for &(replaced, substitutes) in mixed {
        assert!(substitutes >= replaced.min(2), "{mixed:?}");
    }
}

/// With `pool_draw: distinct`, a step reuses each pooled question at most once (the rest of its
/// replacements come from the fallback questions, as with an empty pool); SSP's draws repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_pool_draws_reuse_each_question_once_a_step() {
    let questions = world().join("world/questions.jsonl");
    // (reused questions, of which repeats within their step)
    let draws = async |draw: &str| {
        let verify = format!(
            "verify: {{kind: verify, after: [propose], noise: 2, invalid: reuse, pool_clear_interval: 2, pool_draw: {draw}, fallback_questions: {}}}",
            questions.display()
        );
        let (_lp, tables) =
            run_loop(&[("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", &verify)]).await;
        let (mut reused, mut repeats) = (0, 0);
        for (_, batch) in &tables["verifications"] {
            let sources = strings(batch, "source");
            let questions = strings(batch, "solver_question");
            let mine: Vec<&String> =
                sources.iter().zip(&questions).filter(|(s, _)| *s == "reused").map(|(_, q)| q).collect();
            let distinct: std::collections::BTreeSet<&&String> = mine.iter().collect();
            reused += mine.len();
            repeats += mine.len() - distinct.len();
        }
        (reused, repeats)
    };
    let (reused, repeats) = draws("distinct").await;
    assert!(reused > 0 && repeats == 0, "{reused} reused, {repeats} repeated within a step");
    let (reused, repeats) = draws("with_replacement").await;
    assert!(
        reused > 0 && repeats > 0,
        "SSP's draws repeat a small pool's questions: {reused} reused, {repeats} repeated"
    );
}

/// SPEC with `verify` as its verify stage and nothing after it: only the verifier plays the
/// solver, with no solve stage nor what follows it.
async fn run_verifier_alone(verify: &str) -> (Loop, BTreeMap<String, Vec<(u64, RecordBatch)>>) {
    run_loop(&[
        ("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", verify),
        ("  solve: {kind: solve, after: [verify], n_rollouts: 3}\n", ""),
        ("  reward: {kind: reward, after: [solve], proposer: {shape: frontier, lambda: 0.5}}\n", ""),
        ("  collect: {kind: collect, after: [reward]}\n", ""),
        ("  consolidate: {kind: consolidate, after: [collect], schedule: {every: 2}, min_failures: 1, batch: 2}\n", ""),
    ])
    .await
}

/// With `reads: search` the verifier plays the solver's own loop, its searches answered from
/// the proposals' materials alone: no verifier prompt is rendered, every passage it reads was
/// retrieved by a proposer that step, and what it answers decides acceptance as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verifier_can_answer_by_searching_the_materials_alone() {
    let verify = "verify: {kind: verify, after: [propose], noise: 2, invalid: reuse, reads: search}";
    let (lp, tables) = run_verifier_alone(verify).await;
    let mut retrieved = std::collections::BTreeSet::new();
    for (_, batch) in &tables["proposals"] {
        for materials in strings(batch, "materials") {
            retrieved.extend(sesa_stages::search::parse_results(&materials).into_iter().map(|d| d.title));
        }
    }
    let contexts = lp.contexts.lock().unwrap();
    assert!(contexts.iter().all(|c| !c.contains("Materials:")), "no verifier prompt");
    let verifier: Vec<&String> = contexts.iter().filter(|c| c.contains("You answer questions by searching")).collect();
    let read: Vec<String> = verifier
        .iter()
        .flat_map(|c| c.split("<information>").skip(1).map(|b| b.split("</information>").next().unwrap()))
        .flat_map(|block| sesa_stages::search::parse_results(block).into_iter().map(|d| d.title))
        .collect();
    assert!(!read.is_empty(), "the verifier searched and read passages");
    assert!(read.iter().all(|title| retrieved.contains(title)), "{read:?} beyond {retrieved:?}");
    let (mut accepted, mut rejected) = (0, 0);
    for (_, batch) in &tables["verifications"] {
        let flags = booleans(batch, "accepted");
        let (targets, answers, questions) =
            (strings(batch, "target"), strings(batch, "verifier_answer"), strings(batch, "question"));
        for i in (0..batch.num_rows()).filter(|&i| !questions[i].is_empty()) {
            // The scripted solver decodes the question's code word, or answers "nobody".
            if flags[i] {
                assert_eq!(answers[i], targets[i]);
                accepted += 1;
            } else {
                assert_eq!(answers[i], "nobody");
                rejected += 1;
            }
        }
    }
    assert!(rejected > 0, "a wrong answer is rejected");
    assert!(accepted > 0, "some proposals were verified by searching");
}

/// `plan: true` beside `reads: search`: the verifier's response opens with the plan of the
/// question's chain where the question reads in the world's grammar, and with nothing written
/// where it does not; it still searches the materials and its answer still decides acceptance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_verifier_opens_with_the_chain_of_questions_in_the_worlds_grammar() {
    let verify = "verify: {kind: verify, after: [propose], noise: 2, invalid: reuse, reads: search, plan: true}";
    let (lp, tables) = run_verifier_alone(verify).await;
    let contexts = lp.contexts.lock().unwrap();
    let (mut planned, mut unplanned) = (0, 0);
    for context in contexts.iter().filter(|c| c.contains("You answer questions by searching")) {
        let question = after_last(context, "Question: ", "<|im_end|>");
        let response = context.rsplit_once("<|im_start|>assistant\n").map_or("", |(_, r)| r);
        match World::read_question(question) {
            Some((start, relations)) => {
                assert_eq!(relations, ["spouse"], "{question}");
                let plan = format!("<think>I need the spouse of {start}.</think>\n");
                assert!(response.starts_with(&plan), "{response:?} opens without {plan:?}");
                planned += 1;
            }
            None => {
                assert!(!response.contains("I need the"), "{question}: {response:?}");
                unplanned += 1;
            }
        }
    }
    assert!(planned > 0 && unplanned > 0, "{planned} planned and {unplanned} unplanned verifier turns");
    let mut accepted_in_grammar = 0;
    for (_, batch) in &tables["verifications"] {
        let flags = booleans(batch, "accepted");
        let (targets, answers, questions) =
            (strings(batch, "target"), strings(batch, "verifier_answer"), strings(batch, "question"));
        for i in (0..batch.num_rows()).filter(|&i| flags[i] && !questions[i].is_empty()) {
            assert_eq!(answers[i], targets[i]);
            accepted_in_grammar += usize::from(World::read_question(&questions[i]).is_some());
        }
    }
    assert!(accepted_in_grammar > 0, "a planned verifier accepted a question of the world's grammar");
}

/// Where the solver's questions come from and how each depth fares, per step: the shares of
/// `source_*` add up to the verifications' sources, and every per-hop metric is the mean over
/// its hop count of the rows it summarises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_sources_and_rates_per_hop_count_are_step_metrics() {
    let questions = world().join("world/questions.jsonl");
    let verify = format!(
        "verify: {{kind: verify, after: [propose], noise: 2, invalid: reuse, pool_clear_interval: 1, fallback_questions: {}}}",
        questions.display()
    );
    let (_lp, tables) =
        run_loop(&[("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", &verify)]).await;
    let by_step = |name: &str| -> BTreeMap<u64, f64> { metric(&tables, name).into_iter().collect() };
    let mut seen = BTreeMap::new();
    for (step, batch) in &tables["verifications"] {
        let sources = strings(batch, "source");
        for source in ["proposed", "reused", "substitute", "dummy"] {
            let share = sources.iter().filter(|s| *s == source).count() as f64 / sources.len() as f64;
            assert_eq!(by_step(&format!("source_{source}"))[step], share, "step {step}: {source}");
            *seen.entry(source).or_insert(0.0) += share;
        }
    }
    assert!(seen["proposed"] > 0.0 && seen["substitute"] > 0.0, "both sources occur: {seen:?}");
    // The path a question was built along: a substitute's chain, searched hop by hop.
    let chains: BTreeMap<String, Vec<String>> = sesa_stages::data::datasets::load_questions(&questions)
        .unwrap()
        .into_iter()
        .map(|q| {
            let searches = q.supporting_titles.iter().zip(&q.supporting_relations).map(|(t, r)| format!("{t} {r}"));
            (q.question, searches.collect())
        })
        .collect();
    let mut substitutes = 0;
    for (_, batch) in &tables["verifications"] {
        let paths = lists(batch, "path");
        for (i, (source, question)) in
            strings(batch, "source").iter().zip(strings(batch, "solver_question")).enumerate()
        {
            if source == "substitute" {
                let path = paths.value(i);
                let path: Vec<String> = strings_of(path.as_any().downcast_ref::<StringArray>().unwrap());
                assert_eq!(path, chains[&question], "{question}");
                substitutes += 1;
            }
        }
    }
    assert!(substitutes > 0);
    // valid_rate_h<n>: the proposals of n requested hops that were valid.
    let mut checked = 0;
    for (step, batch) in &tables["proposals"] {
        let hops = unsigned(batch, "hops");
        let valid = booleans(batch, "valid");
        for h in hops.iter().collect::<std::collections::BTreeSet<_>>() {
            let rows: Vec<usize> = (0..hops.len()).filter(|&i| hops[i] == *h).collect();
            let rate = rows.iter().filter(|&&i| valid[i]).count() as f64 / rows.len() as f64;
            assert_eq!(by_step(&format!("valid_rate_h{h}"))[step], rate, "step {step}, {h} hops");
            checked += 1;
        }
    }
    assert!(checked > 4, "more than one hop count a step");
    // The targets come from a generated world, so each question is read in it: the script's
    // code-word questions are outside its grammar, so they ask for nothing it can tell, none is
    // right, and an accepted one keeps its requested depth.
    for (step, batch) in &tables["proposals"] {
        let read = |name: &str| batch.column_by_name(name).unwrap().null_count();
        assert_eq!((read("world_answer"), read("world_hops")), (batch.num_rows(), batch.num_rows()), "step {step}");
        let hops = unsigned(batch, "hops");
        for h in hops.iter().collect::<std::collections::BTreeSet<_>>() {
            assert_eq!(by_step(&format!("right_rate_h{h}"))[step], 0.0, "step {step}, {h} hops");
        }
        assert_eq!(by_step("right_rate")[step], 0.0);
    }
    for (_, batch) in &tables["verifications"] {
        let (requested, hops) = (unsigned(batch, "requested_hops"), unsigned(batch, "hops"));
        let accepted = booleans(batch, "accepted");
        for i in (0..batch.num_rows()).filter(|&i| accepted[i]) {
            assert_eq!(hops[i], requested[i]);
        }
    }
    // solver_success_h<n>: the rollouts of questions of n hops that succeeded.
    for ((step, rollouts), (_, verifications)) in tables["rollouts"].iter().zip(&tables["verifications"]) {
        let hops = question_hops(verifications);
        let rewards = &tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1;
        let reward = floats(rewards, "reward");
        let mut per: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (i, item) in unsigned(rollouts, "item").into_iter().enumerate() {
            if let Some(h) = hops.get(&item) {
                let entry = per.entry(*h).or_default();
                entry.0 += f64::from(u8::from(reward[i].unwrap() > 0.0));
                entry.1 += 1.0;
            }
        }
        for (h, (successes, n)) in per {
            assert_eq!(by_step(&format!("solver_success_h{h}"))[step], successes / n, "step {step}, {h} hops");
        }
    }
}

/// `guidance: hint`: a proposed question whose rollouts all failed gets one more rollout with
/// the proposer's search path in its prompt, recorded under the prompt without it; p̂ (the
/// proposer's reward) ignores it; evaluation never sees a hint; and a run resumed after a crash
/// makes the same guided rollouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guidance_hints_groups_that_never_succeed_and_only_them() {
    let questions = world().join("world/questions.jsonl");
    let eval = format!(
        "  eval: {{kind: evaluate, after: [solve], benchmarks: {{world: {{questions: {}, limit: 3}}}}}}\n  consolidate:",
        questions.display()
    );
    let edits = [
        (
            "solve: {kind: solve, after: [verify], n_rollouts: 3}",
            "solve: {kind: solve, after: [verify], n_rollouts: 1, guidance: hint}",
        ),
        ("  consolidate:", eval.as_str()),
        ("collect: {kind: collect, after: [reward]}", "collect: {kind: collect, after: [reward], guided: true}"),
    ];
    let (lp, tables) = run_loop(&edits).await;
    // One rollout a question: no group is a frontier; the failures collected are those of
    // groups only a guided rollout solved, with its searches as the contrast.
    let failures: Vec<&RecordBatch> = tables["failures"].iter().map(|(_, b)| b).collect();
    assert!(failures.iter().map(|b| b.num_rows()).sum::<usize>() > 0, "no failure beyond the frontier was collected");
    for batch in failures {
        assert!(floats(batch, "p_hat").iter().all(|p| *p == Some(0.0)));
        let solved = lists(batch, "solved_searches");
        assert!((0..batch.num_rows()).all(|i| solved.value_length(i) > 0), "each has its guided success's searches");
    }
    let mut guided = 0;
    for ((step, rollouts), (_, proposals)) in tables["rollouts"].iter().zip(&tables["proposals"]) {
        let flags = booleans(rollouts, "guided");
        let (items, indices) = (unsigned(rollouts, "item"), unsigned(rollouts, "rollout"));
        let (sources, prompts, hints) =
            (strings(rollouts, "source"), strings(rollouts, "prompt"), strings(rollouts, "hint"));
        let rewards = &tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1;
        let (reward, p_hat) = (floats(rewards, "reward"), floats(rewards, "p_hat"));
        let searches: BTreeMap<u64, String> =
            unsigned(proposals, "item").into_iter().zip(strings(proposals, "target")).collect();
        for i in 0..rollouts.num_rows() {
            if !flags[i] {
                assert!(hints[i].is_empty());
                continue;
            }
            guided += 1;
            // One more rollout of a proposed question whose one rollout failed.
            assert_eq!(indices[i], 1);
            assert_eq!(sources[i], "proposed");
            let first = (0..rollouts.num_rows()).find(|&j| items[j] == items[i] && indices[j] == 0).unwrap();
            assert_eq!(reward[first], Some(0.0), "step {step}: a group that had succeeded was guided");
            assert_eq!(p_hat[i], Some(0.0), "p̂ counts the unguided rollout only");
            assert_eq!(reward[i], Some(1.0), "the scripted solver answers with a hint");
            // The hint names the proposer's second search and never the answer; the recorded
            // prompt is the unhinted one.
            let target = &searches[&items[i]];
            assert!(hints[i].contains(&format!("entity {}", encode(target))), "{}", hints[i]);
            assert!(!hints[i].to_lowercase().contains(&target.to_lowercase()), "{}", hints[i]);
            assert!(!prompts[i].contains("Hint: "), "the recorded prompt has no hint");
        }
    }
    assert!(guided > 0, "some group failed and was guided");
    assert_eq!(metric(&tables, "guided").iter().map(|(_, n)| *n).sum::<f64>(), guided as f64);
    let contexts = lp.contexts.lock().unwrap().clone();
    assert_eq!(
        contexts.iter().filter(|c| c.contains("Hint: ") && c.ends_with("<|im_start|>assistant\n")).count(),
        guided
    );
    let evaluated: Vec<&String> =
        contexts.iter().filter(|c| c.contains("Question: ") && !c.contains("CODE-")).collect();
    assert!(!evaluated.is_empty(), "the world's questions were evaluated");
    assert!(evaluated.iter().all(|c| !c.contains("Hint: ")), "evaluation never gets a hint");
    let (_b, resumed) = run_loop_interrupted(&edits, Some(2), UsageRule::default()).await;
    for table in ["verifications", "rollouts", "rewards"] {
        assert_eq!(tables[table], resumed[table], "table {table} differs after a resume");
    }
}

/// `guided_groups: all`: every proposed question's group gets its guided rollout, those that
/// succeeded too; p̂ still counts the unguided rollouts only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guided_groups_all_guides_groups_that_succeeded_too() {
    let edits = [(
        "solve: {kind: solve, after: [verify], n_rollouts: 3}",
        "solve: {kind: solve, after: [verify], n_rollouts: 2, guidance: hint, guided_groups: all}",
    )];
    let (_l, tables) = run_loop(&edits).await;
    let (mut guided_after_success, mut proposed) = (0, 0);
    for (step, rollouts) in &tables["rollouts"] {
        let flags = booleans(rollouts, "guided");
        let (items, sources) = (unsigned(rollouts, "item"), strings(rollouts, "source"));
        let rewards = &tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1;
        let (reward, p_hat) = (floats(rewards, "reward"), floats(rewards, "p_hat"));
        for (guided, own) in groups(&items, &flags) {
            assert_eq!(own.len(), 2);
            let successes = own.iter().filter(|&&j| reward[j].unwrap() > 0.0).count();
            if sources[own[0]] == "proposed" {
                proposed += 1;
                assert_eq!(guided.len(), 1, "step {step}: every proposed question's group is guided once");
                guided_after_success += usize::from(successes > 0);
            }
            for &j in own.iter().chain(&guided) {
                assert_eq!(p_hat[j], Some(successes as f64 / 2.0), "p̂ counts the unguided rollouts only");
            }
        }
    }
    assert!(proposed > 0 && guided_after_success > 0, "a group that succeeded was guided: {guided_after_success}");
}

/// `guidance: plan` with `guided_rollouts: 2` and `guided_min_hops: 2`: a question of two hops
/// or more in the generated world's grammar whose rollouts all failed gets two more rollouts
/// under the bare prompt, their responses opening with the written plan of the question's chain
/// (`loss_mask` 2), and a one-hop question none; p̂ ignores them; evaluation never opens with a
/// plan; and a run resumed after a crash makes the same guided rollouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guidance_plans_the_chain_of_questions_that_never_succeed() {
    let questions = world().join("world/questions.jsonl");
    let verify = format!(
        "verify: {{kind: verify, after: [propose], noise: 2, invalid: reuse, pool_clear_interval: 1, fallback_questions: {}}}",
        questions.display()
    );
    let eval = format!(
        "  eval: {{kind: evaluate, after: [solve], benchmarks: {{world: {{questions: {}, limit: 3}}}}}}\n  consolidate:",
        questions.display()
    );
    let edits = [
        ("verify: {kind: verify, after: [propose], noise: 2, invalid: reuse}", verify.as_str()),
        (
            "solve: {kind: solve, after: [verify], n_rollouts: 3}",
            "solve: {kind: solve, after: [verify], n_rollouts: 2, guidance: plan, guided_rollouts: 2, guided_min_hops: 2}",
        ),
        ("  consolidate:", eval.as_str()),
    ];
    let (lp, tables) = run_loop(&edits).await;
    let (mut guided, mut guided_turns, mut shallow_unguided, mut guided_at_bound) = (0, 0, 0, 0);
    for (step, rollouts) in &tables["rollouts"] {
        let flags = booleans(rollouts, "guided");
        let masks = lists(rollouts, "loss_mask");
        let (items, indices, turns) =
            (unsigned(rollouts, "item"), unsigned(rollouts, "rollout"), unsigned(rollouts, "turns"));
        let (questions, prompts, hints, responses) = (
            strings(rollouts, "question"),
            strings(rollouts, "prompt"),
            strings(rollouts, "hint"),
            strings(rollouts, "response"),
        );
        let rewards = &tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1;
        let (reward, p_hat) = (floats(rewards, "reward"), floats(rewards, "p_hat"));
        for i in 0..rollouts.num_rows() {
            let mask = masks.value(i);
            let mask = mask.as_any().downcast_ref::<UInt32Array>().unwrap();
            let hops = World::read_question(&questions[i]).map(|(_, relations)| relations.len());
            if !flags[i] {
                assert!(hints[i].is_empty());
                assert!(mask.iter().all(|m| m != Some(2)), "only a guided rollout has written tokens");
                // The first rollout of a one-hop group that failed throughout: left unguided.
                let group = (0..rollouts.num_rows()).filter(|&j| items[j] == items[i]);
                if hops == Some(1) && indices[i] == 0 && group.clone().all(|j| reward[j] == Some(0.0)) {
                    assert!(group.clone().all(|j| !flags[j]), "step {step}: a one-hop group was guided");
                    shallow_unguided += 1;
                }
                continue;
            }
            assert!(hops >= Some(2), "step {step}: `{}` is guided below guided_min_hops", questions[i]);
            guided_at_bound += usize::from(hops == Some(2));
            (guided, guided_turns) = (guided + 1, guided_turns + turns[i]);
            assert!([2, 3].contains(&indices[i]), "two more rollouts after the group's two");
            let companions = (0..rollouts.num_rows()).filter(|&j| items[j] == items[i] && flags[j] && j != i);
            assert_eq!(companions.map(|j| indices[j]).collect::<Vec<_>>(), [5 - indices[i]]);
            let group: Vec<usize> = (0..rollouts.num_rows()).filter(|&j| items[j] == items[i] && !flags[j]).collect();
            assert_eq!(group.len(), 2);
            assert!(
                group.iter().all(|&j| reward[j] == Some(0.0)),
                "step {step}: a group that had succeeded was guided"
            );
            assert_eq!(p_hat[i], Some(0.0), "p̂ counts the unguided rollouts only");
            // The plan of the question's own chain, in the response, not the prompt.
            let (start, relations) = World::read_question(&questions[i]).expect("a question of the world's grammar");
            let then: String = relations[1..].iter().map(|r| format!(", then the {r} of it")).collect();
            assert_eq!(hints[i], format!("<think>I need the {} of {start}{then}.</think>\n", relations[0]));
            assert!(responses[i].starts_with(&hints[i]));
            assert!(!prompts[i].contains("I need the"), "the recorded prompt is the bare one");
            let written = mask.iter().take_while(|&m| m == Some(2)).count();
            assert!(written > 0 && mask.iter().skip(written).all(|m| m != Some(2)), "the plan's tokens come first");
        }
    }
    assert!(guided > 0, "some substitute's group failed and was guided");
    assert!(shallow_unguided > 0, "no one-hop group failed throughout: the depth filter went untested");
    assert!(guided_at_bound > 0, "no two-hop question was guided: `guided_min_hops` is not inclusive");
    assert_eq!(metric(&tables, "guided").iter().map(|(_, n)| *n).sum::<f64>(), guided as f64);
    // Every context whose response opens with a plan is a turn of a guided rollout: evaluation
    // (of the same world's questions) never gets one.
    let contexts = lp.contexts.lock().unwrap().clone();
    let planned = contexts
        .iter()
        .filter(|c| c.rsplit_once("<|im_start|>assistant\n").is_some_and(|(_, r)| r.starts_with("<think>I need the")))
        .count();
    assert_eq!(planned as u64, guided_turns);
    let (_b, resumed) = run_loop_interrupted(&edits, Some(2), UsageRule::default()).await;
    for table in ["verifications", "rollouts", "rewards"] {
        assert_eq!(tables[table], resumed[table], "table {table} differs after a resume");
    }
}

/// `guidance: probe` on every group: each gets one more rollout whose answer tag is taken back
/// and `<search>` written until it has searched once more than any of its rollouts (the script
/// answers after one search, or two by seed, and writes no thoughts, so no " Next, the" is
/// written); the probe writes its query, is recorded guided with the written tag marked, p̂
/// ignores it, and a resumed run makes the same probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_search_once_more_than_their_group() {
    let edits = [(
        "solve: {kind: solve, after: [verify], n_rollouts: 3}",
        "solve: {kind: solve, after: [verify], n_rollouts: 2, guidance: probe, guided_groups: all}",
    )];
    let (_l, tables) = run_loop(&edits).await;
    let (mut probes, mut after_two, mut tags) = (0, 0, 0);
    for (step, rollouts) in &tables["rollouts"] {
        let flags = booleans(rollouts, "guided");
        let (items, indices) = (unsigned(rollouts, "item"), unsigned(rollouts, "rollout"));
        let (hints, responses, sources) =
            (strings(rollouts, "hint"), strings(rollouts, "response"), strings(rollouts, "source"));
        let searches = lists(rollouts, "searches");
        let masks = lists(rollouts, "loss_mask");
        let p_hat = floats(&tables["rewards"].iter().find(|(s, _)| s == step).unwrap().1, "p_hat");
        for (guided, own) in groups(&items, &flags) {
            assert_eq!((own.len(), guided.len()), (2, 1), "step {step}: two rollouts and a probe");
            let probe = guided[0];
            assert_eq!(indices[probe], 2);
            if sources[probe] == "dummy" {
                // SSP's dummy question holds the answer's tags: the script cannot search it.
                continue;
            }
            let most = own.iter().map(|&j| searches.value(j).len()).max().unwrap();
            assert_eq!(searches.value(probe).len(), most + 1, "step {step}: {}", responses[probe]);
            assert_eq!(hints[probe], format!("probe: {} searches", most + 1));
            let mask = masks.value(probe);
            let mask = mask.as_any().downcast_ref::<UInt32Array>().unwrap();
            // A tag written (a token per byte) wherever it answered too soon, each followed by
            // the query it wrote itself; none where it searched as much by itself.
            let written = mask.iter().filter(|&m| m == Some(2)).count();
            assert!(written.is_multiple_of("<search>".len()));
            assert_eq!(responses[probe].matches("once more</search>").count(), written / "<search>".len());
            tags += written / "<search>".len();
            assert!(own.iter().all(|&j| !responses[j].contains("once more")));
            let successes = own.iter().filter(|&&j| p_hat[j].unwrap() > 0.0).count();
            assert_eq!(p_hat[probe], p_hat[own[0]], "p̂ counts the unguided rollouts only ({successes})");
            (probes, after_two) = (probes + 1, after_two + usize::from(most == 2));
        }
    }
    assert!(probes > 0 && after_two > 0, "a group that searched twice was probed: {after_two} of {probes}");
    assert!(tags > 0, "no probe answered too soon: no tag was written");
    let (_b, resumed) = run_loop_interrupted(&edits, Some(2), UsageRule::default()).await;
    for table in ["verifications", "rollouts", "rewards"] {
        assert_eq!(tables[table], resumed[table], "table {table} differs after a resume");
    }
}

/// `propose.guidance: searches`: the script opens its question after two searches, where the
/// rules need three; each proposal gets one search opened for it, writes the query itself, is
/// recorded guided with the written tag marked, and resumes identically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposer_guidance_opens_the_searches_a_proposal_owes() {
    let edits =
        [("rules: {min_words: 4, min_searches: 1}", "rules: {min_words: 4, min_searches: 3}\n    guidance: searches")];
    let (_lp, tables) = run_loop(&edits).await;
    let mut checked = 0;
    for (step, proposals) in &tables["proposals"] {
        let (targets, responses) = (strings(proposals, "target"), strings(proposals, "response"));
        let (written, searches, masks) =
            (unsigned(proposals, "written_searches"), lists(proposals, "searches"), lists(proposals, "loss_mask"));
        let flags = booleans(proposals, "guided");
        let valid = booleans(proposals, "valid");
        for i in 0..proposals.num_rows() {
            assert_eq!((written[i], flags[i]), (1, true), "step {step}: {}", responses[i]);
            assert_eq!(searches.value(i).len(), 3, "{}", responses[i]);
            assert!(responses[i].contains(&format!("<search>{} once more</search>", targets[i])));
            let mask = masks.value(i);
            let mask = mask.as_any().downcast_ref::<UInt32Array>().unwrap();
            assert_eq!(mask.iter().filter(|&m| m == Some(2)).count(), "<search>".len(), "a token per byte");
            // Three distinct searches: only the targets that leak themselves are invalid.
            assert_eq!(valid[i], targets[i].len() % 2 == 0, "{}", targets[i]);
            checked += 1;
        }
    }
    assert!(checked > 0);
    let hops: std::collections::BTreeSet<u64> =
        tables["proposals"].iter().flat_map(|(_, p)| unsigned(p, "hops")).collect();
    for h in hops {
        let metrics = metric(&tables, &format!("written_searches_h{h}"));
        assert!(!metrics.is_empty() && metrics.iter().all(|(_, n)| *n == 1.0), "{h} hops: {metrics:?}");
    }
    let (_b, resumed) = run_loop_interrupted(&edits, Some(2), UsageRule::default()).await;
    for table in ["proposals", "verifications", "rollouts", "rewards"] {
        assert_eq!(tables[table], resumed[table], "table {table} differs after a resume");
    }
}

/// Greedy evaluation with the bank's skills in the solver's prompt and without: same
/// questions, one row each per step, the bank version recorded only with memory on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_runs_with_memory_on_and_off() {
    let questions = world().join("world/questions.jsonl");
    let questions = questions.to_str().unwrap();
    let stages = format!(
        "  eval_on: {{kind: evaluate, after: [solve], mode: memory_on, benchmarks: {{world: {{questions: {questions}, limit: 3}}}}}}\n  \
         eval_off: {{kind: evaluate, after: [solve], benchmarks: {{world: {{questions: {questions}, last: 3}}}}}}\n  consolidate:"
    );
    let (run, tables) = run_loop(&[("  consolidate:", &stages)]).await;
    let evals = &tables["evals"];
    assert_eq!(evals.len(), 2 * 4, "two evaluations a step, four steps");
    for (_, batch) in evals {
        assert_eq!(batch.num_rows(), 3);
        let mode = strings(batch, "mode");
        let banks = batch.column_by_name("bank_version").unwrap();
        let banks = banks.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap();
        let shown = lists(batch, "skill_ids");
        let shown: Vec<i32> = (0..batch.num_rows()).map(|i| shown.value_length(i)).collect();
        match mode[0].as_str() {
            "memory_on" => {
                assert!(banks.iter().all(|v| v.unwrap() >= 1), "the primed bank is version 1");
                assert_eq!(shown, [2; 3], "each question's prompt showed its top 2");
            }
            _ => {
                assert!(banks.iter().all(|v| v == Some(0)));
                assert_eq!(shown, [0; 3]);
            }
        }
    }
    // Memory on: the first three questions' prompts show skills; memory off: the last three's
    // never do.
    let contexts = run.contexts.lock().unwrap();
    let file = std::fs::read_to_string(world().join("world/questions.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let prompts = |q: &serde_json::Value| -> Vec<String> {
        let question = q["question"].as_str().unwrap();
        contexts.iter().filter(|c| c.contains(question)).cloned().collect()
    };
    for question in &lines[..3] {
        assert!(prompts(question).iter().any(|c| c.contains("Search strategies that helped")), "{question}");
    }
    for question in &lines[lines.len() - 3..] {
        let prompts = prompts(question);
        assert!(!prompts.is_empty(), "{question} was evaluated");
        assert!(prompts.iter().all(|c| !c.contains("Search strategies that helped")), "{question}");
    }
}

/// `memory.show: plan`: a primed rule-induced skill of a question's own pattern is written
/// into the memory-on evaluation's response as the plan of its chain, never into a prompt;
/// memory off writes nothing, and a question of another pattern is shown no skill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_of_the_questions_pattern_is_written_as_its_plan_with_memory_on_only() {
    let questions = world().join("world/questions.jsonl");
    let file = std::fs::read_to_string(&questions).unwrap();
    let lines: Vec<serde_json::Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let deep = lines.iter().position(|q| q["hops"].as_u64() == Some(2)).expect("a two-hop question");
    let (question, relations) = (lines[deep]["question"].as_str().unwrap(), &lines[deep]["supporting_relations"]);
    let (first, second) = (relations[0].as_str().unwrap(), relations[1].as_str().unwrap());
    let start = lines[deep]["supporting_titles"][0].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bank = dir.path().join("bank.yaml");
    let text = serde_json::json!({
        "description": "Search one hop at a time, 2 searches.",
        "trigger": sesa_stages::memory::question_pattern(question),
        "query_template": format!("<entity> {first} → <result 1> {second}"),
    });
    // The second is the first under another id: priming counts it as a duplicate it dropped.
    let skill = serde_json::json!({"skills": [{"id": "s1-0", "text": text}, {"id": "s1-1", "text": text}]});
    std::fs::write(&bank, serde_json::to_string(&skill).unwrap()).unwrap();
    let bank = bank.to_str().unwrap();
    let stages = format!(
        "  eval_on: {{kind: evaluate, after: [solve], mode: memory_on, benchmarks: {{world: {{questions: {q}}}}}}}\n  \
         eval_off: {{kind: evaluate, after: [solve], benchmarks: {{world: {{questions: {q}}}}}}}\n  consolidate:",
        q = questions.to_str().unwrap()
    );
    let memory = MemoryRules { usage: UsageRule::default(), plans: true };
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/skills/seed.yaml");
    let seeds = format!("skills: {}", seeds.to_str().unwrap());
    let bank = format!("skills: {bank}");
    let edits = [("  consolidate:", stages.as_str()), (seeds.as_str(), bank.as_str()), ("steps: 4", "steps: 1")];
    let (run, tables) = run_loop_interrupted(&edits, None, memory).await;
    let plan = format!("<think>I need the {first} of {start}, then the {second} of it.</think>");
    for (_, batch) in &tables["evals"] {
        let (mode, asked) = (strings(batch, "mode"), strings(batch, "question"));
        let shown = lists(batch, "skill_ids");
        for i in 0..batch.num_rows() {
            let expected = if mode[i] == "memory_on" && asked[i] == question { 1 } else { 0 };
            assert_eq!(shown.value_length(i), expected, "{}: {}", mode[i], asked[i]);
        }
    }
    let priming: BTreeMap<String, Option<f64>> = tables["step_metrics"]
        .iter()
        .flat_map(|(_, b)| (strings(b, "stage").into_iter().zip(strings(b, "metric"))).zip(floats(b, "value")))
        .filter(|((stage, _), _)| stage == "priming")
        .map(|((_, metric), value)| (metric, value))
        .collect();
    assert_eq!((priming["bank_size"], priming["rejected_duplicates"]), (Some(1.0), Some(1.0)));
    let contexts = run.contexts.lock().unwrap();
    let with_plan: Vec<&String> = contexts.iter().filter(|c| c.contains(&plan)).collect();
    assert!(!with_plan.is_empty(), "the plan {plan} was written");
    assert!(with_plan.iter().all(|c| c.contains(question)), "only into its own question's response");
    assert!(contexts.iter().all(|c| !c.contains("Search strategies that helped")), "no skill in any prompt");
    // Memory off answered the same question without it: one episode of each mode began bare.
    let bare = contexts.iter().filter(|c| c.contains(question) && !c.contains(&plan)).count();
    assert!(bare > 0, "memory off solved {question} with no plan");
}

/// Two evaluations of one generated benchmark start together (memory on and off do): one
/// generates the world and builds its index, the other waits and uses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_evaluations_of_one_generated_world_start_together() {
    let dir = tempfile::tempdir().unwrap();
    let bench = format!(
        "{{world: {{world: {{dir: {}, seed: 4, entities: 60, questions: 4}}}}}}",
        dir.path().join("bench").display()
    );
    let spec = format!(
        "name: twice\nseed: 1\nsteps: 1\nstages:\n  eval_a: {{kind: evaluate, benchmarks: {bench}}}\n  eval_b: {{kind: evaluate, benchmarks: {bench}}}\n"
    );
    std::fs::write(dir.path().join("spec.yaml"), spec).unwrap();
    let pipeline = load_pipeline(&dir.path().join("spec.yaml"), &[], &sesa_stages::registry()).unwrap();
    let resources = resources_with(world(), Arc::default(), None, false, UsageRule::default());
    let root = ArtifactStore::open(dir.path().join("runs").to_str().unwrap()).unwrap();
    let mut run = Run::create(&root, pipeline, "test").await.unwrap().with_resources(|r| resources.install(r));
    let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
    assert_eq!(run.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap(), RunOutcome::Completed);
    let evals = read_table(&root, run.id(), "evals").await.unwrap();
    assert_eq!(evals.iter().map(|(_, b)| b.num_rows()).sum::<usize>(), 8, "four questions, twice");
}

/// With a judge, evaluation reports the paper's accuracy: exact match first, then the judge's
/// verdict on the answers that missed; exact match stays its own metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_with_a_judge_counts_its_verdicts_as_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let questions = world().join("world/questions.jsonl");
    let spec = format!(
        "name: judged\nseed: 1\nsteps: 1\nstages:\n  eval: {{kind: evaluate, judge: true, benchmarks: {{world: {{questions: {}, sample: 6, sample_seed: 2}}}}}}\n",
        questions.display()
    );
    std::fs::write(dir.path().join("spec.yaml"), spec).unwrap();
    let pipeline = load_pipeline(&dir.path().join("spec.yaml"), &[], &sesa_stages::registry()).unwrap();
    // A judge that accepts the answer to a question of even length, and refuses the others.
    let judge = ScriptedPolicy::new(|context: &str, _| {
        let question = after_last(context, "Question: ", "\n");
        if question.len().is_multiple_of(2) { "Correct" } else { "Wrong" }.to_string()
    });
    let resources = resources_with(world(), Arc::default(), Some(Arc::new(judge)), false, UsageRule::default());
    let root = ArtifactStore::open(dir.path().join("runs").to_str().unwrap()).unwrap();
    let mut run = Run::create(&root, pipeline, "test").await.unwrap().with_resources(|r| resources.install(r));
    let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
    assert_eq!(run.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap(), RunOutcome::Completed);
    let evals = read_table(&root, run.id(), "evals").await.unwrap();
    let batch = &evals[0].1;
    assert_eq!(batch.num_rows(), 6, "a sample of six");
    let judged = booleans(batch, "judged");
    let accuracy = floats(batch, "accuracy");
    let ems = floats(batch, "em");
    let mut verdicts = 0;
    for (i, question) in strings(batch, "question").iter().enumerate() {
        // The scripted solver answers "nobody" to world questions: every answer misses exactly.
        assert_eq!(ems[i], Some(0.0));
        assert_eq!(judged[i], question.len().is_multiple_of(2), "{question}");
        assert_eq!(accuracy[i], Some(f64::from(u8::from(judged[i]))));
        verdicts += usize::from(judged[i]);
    }
    assert!(verdicts > 0 && verdicts < 6, "the judge said both: {verdicts}");
    let metrics = read_table(&root, run.id(), "step_metrics").await.unwrap();
    let metrics = &metrics[0].1;
    let names = strings(metrics, "metric");
    let values = floats(metrics, "value");
    let value = |name: &str| values[names.iter().position(|n| n == name).unwrap()].unwrap();
    assert_eq!(value("world/accuracy"), verdicts as f64 / 6.0);
    assert_eq!(value("average/accuracy"), value("world/accuracy"));
    assert_eq!(value("world/em"), 0.0);
}

/// `distiller: rules` distils with no model call: skills whose trigger is the question with its
/// code word masked, whose query is the successful rollout's search, and which hold no answer;
/// `distiller: episodic` keeps the successful rollouts as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_distillation_admits_masked_skills_without_a_model() {
    let (lp, tables) = run_loop(&[("batch: 2}\n", "batch: 2, distiller: rules}\n")]).await;
    assert!(!lp.contexts.lock().unwrap().iter().any(|c| c.contains("general strategies")), "a judge was called");
    // (A consolidation that changed nothing writes no snapshot: an empty batch.)
    let last = &tables["skills"].iter().rev().find(|(_, b)| b.num_rows() > 0).unwrap().1;
    let distilled: Vec<(String, String)> = strings(last, "skill_id")
        .into_iter()
        .zip(strings(last, "trigger").into_iter().zip(strings(last, "query_template")))
        .filter(|(id, _)| !id.starts_with("seed"))
        .map(|(_, text)| text)
        .collect();
    let events: Vec<(String, String)> = tables["skill_events"]
        .iter()
        .flat_map(|(_, b)| strings(b, "event").into_iter().zip(strings(b, "reason")))
        .filter(|(event, _)| event != "retrieved")
        .collect();
    assert!(!distilled.is_empty(), "no induced skill was admitted: {events:?}");
    let masked = ["Which entity hides behind the word <entity> here?", "Who is <entity> married to?"];
    for (trigger, template) in &distilled {
        assert!(masked.contains(&trigger.as_str()), "{trigger}");
        assert_eq!(template, trigger);
    }
    let failures = &tables["failures"];
    assert!(failures.iter().all(|(_, b)| b.column_by_name("solved_searches").is_some()));
    assert!(!events.iter().any(|(_, reason)| reason.contains("judge")), "{events:?}");

    // `episodic` keeps the successful rollout as it was: the question is its trigger.
    let (_, tables) = run_loop(&[("batch: 2}\n", "batch: 2, distiller: episodic}\n")]).await;
    let last = &tables["skills"].iter().rev().find(|(_, b)| b.num_rows() > 0).unwrap().1;
    let exemplars: Vec<String> = strings(last, "skill_id")
        .into_iter()
        .zip(strings(last, "trigger"))
        .filter(|(id, _)| !id.starts_with("seed"))
        .map(|(_, trigger)| trigger)
        .collect();
    assert!(!exemplars.is_empty());
    assert!(
        exemplars
            .iter()
            .all(|t| t.starts_with("Which entity hides behind the word CODE-") || t.starts_with("Who is CODE-")),
        "{exemplars:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_tables() {
    let (_a, first) = run_loop(&[]).await;
    let (_b, second) = run_loop(&[]).await;
    for table in ["proposals", "verifications", "rollouts", "rewards", "failures", "skills", "skill_events"] {
        assert_eq!(first[table], second[table], "table {table} differs between runs with the same seed");
    }
}

/// `excess_search_cost` multiplies a correct answer's reward by 1 − cost for each search past
/// its question's hop count; wrong answers and questions searched no more than needed keep
/// theirs, and p̂ still counts every correct answer a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_past_a_questions_hop_count_cost_a_correct_answer() {
    let reward = "reward: {kind: reward, after: [solve], proposer: {shape: frontier, lambda: 0.5}}";
    let costly =
        "reward: {kind: reward, after: [solve], proposer: {shape: frontier, lambda: 0.5}, excess_search_cost: 0.5}";
    let (_l, tables) = run_loop(&[(reward, costly)]).await;
    let mut costed = 0;
    for (step, rollouts, hops, rewards) in solver_steps(&tables) {
        let searches = lists(rollouts, "searches");
        let answers = rollouts.column_by_name("answer").unwrap().as_any().downcast_ref::<StringArray>().unwrap();
        let (items, targets) = (unsigned(rollouts, "item"), strings(rollouts, "target"));
        let (reward, p_hat) = (floats(rewards, "reward"), floats(rewards, "p_hat"));
        for i in 0..rollouts.num_rows() {
            let correct = answers.is_valid(i) && answers.value(i) == targets[i];
            let excess = hops.get(&items[i]).map_or(0, |&h| (searches.value_length(i) as u64).saturating_sub(h));
            let expected = if correct { 0.5f64.powi(excess as i32) } else { 0.0 };
            assert_eq!(reward[i], Some(expected), "step {step}, rollout {i}: {excess} searches past the need");
            costed += usize::from(correct && excess > 0);
            // p̂: the group's correct share, however many searches each took.
            let group: Vec<usize> = (0..rollouts.num_rows()).filter(|&j| items[j] == items[i]).collect();
            let successes = group.iter().filter(|&&j| answers.is_valid(j) && answers.value(j) == targets[j]).count();
            assert_eq!(p_hat[i], Some(successes as f64 / group.len() as f64));
        }
    }
    assert!(costed > 0, "some correct answer searched past its question's hop count");
}

/// `rewards.missteps` lists a solver rollout's turns that misjudged its question's depth: each
/// search past the hop count (one the turn limit left unrun included), and an answer before
/// it; `solver_misstep_rate` is the share of rollouts with one (this loop guides none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missteps_are_the_turns_that_search_past_or_answer_before_the_hop_count() {
    let (_l, tables) = run_loop(&[]).await;
    let (mut late, mut early) = (0, 0);
    for (step, rollouts, hops, rewards) in solver_steps(&tables) {
        let searches = lists(rollouts, "searches");
        let answers = rollouts.column_by_name("answer").unwrap().as_any().downcast_ref::<StringArray>().unwrap();
        let (items, outcomes) = (unsigned(rollouts, "item"), strings(rollouts, "outcome"));
        let missteps = lists(rewards, "missteps");
        let roles = strings(rewards, "role");
        let mut misjudged = (0.0, 0.0);
        for i in 0..rollouts.num_rows() {
            let turns: Vec<u32> = missteps.value(i).as_any().downcast_ref::<UInt32Array>().unwrap().values().to_vec();
            let made = searches.value_length(i) as u32;
            let expected: Vec<u32> = match hops.get(&items[i]) {
                Some(&h) => {
                    let h = h as u32;
                    let early = answers.is_valid(i) && made < h;
                    let unrun_past = outcomes[i] == "turn_limit" && made >= h;
                    (h..made).chain((early || unrun_past).then_some(made)).collect()
                }
                None => Vec::new(),
            };
            assert_eq!(turns, expected, "step {step}, rollout {i}: {made} searches, hops {:?}", hops.get(&items[i]));
            late += usize::from(turns.iter().any(|&t| t < made));
            early += usize::from(turns.last().is_some_and(|&t| t == made));
            if hops.contains_key(&items[i]) {
                misjudged = (misjudged.0 + f64::from(!turns.is_empty()), misjudged.1 + 1.0);
            }
        }
        assert!(
            (rollouts.num_rows()..missteps.len()).all(|i| roles[i] == "proposer" && missteps.value_length(i) == 0),
            "proposer rows have no missteps"
        );
        let rate = metric(&tables, "solver_misstep_rate").into_iter().find(|(s, _)| *s == step).map(|(_, v)| v);
        assert_eq!(rate, (misjudged.1 > 0.0).then(|| misjudged.0 / misjudged.1), "step {step}");
    }
    assert!(late > 0 && early > 0, "searches past the need ({late}) and answers before it ({early}) both occur");
}

/// `usage: counterfactual` answers the odd-numbered rollouts of a question shown skills without
/// them, and credits each skill with the difference: a help where the rollouts shown it
/// succeeded more often, a harm where less often; on every question but a dummy (step 1 asks
/// proposed and dummy questions, step 2 reused ones too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counterfactual_usage_credits_the_difference_a_skill_makes() {
    let (_l, tables) = run_loop_interrupted(&[], None, UsageRule::Counterfactual).await;
    // Per skill: (retrievals, helps, harms) in the bank at the end of a step.
    type Credits = BTreeMap<String, (u64, u64, u64)>;
    let bank_after = |step: u64| -> Credits {
        let bank = &tables["skills"].iter().rev().find(|(s, b)| *s == step && b.num_rows() > 0).unwrap().1;
        strings(bank, "skill_id")
            .into_iter()
            .zip(unsigned(bank, "retrievals").into_iter().zip(unsigned(bank, "helps")).zip(unsigned(bank, "harms")))
            .map(|(id, ((r, h), x))| (id, (r, h, x)))
            .collect()
    };
    let mut judged_sources = std::collections::BTreeSet::new();
    let mut before = Credits::new();
    for step in [1, 2] {
        let rollouts = &tables["rollouts"].iter().find(|(s, _)| *s == step).unwrap().1;
        let (items, indices, sources) =
            (unsigned(rollouts, "item"), unsigned(rollouts, "rollout"), strings(rollouts, "source"));
        let skill_ids = lists(rollouts, "skill_ids");
        let shown = |i: usize| strings_of(skill_ids.value(i).as_any().downcast_ref::<StringArray>().unwrap());
        let rewards = &tables["rewards"].iter().find(|(s, _)| *s == step).unwrap().1;
        let reward: BTreeMap<(u64, u64), f64> = strings(rewards, "role")
            .iter()
            .zip(unsigned(rewards, "item").into_iter().zip(unsigned(rewards, "rollout")))
            .zip(floats(rewards, "reward"))
            .filter(|((role, _), _)| *role == "solver")
            .map(|((_, key), r)| (key, r.unwrap()))
            .collect();
        // Per judging question: its skills, and (successes, rollouts) with and without them.
        type Outcomes = [(u64, u64); 2];
        let mut groups: BTreeMap<u64, (Vec<String>, Outcomes)> = BTreeMap::new();
        for i in 0..items.len() {
            let ids = shown(i);
            assert_eq!(ids.is_empty(), indices[i] % 2 == 1, "rollout {} of question {}: {ids:?}", indices[i], items[i]);
            if sources[i] == "dummy" {
                continue;
            }
            let group = groups.entry(items[i]).or_default();
            if !ids.is_empty() {
                judged_sources.insert(sources[i].clone());
                group.0 = ids;
            }
            let counts = &mut group.1[usize::from(indices[i] % 2 == 1)];
            counts.0 += u64::from(reward[&(items[i], indices[i])] > 0.0);
            counts.1 += 1;
        }
        let mut expected = Credits::new();
        for (ids, [(s, n), (s0, n0)]) in groups.values() {
            for id in ids {
                let e = expected.entry(id.clone()).or_default();
                e.0 += 1;
                e.1 += u64::from(s * n0 > s0 * n);
                e.2 += u64::from(s * n0 < s0 * n);
            }
        }
        assert!(expected.values().any(|e| e.1 + e.2 > 0), "step {step}: no question told skills apart: {expected:?}");
        // What the step added to each skill it kept (a skill evicted at the step is gone).
        let after = bank_after(step);
        let credited: Credits = after
            .iter()
            .map(|(id, &(r, h, x))| {
                let (r0, h0, x0) = before.get(id).copied().unwrap_or_default();
                (id.clone(), (r - r0, h - h0, x - x0))
            })
            .filter(|(_, (r, _, _))| *r > 0)
            .collect();
        expected.retain(|id, _| after.contains_key(id));
        assert_eq!(credited, expected, "step {step}");
        before = after;
    }
    assert!(judged_sources.len() > 1, "questions of one source only judged skills: {judged_sources:?}");
}

/// A run that crashed after step 2 and resumed (bank, failure queue and reuse pool rebuilt from
/// its tables) ends with exactly the tables of an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_loop_restores_its_memory_exactly() {
    let (_a, straight) = run_loop(&[]).await;
    let (_b, resumed) = run_loop_interrupted(&[], Some(2), UsageRule::default()).await;
    for table in ["proposals", "verifications", "rollouts", "rewards", "failures", "skills", "skill_events"] {
        assert_eq!(straight[table], resumed[table], "table {table} differs after a resume");
    }
}

/// `sesa skills show / diff / export / import` on a run's bank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sesa_skills_reads_a_runs_bank() {
    let (lp, _) = run_loop(&[]).await;
    let run = lp.run_dir.to_str().unwrap();
    let cwd = lp.run_dir.parent().unwrap();
    let show = crate::support::run_sesa(&["skills", "show", run, "--version", "1"], cwd);
    let text = crate::support::stdout(&show);
    assert!(text.starts_with("bank version 1: 15 skills (15 seed)\n"), "{text}");
    assert!(text.contains("seed-01"), "{text}");
    let latest = crate::support::stdout(&crate::support::run_sesa(&["skills", "show", run], cwd));
    let version = latest.strip_prefix("bank version ").and_then(|r| r.split(':').next()).unwrap().to_string();
    let diff = crate::support::stdout(&crate::support::run_sesa(&["skills", "diff", run, "1", &version], cwd));
    assert!(diff.lines().any(|l| l.starts_with("+ s2-")), "{diff}\n{latest}");
    assert!(diff.contains("(from f"), "lineage: {diff}");
    let missing = crate::support::run_sesa(&["skills", "show", run, "--version", "99"], cwd);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("has no bank version 99"));
    let export = cwd.join("bank.json");
    let exported = crate::support::run_sesa(&["skills", "export", run, "--out", export.to_str().unwrap()], cwd);
    assert_eq!(exported.status.code(), Some(0), "{}", String::from_utf8_lossy(&exported.stderr));
    let imported =
        crate::support::stdout(&crate::support::run_sesa(&["skills", "import", export.to_str().unwrap()], cwd));
    assert!(imported.contains("skills (15 seed,"), "{imported}");
}

/// One short step of `specs/quickstart.yaml` as a user runs it (`sesa run`), with the real
/// SmolLM2 and MiniLM on the CPU (both fetched into the model cache on first use): a warm start
/// on four demonstrations evaluated before and after on two questions, tiny batches and
/// budgets, consolidation on step 1. The summary names the warm start's effect in one line.
#[test]
fn a_short_real_run_of_the_quickstart() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().to_str().unwrap();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/quickstart.yaml");
    let overrides: Vec<String> = [
        "steps=1".to_string(),
        format!("world.dir={tmp}/world"),
        "world.entities=200".into(),
        format!("search.backend.index={tmp}/index"),
        format!("search.backend.corpus={tmp}/world/corpus.jsonl"),
        format!("stages.propose.targets={tmp}/world/targets.jsonl"),
        format!("stages.verify.fallback_questions={tmp}/world/questions.jsonl"),
        format!("stages.warmup.world.questions={tmp}/world/questions.jsonl"),
        "stages.warmup.world.held_out=2".into(),
        "stages.warmup.world.limit=4".into(),
        format!("stages.before.benchmarks={{held_out: {{questions: {tmp}/world/questions.jsonl, last: 2}}}}"),
        format!("stages.after.benchmarks={{held_out: {{questions: {tmp}/world/questions.jsonl, last: 2}}}}"),
        "stages.propose.batch=1".into(),
        "stages.solve.n_rollouts=2".into(),
        "agent.max_turns=2".into(),
        "agent.max_turn_tokens=24".into(),
        "agent.max_total_tokens=48".into(),
        "stages.consolidate.schedule=every_step".into(),
        "stages.consolidate.max_tokens=160".into(),
    ]
    .to_vec();
    let store = dir.path().join("runs");
    let mut args = vec!["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()];
    for set in &overrides {
        args.extend(["--set", set.as_str()]);
    }
    // From the repository, as the README's command runs it (the spec's prompts and seed skills).
    let output = crate::support::run_sesa_with(
        crate::support::ChildRegistry::Stages,
        &args,
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let summary = crate::support::stdout(&output);
    let effect: Vec<&str> = summary.lines().filter(|l| l.starts_with("held_out exact match: ")).collect();
    assert_eq!(effect.len(), 1, "{summary}");
    let points: Vec<&str> = effect[0].trim_start_matches("held_out exact match: ").split(" → ").collect();
    assert_eq!(points.len(), 2, "{summary}");
    assert!(points[0].ends_with("% (before, step 1)") && points[1].ends_with("% (after, step 1)"), "{summary}");
    let root = ArtifactStore::open(store.to_str().unwrap()).unwrap();
    let id = crate::support::only_run(&store).file_name().unwrap().to_string_lossy().into_owned();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let table = |name: &'static str| runtime.block_on(read_table(&root, &id, name)).unwrap();
    let proposals = table("proposals");
    assert_eq!(proposals[0].1.num_rows(), 1);
    let rollouts = table("rollouts");
    assert_eq!(rollouts[0].1.num_rows(), 2, "one question (proposed, reused or dummy), two rollouts");
    let exact = rollouts[0].1.column_by_name("tokens_exact").unwrap();
    let exact = exact.as_any().downcast_ref::<arrow_array::BooleanArray>().unwrap();
    assert!(exact.iter().all(|e| e == Some(true)), "the candle backend gives exact token ids");
    let versions = table("policy_versions");
    assert_eq!(versions[0].1.num_rows(), 1, "the warm start made a policy version");
    let evals = table("evals");
    assert_eq!(evals.iter().map(|(_, b)| b.num_rows()).sum::<usize>(), 4, "two questions before, two after");
    let seeds = table("skills");
    assert_eq!(seeds[0].1.num_rows(), 15, "priming's snapshot holds the seed skills");
    let consolidations = table("consolidations");
    let failures = table("failures");
    if failures.iter().any(|(_, b)| b.num_rows() > 0) {
        assert_eq!(consolidations[0].1.num_rows(), 1, "queued failures were distilled");
    }
}

/// A stand-in for an external trainer (the contract needs no torch): a shell script that checks
/// what sesa hands it and writes a result, fails or hangs, as the file `mode` says
/// (`model-fails-at-3`: only the trainer of `model:`'s weights fails, at step 3).
pub(crate) fn external_trainer(dir: &Path) -> (PathBuf, PathBuf) {
    let mode = dir.join("mode");
    let script = dir.join("trainer.sh");
    std::fs::write(
        &script,
        format!(
            r#"set -e
test "$1" = "$SESA_MANIFEST"
grep -qE '"contract": (1|2),' "$SESA_MANIFEST"
test -s "$(dirname "$SESA_MANIFEST")/batch.parquet"
case "$(cat {mode})" in
  fail) echo "boom: out of GPU memory" >&2; exit 3 ;;
  hang) sleep 60 ;;
  model-fails-at-3)
    if grep -q '"model": "model"' "$SESA_MANIFEST" && grep -q '"step": 3,' "$SESA_MANIFEST"; then
      echo "boom: the solver's trainer" >&2; exit 3
    fi ;;
esac
mkdir -p "$SESA_CHECKPOINT_DIR"
echo weights > "$SESA_CHECKPOINT_DIR/model.safetensors"
printf '{{"checkpoint": "%s", "metrics": {{"solver": {{"loss": 0.5, "optimizer_steps": 2}}}}}}' "$SESA_CHECKPOINT_DIR" > "$SESA_RESULT"
"#,
            mode = mode.display()
        ),
    )
    .unwrap();
    (script, mode)
}

/// The scripted loop's spec in `dir` with an `update` by the external `trainer` and a reload
/// command that appends `SESA_MODEL SESA_POLICY_VERSION SESA_CHECKPOINT` to a file, or fails
/// for `model` while `dir/reload-mode` says `model-fails`: the spec, the trainer's directory
/// and that file.
fn external_spec(dir: &Path, trainer: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let reloads = dir.join("reloads.txt");
    let reload = dir.join("reload.sh");
    let line = "\"$SESA_MODEL $SESA_POLICY_VERSION $SESA_CHECKPOINT\"";
    let refuse = format!(
        "if [ \"$(cat {} 2>/dev/null)\" = model-fails ] && [ \"$SESA_MODEL\" = model ]; then echo refused >&2; exit 4; fi",
        dir.join("reload-mode").display()
    );
    std::fs::write(&reload, format!("{refuse}\necho {line} >> {}\n", reloads.display())).unwrap();
    let external = dir.join("external");
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/skills/seed.yaml");
    let text = format!(
        "{}  update:\n    kind: update\n    after: [consolidate]\n    optimizer: {{lr: 1.0e-6}}\n    external: {{command: [sh, {}], dir: {}, timeout_s: 2, reload_command: [sh, {}]}}\n",
        SPEC.replace("SEEDS", seeds.to_str().unwrap())
            .replace("TARGETS", world().join("world/targets.jsonl").to_str().unwrap()),
        trainer.display(),
        external.display(),
        reload.display()
    );
    let spec = dir.join("spec.yaml");
    std::fs::write(&spec, &text).unwrap();
    (spec, external, reloads)
}

/// Creates a run of `spec` (or opens run `id`), restores `fresh` from it and runs it to its end
/// or first failure: the run's id, its committed steps and the outcome.
async fn external_attempt(
    root: &ArtifactStore,
    spec: &Path,
    id: Option<String>,
    fresh: LoopResources,
) -> (String, u64, Result<RunOutcome, String>) {
    let mut run = match &id {
        None => {
            let pipeline = load_pipeline(spec, &[], &sesa_stages::registry()).unwrap();
            Run::create(root, pipeline, "test").await.unwrap()
        }
        Some(id) => Run::open(root, id, &sesa_stages::registry()).await.unwrap(),
    };
    fresh.restore(root, run.id()).await.unwrap();
    run = run.with_resources(|r| fresh.install(r));
    let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
    let outcome = run.execute(&Progress::new(ProgressMode::Hidden), stop).await;
    (run.id().to_string(), run.manifest().committed_steps, outcome.map_err(|e| format!("{e:#}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_trainer_gets_each_steps_batch_and_a_failing_or_hanging_one_fails_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let (trainer, mode) = external_trainer(dir.path());
    let (spec, external, reloads) = external_spec(dir.path(), &trainer);
    let root = ArtifactStore::open(dir.path().join("runs").to_str().unwrap()).unwrap();
    let attempt = |id: Option<String>| external_attempt(&root, &spec, id, resources(world(), Arc::default()));

    // A trainer that exits non-zero fails the step: nothing of it is committed, and the error
    // names the command and shows its output.
    std::fs::write(&mode, "fail").unwrap();
    let (id, committed, outcome) = attempt(None).await;
    let error = outcome.unwrap_err();
    assert_eq!(committed, 0);
    assert!(error.contains("boom: out of GPU memory") && error.contains("sesa resume"), "{error}");
    assert!(external.join("step-00000001/batch.parquet").exists());

    // One that runs past its timeout is killed and fails the step too.
    std::fs::write(&mode, "hang").unwrap();
    let clock = std::time::Instant::now();
    let (_, committed, outcome) = attempt(Some(id.clone())).await;
    let error = outcome.unwrap_err();
    assert!(clock.elapsed() < std::time::Duration::from_secs(30), "{:?}", clock.elapsed());
    assert_eq!(committed, 0);
    assert!(error.contains("did not finish within timeout_s = 2 s"), "{error}");

    // Resumed with a working trainer, every step trains: the servers reload each checkpoint and
    // the next step's rollouts come from the new version.
    std::fs::write(&mode, "ok").unwrap();
    let (_, committed, outcome) = attempt(Some(id.clone())).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Completed);
    assert_eq!(committed, 4);
    let checkpoint = |step: u64| external.join(format!("step-{step:08}/checkpoint")).display().to_string();
    let reloaded = std::fs::read_to_string(&reloads).unwrap();
    let expected: Vec<String> = (1..=4).map(|v| format!("model {v} {}", checkpoint(v))).collect();
    assert_eq!(reloaded.lines().collect::<Vec<_>>(), expected);
    let versions = read_table(&root, &id, "policy_versions").await.unwrap();
    for (step, batch) in &versions {
        assert_eq!(unsigned(batch, "version"), [*step]);
        assert_eq!(strings(batch, "external_checkpoint"), [checkpoint(*step)]);
        assert_eq!(strings(batch, "method"), ["external"]);
    }
    for (step, batch) in read_table(&root, &id, "rollouts").await.unwrap() {
        assert!(unsigned(&batch, "policy_version").iter().all(|&v| v == step - 1), "step {step}");
    }
    let updates = read_table(&root, &id, "updates").await.unwrap();
    let (_, first) = &updates[0];
    assert_eq!(strings(first, "role"), ["proposer", "solver"]);
    assert_eq!(floats(first, "loss"), [Some(0.0), Some(0.5)], "the trainer's numbers, per role");

    // The batch holds both roles, proposer first; solver advantages are normalised per question.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(external.join("step-00000002/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["policy_version"], 1);
    assert_eq!(manifest["next_version"], 2);
    assert_eq!(manifest["previous_checkpoint"], checkpoint(1));
    let bytes = bytes::Bytes::from(std::fs::read(external.join("step-00000002/batch.parquet")).unwrap());
    let batch = sesa_engine::table::decode_parquet(bytes).unwrap();
    let roles = strings(&batch, "role");
    let proposals = roles.iter().take_while(|r| *r == "proposer").count();
    assert_eq!(proposals, 6, "the propose stage's batch");
    assert!(roles[proposals..].iter().all(|r| r == "solver"));
    let (groups, advantages) = (unsigned(&batch, "group"), floats(&batch, "advantage"));
    let mut sums: BTreeMap<u64, f64> = BTreeMap::new();
    for i in proposals..roles.len() {
        *sums.entry(groups[i]).or_default() += advantages[i].unwrap();
    }
    assert!(sums.values().all(|s| s.abs() < 1e-6), "{sums:?}");
}

/// With `proposer_model:`, each model gets its own manifest, batch and checkpoint, and the
/// servers reload only when both trainers succeeded; a reload that fails after the proposer's
/// names what to undo; a resumed run starts each model's next update from its own last
/// checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_trainer_trains_a_proposer_model_apart_and_reloads_only_when_both_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let (trainer, mode) = external_trainer(dir.path());
    let (spec, external, reloads) = external_spec(dir.path(), &trainer);
    let root = ArtifactStore::open(dir.path().join("runs").to_str().unwrap()).unwrap();
    let fresh = || resources_with(world(), Arc::default(), None, true, UsageRule::default());
    let checkpoint =
        |step: u64, model: &str| external.join(format!("step-{step:08}/{model}/checkpoint")).display().to_string();
    let manifest = |step: u64, model: &str| -> serde_json::Value {
        let path = external.join(format!("step-{step:08}/{model}/manifest.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };

    // The solver's server refuses its first reload after the proposer's took it: the step
    // fails, and the error says which server is ahead and what to load again.
    std::fs::write(&mode, "ok").unwrap();
    std::fs::write(dir.path().join("reload-mode"), "model-fails").unwrap();
    let (id, committed, outcome) = external_attempt(&root, &spec, None, fresh()).await;
    let error = outcome.unwrap_err();
    assert_eq!(committed, 0);
    assert!(error.contains("refused"), "{error}");
    assert!(
        error.contains(
            "`proposer_model:` already loaded this step's checkpoint; have it load its initial weights again"
        ),
        "{error}"
    );
    std::fs::remove_file(dir.path().join("reload-mode")).unwrap();
    std::fs::remove_file(&reloads).unwrap();

    // Step 3's solver trainer fails after the proposer's succeeded: nothing of step 3 is
    // committed or reloaded.
    std::fs::write(&mode, "model-fails-at-3").unwrap();
    let (_, committed, outcome) = external_attempt(&root, &spec, Some(id.clone()), fresh()).await;
    let error = outcome.unwrap_err();
    assert!(error.contains("boom: the solver's trainer"), "{error}");
    assert_eq!(committed, 2);
    assert!(external.join("step-00000003/proposer_model/result.json").exists(), "the proposer's trainer ran");
    let expected = |steps: u64| -> Vec<String> {
        (1..=steps)
            .flat_map(|v| {
                [
                    format!("proposer_model {v} {}", checkpoint(v, "proposer_model")),
                    format!("model {v} {}", checkpoint(v, "model")),
                ]
            })
            .collect()
    };
    assert_eq!(std::fs::read_to_string(&reloads).unwrap().lines().collect::<Vec<_>>(), expected(2));

    // Resumed with fresh resources, each model's step-3 update starts from its own step-2
    // checkpoint, and the run completes.
    std::fs::write(&mode, "ok").unwrap();
    let (_, committed, outcome) = external_attempt(&root, &spec, Some(id.clone()), fresh()).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Completed);
    assert_eq!(committed, 4);
    assert_eq!(std::fs::read_to_string(&reloads).unwrap().lines().collect::<Vec<_>>(), expected(4));
    for model in ["proposer_model", "model"] {
        let third = manifest(3, model);
        assert_eq!(third["model"], model);
        assert_eq!(third["contract"], 2, "a trainer for one model refuses it");
        assert_eq!(third["policy_version"], 2);
        assert_eq!(third["previous_checkpoint"], checkpoint(2, model));
        let roles: Vec<&str> = third["roles"].as_array().unwrap().iter().map(|r| r[0].as_str().unwrap()).collect();
        assert_eq!(roles, [if model == "model" { "solver" } else { "proposer" }]);
    }
    assert_eq!(manifest(1, "model")["previous_checkpoint"], serde_json::Value::Null);
    for (step, batch) in &read_table(&root, &id, "policy_versions").await.unwrap() {
        assert_eq!(strings(batch, "model"), ["proposer_model", "model"], "step {step}");
        assert_eq!(unsigned(batch, "version"), [*step, *step]);
        assert_eq!(
            strings(batch, "external_checkpoint"),
            [checkpoint(*step, "proposer_model"), checkpoint(*step, "model")]
        );
    }
    for table in ["proposals", "rollouts"] {
        for (step, batch) in read_table(&root, &id, table).await.unwrap() {
            assert!(unsigned(&batch, "policy_version").iter().all(|&v| v == step - 1), "{table}, step {step}");
        }
    }
    let updates = read_table(&root, &id, "updates").await.unwrap();
    assert_eq!(strings(&updates[0].1, "role"), ["proposer", "solver"]);
}
