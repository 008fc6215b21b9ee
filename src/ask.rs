//! `sesa ask`: one agent episode, printed for a person to read.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::Result;
use sesa_engine::Registry;
use sesa_engine::spec::{SourceDoc, Spec};
use sesa_stages::agent::{Episode, Outcome, Role};
use sesa_stages::sections::AgentSetup;

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

/// Runs one episode with the spec's model, search, budgets and prompts, and prints it.
pub async fn ask(request: Ask<'_>, registry: &Registry) -> Result<u8> {
    let mut source = SourceDoc::load(request.spec).map_err(sesa_engine::SpecErrors::from)?;
    source.apply_overrides(request.overrides).map_err(sesa_engine::SpecErrors::from)?;
    let spec = Spec::from_source(&source, registry)?;
    let setup = AgentSetup::from_spec(&spec).await?;
    let values = match request.role {
        Role::Solver => BTreeMap::from([("question", request.text.to_string())]),
        Role::Proposer => BTreeMap::from([("answer", request.text.to_string()), ("hops", request.hops.to_string())]),
    };
    let prompt = setup.policy.render_chat(&setup.template(request.role)?.render(&values));
    let run = setup.agent(request.role);
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
