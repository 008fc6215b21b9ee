//! What the loop's stages share in a run, opened once from the spec's sections: the policy,
//! search, templates and judge ([`SelfPlay`]), and the skill memory ([`SkillMemory`]) when the
//! spec has a `memory:` section. Their state (bank, failure queue, reuse pool) lives in memory
//! during a run and is rebuilt from the run's tables when it resumes.

use std::path::Path;
use std::sync::{Arc, Mutex};

use sesa_engine::spec::Spec;
use sesa_engine::{ArtifactStore, ConfigProblem, Resources, RunError, read_table};

use super::rules::FailureQueue;
use super::stages::ExternalCheckpoint;
use super::training::{ProposerTraining, TrainedModel, Training, model_column};
use crate::agent::{
    DISTILL_PROMPT, JUDGE_PROMPT, PROPOSER_PROMPT, PromptKind, PromptTemplate, Role, SOLVER_PROMPT, VERIFIER_PROMPT,
};
use crate::memory::{CachedEmbedder, FailureRecord, SkillBank, skills_from_batch};
use crate::search::Search;
use crate::sections::{
    AgentSection, AgentSetup, JudgeSection, ModelSection, PromptsSection, ProposerModelSection, SetupError,
};
use crate::sections::{MemorySection, RetrieveBy, ShowSkills, TrainerSection};
use sesa_engine::columns::Reader;
use sesa_models::policy::Policy;

/// The prompt templates of the loop, loaded and checked.
pub struct Templates {
    /// The solver's.
    pub solver: PromptTemplate,
    /// The proposer's.
    pub proposer: Option<PromptTemplate>,
    /// The RAG verifier's.
    pub verifier: Option<PromptTemplate>,
    /// The answer judge's.
    pub judge: Option<PromptTemplate>,
    /// The distillation judge's.
    pub distill: Option<PromptTemplate>,
}

impl Templates {
    fn load(prompts: &PromptsSection) -> Result<Templates, SetupError> {
        let optional = |path: &Option<std::path::PathBuf>, kind: PromptKind| {
            path.as_ref().map(|p| PromptTemplate::load_kind(p, kind)).transpose()
        };
        Ok(Templates {
            solver: PromptTemplate::load_kind(&prompts.solver, SOLVER_PROMPT)?,
            proposer: optional(&prompts.proposer, PROPOSER_PROMPT)?,
            verifier: optional(&prompts.verifier, VERIFIER_PROMPT)?,
            judge: optional(&prompts.judge, JUDGE_PROMPT)?,
            distill: optional(&prompts.distill, DISTILL_PROMPT)?,
        })
    }

    /// A template the spec must name for a stage to run.
    pub fn require<'a>(
        template: &'a Option<PromptTemplate>,
        key: &str,
    ) -> Result<&'a PromptTemplate, sesa_engine::StageError> {
        template.as_ref().ok_or_else(|| {
            sesa_engine::StageError::Failed(format!("the spec's `prompts:` section needs a `{key}` template"))
        })
    }
}

/// A question the solver already faced, kept for SSP's `reuse` of invalid proposals.
#[derive(Debug, Clone, PartialEq)]
pub struct PooledQuestion {
    /// The step that accepted it.
    pub step: u64,
    /// The question.
    pub question: String,
    /// Its answer.
    pub target: String,
    /// The hops its proposer was asked for.
    pub hops: Option<u64>,
}

/// The policy, search and templates of the loop.
pub struct SelfPlay {
    /// The policy of `model:`: the solver's, and the proposer's too unless it has its own (as
    /// in SSP). It also verifies, and judges without a judge.
    pub policy: Arc<dyn Policy>,
    /// The proposer's own policy (`proposer_model:`), when the spec gives it one.
    pub proposer_policy: Option<Arc<dyn Policy>>,
    /// The judge (`judge:`), when the spec names one; stages fall back to the policy.
    pub judge: Option<Arc<dyn Policy>>,
    /// The search tool.
    pub search: Arc<dyn Search>,
    /// Passages per search.
    pub top_k: usize,
    /// Budgets and sampling.
    pub agent: AgentSection,
    /// Prompt templates.
    pub templates: Templates,
    /// Accepted questions for the `reuse` strategy.
    pub pool: Mutex<Vec<PooledQuestion>>,
    /// The policy before any training, for `evaluate`'s `base` mode.
    pub initial: InitialPolicy,
}

/// The policy as the spec's `model:` opens it, before any update: `evaluate`'s `base` mode.
/// While the served policy is still at version 0 it is that policy; after an update an
/// in-process backend loads a second, untrained copy once.
pub struct InitialPolicy {
    model: Option<ModelSection>,
    opened: tokio::sync::OnceCell<Arc<dyn Policy>>,
}

impl InitialPolicy {
    /// The initial policy of a spec's `model:` section.
    pub fn of(model: ModelSection) -> InitialPolicy {
        InitialPolicy { model: Some(model), opened: tokio::sync::OnceCell::new() }
    }

    /// For a policy that never trains (a scripted one in tests): the served policy is the
    /// initial one at every version.
    pub fn never_trained() -> InitialPolicy {
        InitialPolicy { model: None, opened: tokio::sync::OnceCell::new() }
    }

    /// The initial policy, given the one being served.
    pub async fn get(&self, served: &Arc<dyn Policy>) -> Result<Arc<dyn Policy>, sesa_engine::StageError> {
        let Some(model) = &self.model else { return Ok(served.clone()) };
        if let ModelSection::Candle(config) = model
            && config.policy_version > 0
        {
            return Err(sesa_engine::StageError::Failed(format!(
                "the spec's model is policy version {} of a run, not an initial policy: evaluate `base` \
                 with the spec the run was made from",
                config.policy_version
            )));
        }
        if served.version() == 0 {
            return Ok(served.clone());
        }
        if let ModelSection::Openai(config) = model {
            return Err(sesa_engine::StageError::Failed(format!(
                "evaluating the initial policy after policy version {} is served: the server at {} now \
                 serves trained weights. Evaluate `base` before the first update, or with \
                 `sesa eval SPEC --mode base` against a server that serves the initial weights",
                served.version(),
                config.base_url
            )));
        }
        let opened = self.opened.get_or_try_init(|| model.open()).await;
        Ok(opened.map_err(|e| sesa_engine::StageError::Failed(format!("opening the initial policy: {e}")))?.clone())
    }
}

impl SelfPlay {
    /// The policy that plays `role`.
    pub fn policy_of(&self, role: Role) -> &Arc<dyn Policy> {
        match (role, &self.proposer_policy) {
            (Role::Proposer, Some(proposer)) => proposer,
            _ => &self.policy,
        }
    }

    /// The judge, or the policy when the spec names no judge.
    pub fn judge_or_policy(&self) -> &dyn Policy {
        self.judge.as_deref().unwrap_or(self.policy.as_ref())
    }
}

/// The skill memory of a run: the bank, the embedder and the failures waiting for
/// consolidation. Only the solver's stages use it (see the module docs of `memory`).
pub struct SkillMemory {
    /// The bank.
    pub bank: Mutex<SkillBank>,
    /// The embedder, cached by text.
    pub embedder: CachedEmbedder,
    /// Skills per question in the solver's prompt, at most.
    pub top_k: usize,
    /// The cosine to the question a skill needs to be shown (none: the top-k always are).
    pub min_similarity: Option<f32>,
    /// What a question is compared with.
    pub retrieve_by: RetrieveBy,
    /// How a retrieved skill reaches the solver.
    pub show: ShowSkills,
    /// Failures waiting for consolidation.
    pub queue: Mutex<FailureQueue>,
}

impl SkillMemory {
    /// A memory under a spec's `memory:` rules holding `bank`, with an empty failure queue.
    pub fn new(section: &MemorySection, bank: SkillBank, embedder: CachedEmbedder) -> SkillMemory {
        SkillMemory {
            bank: Mutex::new(bank),
            embedder,
            top_k: section.top_k,
            min_similarity: section.min_similarity,
            retrieve_by: section.retrieve_by,
            show: section.show,
            queue: Mutex::new(FailureQueue::new(section.queue_capacity)),
        }
    }
}

/// The loop's resources, before they are handed to the engine.
pub struct LoopResources {
    selfplay: Arc<SelfPlay>,
    memory: Option<Arc<SkillMemory>>,
    training: Option<Arc<Training>>,
    proposer_training: Option<Arc<Training>>,
    external: Arc<ExternalCheckpoint>,
}

impl LoopResources {
    /// Resources built by hand (tests, embedding sesa in another program).
    pub fn new(selfplay: SelfPlay, memory: Option<SkillMemory>) -> LoopResources {
        LoopResources {
            selfplay: Arc::new(selfplay),
            memory: memory.map(Arc::new),
            training: None,
            proposer_training: None,
            external: Arc::default(),
        }
    }

    /// Drops the skill memory, as for a spec without `memory:` (tests).
    pub fn without_memory(mut self) -> LoopResources {
        self.memory = None;
        self
    }

    /// Adds a trainer (tests, embedding sesa in another program).
    pub fn with_training(mut self, training: Training) -> LoopResources {
        self.training = Some(Arc::new(training));
        self
    }

    /// What a spec's training stages (`warmup`, `update`) would get wrong, checked with its
    /// other resources before a run is created: stages that train in process while the policy
    /// is not served in process, and external updates of a model that is trained in process
    /// too or whose servers nobody tells to reload (each would fail or go wrong in its first
    /// step, after the step's rollouts); and stages that read the policy in no `after:` order
    /// with a training stage (the policy version they record would depend on which finished
    /// first).
    pub fn training_problems(spec: &Spec) -> Vec<ConfigProblem> {
        super::checks::training_problems(spec)
    }

    /// Opens everything the spec's sections describe: generates the world and builds the index
    /// if they are missing, fetches and loads models. `None` when the spec has no `model:`
    /// section (nothing of the loop to run).
    pub async fn open(spec: &Spec) -> Result<Option<LoopResources>, SetupError> {
        let Some(model) = spec.section::<ModelSection>() else {
            return Ok(None);
        };
        let AgentSetup { policy, search, top_k, agent, prompts } = AgentSetup::from_spec(spec).await?;
        // In-process training needs the weights file the policy serves.
        let trainer = spec.section::<TrainerSection>().map(|s| (*s).clone()).unwrap_or_default();
        let trainer_for = async |model: &ModelSection, trained| -> Result<_, SetupError> {
            Ok(match model {
                ModelSection::Candle(config) => Some(Arc::new(Training::new(
                    trained,
                    trainer.clone(),
                    crate::sections::local_model(&config.model).await?,
                ))),
                _ => None,
            })
        };
        let training = trainer_for(&model, TrainedModel::Model).await?;
        let (proposer_policy, proposer_training) = match spec.section::<ProposerModelSection>() {
            Some(proposer) => {
                (Some(proposer.0.open().await?), trainer_for(&proposer.0, TrainedModel::ProposerModel).await?)
            }
            None => (None, None),
        };
        let judge = match spec.section::<JudgeSection>() {
            Some(judge) => Some(judge.0.open().await?),
            None => None,
        };
        let memory = match spec.section::<MemorySection>() {
            Some(section) => {
                let embedder = section.open_embedder().await?;
                Some(Arc::new(SkillMemory::new(&section, SkillBank::new(section.bank_config()), embedder)))
            }
            None => None,
        };
        if let Some(top) = served_block_inputs(spec, &trainer) {
            for policy in std::iter::once(&policy).chain(&proposer_policy) {
                policy.block_inputs(&[], top)?;
            }
        }
        let selfplay = SelfPlay {
            policy,
            proposer_policy,
            judge,
            search,
            top_k,
            agent,
            templates: Templates::load(&prompts)?,
            pool: Mutex::new(Vec::new()),
            initial: InitialPolicy::of((*model).clone()),
        };
        Ok(Some(LoopResources {
            selfplay: Arc::new(selfplay),
            memory,
            training,
            proposer_training,
            external: Arc::default(),
        }))
    }

    /// Rebuilds the state of a run being resumed from its committed tables: the bank from its
    /// last snapshot, the failure queue by replaying collections and consolidations, the reuse
    /// pool from the verifications (the verify stage drops what its clearing interval expired).
    pub async fn restore(&self, root: &ArtifactStore, run_id: &str) -> Result<(), RunError> {
        let corrupt = |e: String| RunError::Corrupt { location: format!("run {run_id}"), reason: e };
        if let Some(memory) = &self.memory {
            let snapshots = read_table(root, run_id, "skills").await?;
            let mut latest: Option<(u64, Vec<crate::memory::Skill>)> = None;
            for (_, batch) in &snapshots {
                for (version, skill) in skills_from_batch(batch).map_err(|e| corrupt(e.to_string()))? {
                    match &mut latest {
                        Some((v, skills)) if *v == version => skills.push(skill),
                        Some((v, _)) if *v > version => {}
                        _ => latest = Some((version, vec![skill])),
                    }
                }
            }
            if let Some((version, skills)) = latest {
                let config = memory.bank.lock().expect("bank lock").config().clone();
                let restored = SkillBank::embedded(config, skills, version, &memory.embedder)
                    .map_err(|e| corrupt(e.to_string()))?;
                *memory.bank.lock().expect("bank lock") = restored;
            }
            let mut failures = read_table(root, run_id, "failures").await?;
            let consolidations = read_table(root, run_id, "consolidations").await?;
            let mut queue = memory.queue.lock().expect("queue lock");
            let mut consumed_at = std::collections::BTreeMap::new();
            for (step, batch) in &consolidations {
                let reader = Reader::new("consolidations", batch);
                let ids: Vec<String> =
                    reader.strs("failure_ids").map_err(|e| corrupt(e.to_string()))?.into_iter().flatten().collect();
                consumed_at.entry(*step).or_insert_with(Vec::new).extend(ids);
            }
            failures.sort_by_key(|(step, _)| *step);
            let mut steps: Vec<u64> = failures.iter().map(|(s, _)| *s).chain(consumed_at.keys().copied()).collect();
            steps.sort_unstable();
            steps.dedup();
            for step in steps {
                for (_, batch) in failures.iter().filter(|(s, _)| *s == step) {
                    for record in failure_records(batch).map_err(|e| corrupt(e.to_string()))? {
                        queue.push(record);
                    }
                }
                if let Some(ids) = consumed_at.get(&step) {
                    queue.remove(ids);
                }
            }
        }
        for training in self.training.iter().chain(&self.proposer_training) {
            training.restore(root, run_id, training.model.served_by(&self.selfplay).as_ref()).await?;
        }
        // Each model's last version by an external trainer: the servers hold it (they reloaded
        // it before the step committed), and the model's next update starts from its checkpoint.
        let mut last = std::collections::BTreeMap::new();
        for (_, batch) in read_table(root, run_id, "policy_versions").await? {
            let reader = Reader::new("policy_versions", &batch);
            let versions = reader.u64("version").map_err(|e| corrupt(e.to_string()))?;
            let paths = reader.str("external_checkpoint").map_err(|e| corrupt(e.to_string()))?;
            let models = model_column("policy_versions", &batch).map_err(|e| corrupt(e.to_string()))?;
            for ((model, version), path) in models.into_iter().zip(versions).zip(paths) {
                if !path.is_empty() {
                    last.insert(model, (version, path.to_string()));
                }
            }
        }
        for (model, (version, path)) in last {
            model.served_by(&self.selfplay).reloaded(version, Path::new(&path)).map_err(|e| corrupt(e.to_string()))?;
            self.external.set(model, path);
        }
        let mut restored = Vec::new();
        for (step, batch) in read_table(root, run_id, "verifications").await? {
            restored.extend(pooled(step, &batch).map_err(|e| corrupt(e.to_string()))?);
        }
        self.selfplay.pool.lock().expect("pool lock").extend(restored);
        Ok(())
    }

    /// Hands the resources to a run.
    pub fn install(self, resources: &mut Resources) {
        resources.insert(self.selfplay);
        if let Some(memory) = self.memory {
            resources.insert(memory);
        }
        if let Some(training) = self.training {
            resources.insert(training);
        }
        if let Some(training) = self.proposer_training {
            resources.insert(Arc::new(ProposerTraining(training)));
        }
        resources.insert(self.external);
    }
}

/// The top blocks that `spec`'s in-process updates train from the served model's block inputs
/// (`served_block_inputs`, LoRA on the top blocks), for the policies to keep them from the
/// first rollout on (else the first update computes them all anew).
fn served_block_inputs(spec: &Spec, trainer: &TrainerSection) -> Option<usize> {
    let top = trainer.update_top_layers()?;
    let reads = |stage: &sesa_engine::spec::StageInstance| {
        stage.kind == <super::stages::Update as sesa_engine::Stage>::KIND
            && serde_json::from_value::<super::stages::UpdateConfig>(stage.config().clone())
                .is_ok_and(|config| config.served_block_inputs && config.external.is_none())
    };
    spec.stages.iter().any(reads).then_some(top)
}

/// The first step whose accepted questions are still in the reuse pool at `step`: the pool is
/// emptied at the start of steps 1, k + 1, 2k + 1, ...
pub fn pool_start(step: u64, interval: u64) -> u64 {
    if step == 0 || interval == 0 { step } else { (step - 1) / interval * interval + 1 }
}

/// The accepted questions of the `verifications` batch of `step`.
pub fn pooled(step: u64, batch: &arrow_array::RecordBatch) -> Result<Vec<PooledQuestion>, sesa_engine::StageError> {
    let reader = Reader::new("verifications", batch);
    let accepted = reader.bool("accepted")?;
    let questions = reader.opt_str("question")?;
    let targets = reader.str("target")?;
    // Runs written before the column existed restore their pool without hop counts.
    let hops = reader.opt_u64("hops").unwrap_or_else(|_| vec![None; reader.rows()]);
    Ok((0..reader.rows())
        .filter(|&i| accepted[i])
        .filter_map(|i| {
            questions[i].map(|q| PooledQuestion {
                step,
                question: q.to_string(),
                target: targets[i].to_string(),
                hops: hops[i],
            })
        })
        .collect())
}

/// The failure records of a `failures` batch.
pub fn failure_records(batch: &arrow_array::RecordBatch) -> Result<Vec<FailureRecord>, sesa_engine::StageError> {
    let reader = Reader::new("failures", batch);
    let ids = reader.str("failure_id")?;
    let questions = reader.str("question")?;
    let targets = reader.str("target")?;
    let predicted = reader.opt_str("predicted")?;
    let skills = reader.strs("skill_ids")?;
    let digests = reader.str("digest")?;
    let searches = reader.strs("searches")?;
    let solved = reader.strs("solved_searches")?;
    Ok((0..reader.rows())
        .map(|i| FailureRecord {
            id: ids[i].to_string(),
            question: questions[i].to_string(),
            target: targets[i].to_string(),
            predicted: predicted[i].map(str::to_string),
            skill_ids: skills[i].clone(),
            digest: digests[i].to_string(),
            searches: searches[i].clone(),
            solved_searches: solved[i].clone(),
        })
        .collect())
}
