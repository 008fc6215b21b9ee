//! `sesa ask`: one agent episode, printed for a person to read.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sesa_engine::spec::{SourceDoc, Spec};
use sesa_engine::{ArtifactStore, Registry, Run, pipeline_from_text};
use sesa_stages::agent::{Episode, Outcome, Role};
use sesa_stages::memory::SkillBank;
use sesa_stages::sections::AgentSetup;
use sesa_stages::sections::MemorySection;
use sesa_stages::selfplay::{Shown, SkillMemory};

/// Whose policy answers.
pub enum Asked<'a> {
    /// A spec's `model:` as written (its initial policy).
    Spec(&'a Path),
    /// A run's trained policy (the last version, or `version`), shown its last bank's skills
    /// when `memory` is set, as the run's `solve` shows them (a skills block in the prompt, or
    /// under `memory.show: plan` the plan written into the response).
    Run { location: &'a str, version: Option<u64>, memory: bool },
}

/// What to ask.
pub struct Ask<'a> {
    pub asked: Asked<'a>,
    pub overrides: &'a [String],
    pub role: Role,
    /// The question (solver) or the target answer (proposer).
    pub text: &'a str,
    pub hops: u8,
    pub seed: u64,
}

/// Runs one episode with the spec's (or run's) model, search, budgets and prompts, and prints it.
pub async fn ask(request: Ask<'_>, registry: &Registry) -> Result<u8> {
    let (spec, shown) = match request.asked {
        Asked::Spec(path) => {
            let mut source = SourceDoc::load(path).map_err(sesa_engine::SpecErrors::from)?;
            source.apply_overrides(request.overrides).map_err(sesa_engine::SpecErrors::from)?;
            (Spec::from_source(&source, registry)?, Shown::default())
        }
        Asked::Run { location, version, memory } => {
            let (spec, policy) = run_spec(location, version, request.overrides, registry).await?;
            let shown = match memory {
                true if request.role == Role::Proposer => bail!("--memory: only the solver is shown skills"),
                true => shown_skills(&spec, location, request.text).await?,
                false => Shown::default(),
            };
            eprintln!("asking {policy} of {location}{}", if memory { ", with its last bank" } else { "" });
            (spec, shown)
        }
    };
    let setup = AgentSetup::from_spec(&spec).await?;
    let values = match request.role {
        Role::Solver => BTreeMap::from([("question", request.text.to_string()), ("skills", shown.block)]),
        Role::Proposer => BTreeMap::from([("answer", request.text.to_string()), ("hops", request.hops.to_string())]),
    };
    let prompt = setup.policy.render_chat(&setup.template(request.role)?.render(&values));
    let run = setup.agent(request.role);
    let clock = std::time::Instant::now();
    let trajectory = run.run(&[Episode { written: shown.plan, ..Episode::new(prompt, request.seed) }]).await?.remove(0);
    let seconds = clock.elapsed().as_secs_f64();

    let colour = std::io::stdout().is_terminal();
    let paint = |code: &str, text: &str| if colour { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() };
    println!("{}", paint("2", &trajectory.prompt));
    let mut rest = trajectory.response.as_str();
    while let Some(start) = rest.find("\n<information>") {
        let end =
            rest[start..].find("</information>").map(|e| start + e + "</information>".len()).unwrap_or(rest.len());
        print!("{}", paint("1", &rest[..start]));
        print!("{}", paint("36", &rest[start..end]));
        rest = &rest[end..];
    }
    println!("{}", paint("1", rest));
    let (label, code) = match &trajectory.outcome {
        Outcome::Final(text) => (format!("{}: {text}", request.role.final_tag()), "32"),
        other => {
            (format!("ended without a final <{}>: {}", request.role.final_tag(), serde_json::to_string(other)?), "31")
        }
    };
    println!("\n{}", paint(code, &label));
    println!(
        "{} turns, {} searches, {} tokens generated in {seconds:.1}s{}",
        trajectory.turns.len(),
        trajectory.queries().len(),
        trajectory.generated_tokens(),
        if trajectory.tokens_exact { "" } else { " (token ids not exact: the backend does not give them)" }
    );
    Ok(0)
}

/// A run's spec with its trained policy in `model:` (exported once, as `sesa eval` does), and
/// that policy in words.
async fn run_spec(
    location: &str,
    version: Option<u64>,
    overrides: &[String],
    registry: &Registry,
) -> Result<(Spec, String)> {
    let (root_location, run_id) = crate::support::split_run_location(location)?;
    let root = ArtifactStore::open(&root_location)?;
    let run = Run::inspect(&root, &run_id, registry)
        .await
        .with_context(|| format!("`{location}` is not a run (for a spec, use --spec)"))?;
    let mut doc = run.pipeline().spec().resolved.clone();
    let spec = doc.as_mapping_mut().context("the run's spec is not a mapping")?;
    let policy = crate::eval::serve_trained_policy(&root, &run, version, spec).await?;
    let label = format!("the spec of {location}");
    let pipeline = pipeline_from_text(&serde_yaml::to_string(&doc)?, &label, overrides, registry)?;
    Ok((pipeline.spec().clone(), policy))
}

/// What the run's solver would be shown for `question` from its last bank, under the run's
/// `memory:` rules (`top_k`, `min_similarity`, `retrieve_by`, `show`): the prompt's skills
/// block, and under `show: plan` what the plan writes into the response.
async fn shown_skills(spec: &Spec, location: &str, question: &str) -> Result<Shown> {
    let section = spec.section::<MemorySection>().context("--memory: the run has no `memory:` section")?;
    let (version, skills) = crate::skills::bank_at(location, None).await?;
    let embedder = section.open_embedder().await?;
    let bank = SkillBank::embedded(section.bank_config(), skills, version, &embedder)?;
    let shown = SkillMemory::new(&section, bank, embedder).shown(question)?;
    let how = if shown.plan.is_some() { "read into the plan" } else { "in the prompt" };
    for (id, description, similarity) in &shown.skills {
        eprintln!("skill {id} (bank version {version}, cosine {similarity:.2}, {how}): {description}");
    }
    if shown.skills.is_empty() {
        eprintln!("no skill of bank version {version} is shown for this question");
    }
    Ok(shown)
}
