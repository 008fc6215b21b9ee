//! Everything a spec names outside the run, checked before a run is created or resumed: the
//! files and programs it reads and starts (checked by the engine) and the servers it calls
//! (probed here), every missing one reported at once with how to provide it; and stages that
//! would train in process without an in-process policy.

use std::path::Path;
use std::time::Duration;

use sesa_engine::spec::{Location, Spec, SpecError, SpecErrors};
use sesa_stages::selfplay::LoopResources;

/// How long a server may take to answer the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks the requirements of `spec`; the error lists every unmet one.
pub async fn check(spec: &Spec) -> Result<(), SpecErrors> {
    let mut problems: Vec<SpecError> = LoopResources::training_problems(spec)
        .into_iter()
        .map(|problem| SpecError::Type {
            location: Location { file: None, line: None, argument: None },
            key: problem.key,
            message: problem.message,
        })
        .collect();
    if let Err(unmet) = requirements(spec).await {
        problems.extend(unmet.0);
    }
    if problems.is_empty() { Ok(()) } else { Err(SpecErrors(problems)) }
}

/// [`check`] for a spec file a user named: a refusal also names the file's CPU variant, if it
/// has one (`cpu/<same name>` beside it, as `specs/cpu/` holds for the paper's specs), which runs
/// without any server.
pub async fn check_file(spec: &Spec, path: &Path) -> anyhow::Result<()> {
    let Err(problems) = check(spec).await else { return Ok(()) };
    let variant = path.parent().map(|dir| dir.join("cpu")).zip(path.file_name()).map(|(dir, name)| dir.join(name));
    let problems = anyhow::Error::new(problems);
    match variant.filter(|variant| variant.is_file()) {
        Some(variant) => Err(problems.context(format!(
            "without these servers, on a CPU: `sesa run {}`, this spec at CPU scale",
            variant.display()
        ))),
        None => Err(problems),
    }
}

async fn requirements(spec: &Spec) -> Result<(), SpecErrors> {
    let client = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build().ok();
    sesa_engine::requirement::check(&spec.requirements, |url, listing| {
        let client = client.clone();
        async move {
            match client {
                Some(client) => probe(&client, &url, listing.as_deref()).await,
                None => Some("no HTTP client could be built to reach it".into()),
            }
        }
    })
    .await
}

/// Why the server at `url` does not do, or `None`. Without `listing`, any answer below 500
/// shows it is up (a retriever answers only `POST`); with it, the answer must be a model list
/// (OpenAI's `{"data": [{"id"}]}`, or any text) that names it.
async fn probe(client: &reqwest::Client, url: &str, listing: Option<&str>) -> Option<String> {
    let response = match client.get(url).send().await {
        Ok(response) => response,
        Err(error) if error.is_timeout() => {
            return Some(format!("{url} did not answer within {} s", PROBE_TIMEOUT.as_secs()));
        }
        Err(error) if error.is_connect() => return Some(format!("nothing answers at {url} (cannot connect)")),
        Err(error) => return Some(format!("nothing answers at {url} ({error})")),
    };
    let status = response.status();
    if status.is_server_error() {
        return Some(format!("{url} answered {status}"));
    }
    let name = listing?;
    // A server that wants a key is up; the key itself is checked by the first request.
    if matches!(status.as_u16(), 401 | 403) {
        return None;
    }
    if !status.is_success() {
        return Some(format!("{url} answered {status}, not a model list"));
    }
    let body = response.text().await.unwrap_or_default();
    let served: Option<Vec<String>> = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|json| {
        let ids = json.get("data")?.as_array()?.iter().filter_map(|m| m.get("id")?.as_str().map(String::from));
        Some(ids.collect())
    });
    match served {
        Some(ids) if ids.iter().any(|id| id == name) => None,
        Some(ids) => Some(format!("{url} serves {}, not `{name}`", list(&ids))),
        None if body.contains(name) => None,
        None => Some(format!("{url} does not list `{name}`")),
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "no model".into()
    } else {
        names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
    }
}
