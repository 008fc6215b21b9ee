//! `sesa ask`: one agent episode, printed for a person to read.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sesa_engine::Registry;
use sesa_engine::spec::{SourceDoc, Spec};
use sesa_stages::agent::{AgentRun, Episode, Outcome, PROPOSER_PROMPT, PromptTemplate, Role, SOLVER_PROMPT};
use sesa_stages::search::SearchConfig;
use sesa_stages::sections::{AgentSection, ModelSection, PromptsSection};

/// What to ask.
pub struct Ask<'a> {
    pub spec: &'a Path,
    pub overrides: &'a [String],
    pub role: Role,
    /// The question (solver) or the target answer (proposer).
    pub text: &'a str,
    pub hops: u8,
    pub seed: u64,
}

fn section<T: std::any::Any + Send + Sync>(spec: &Spec, key: &str) -> Result<std::sync::Arc<T>> {
    spec.section::<T>().with_context(|| format!("the spec has no `{key}:` section, which `sesa ask` needs"))
}

/// Runs one episode with the spec's model, search, budgets and prompts, and prints it.
pub async fn ask(request: Ask<'_>, registry: &Registry) -> Result<u8> {
    let mut source = SourceDoc::load(request.spec).map_err(sesa_engine::SpecErrors::from)?;
    source.apply_overrides(request.overrides).map_err(sesa_engine::SpecErrors::from)?;
    let spec = Spec::from_source(&source, registry)?;
    let model = section::<ModelSection>(&spec, "model")?;
    let search_config = section::<SearchConfig>(&spec, "search")?;
    let agent = section::<AgentSection>(&spec, "agent")?;
    let prompts = section::<PromptsSection>(&spec, "prompts")?;
    let (path, kind, values) = match request.role {
        Role::Solver => {
            (prompts.solver.clone(), SOLVER_PROMPT, BTreeMap::from([("question", request.text.to_string())]))
        }
        Role::Proposer => {
            let Some(path) = prompts.proposer.clone() else {
                bail!("the spec's `prompts:` has no `proposer` template")
            };
            (
                path,
                PROPOSER_PROMPT,
                BTreeMap::from([("answer", request.text.to_string()), ("hops", request.hops.to_string())]),
            )
        }
    };
    let template = PromptTemplate::load_kind(&path, kind)?;
    let search = search_config.open()?;
    let policy = model.open().await?;
    let prompt = policy.render_chat(&template.render(&values));
    let run = AgentRun {
        role: request.role,
        policy: policy.as_ref(),
        search: search.as_ref(),
        top_k: search_config.top_k,
        limits: agent.limits(),
        sampling: agent.sampling,
    };
    let clock = std::time::Instant::now();
    let trajectory = run.run(&[Episode { prompt, seed: request.seed }]).await?.remove(0);
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
        other => (format!("ended without a {}: {}", request.role.final_tag(), serde_json::to_string(other)?), "31"),
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
