//! What a spec needs from outside the run before its first step: files it reads, programs it
//! starts, servers it calls.
//!
//! Sections and stages declare them ([`crate::Section::requirements`],
//! [`crate::Stage::requirements`]) next to the paths they create on first use
//! ([`crate::Section::provides`], [`crate::Stage::provides`]), so that a missing piece is named
//! before a run is created, all of them at once, instead of inside step 1 one at a time. The
//! engine checks files and programs itself; servers need a client, which the caller brings
//! ([`check`]).

use std::future::Future;
use std::path::{Component, Path, PathBuf};

use crate::spec::{Location, SpecError, SpecErrors};

/// One thing outside the run that a section or stage needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The key that names it, relative to its section or stage (`targets`, `backend.url`).
    pub key: String,
    /// What must exist.
    pub resource: Resource,
    /// How a user provides it when it is missing: a command to run, a key to set.
    pub how: String,
}

/// Something that must exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// A file or directory.
    Path(PathBuf),
    /// A program, by path or on `PATH`.
    Program(String),
    /// A server: `GET url` gets an answer; with `listing`, a successful one whose body names it
    /// (a model server that serves the model asked for).
    Server {
        /// The URL to ask.
        url: String,
        /// A name the answer must contain.
        listing: Option<String>,
    },
}

impl Requirement {
    /// A file or directory at `path`.
    pub fn path(key: impl Into<String>, path: impl Into<PathBuf>, how: impl Into<String>) -> Self {
        Requirement { key: key.into(), resource: Resource::Path(path.into()), how: how.into() }
    }

    /// A program to start.
    pub fn program(key: impl Into<String>, program: impl Into<String>, how: impl Into<String>) -> Self {
        Requirement { key: key.into(), resource: Resource::Program(program.into()), how: how.into() }
    }

    /// A server that answers `GET url`, and lists `listing` when given.
    pub fn server(
        key: impl Into<String>,
        url: impl Into<String>,
        listing: Option<String>,
        how: impl Into<String>,
    ) -> Self {
        Requirement { key: key.into(), resource: Resource::Server { url: url.into(), listing }, how: how.into() }
    }
}

/// A requirement of a spec, with the dotted key and the place in the spec that named it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecRequirement {
    /// The full dotted key (`stages.propose.targets`).
    pub key: String,
    /// Where the key was set.
    pub location: Location,
    /// What it needs.
    pub requirement: Requirement,
}

impl SpecRequirement {
    /// The spec problem of this requirement not being met: `why` says what was found.
    pub fn unmet(&self, why: impl Into<String>) -> SpecError {
        SpecError::Unavailable {
            location: self.location.clone(),
            key: self.key.clone(),
            why: why.into(),
            how: self.requirement.how.clone(),
        }
    }
}

/// Whether `path` lies under one of `provided` (compared by components, `./` ignored).
pub(crate) fn is_provided(path: &Path, provided: &[PathBuf]) -> bool {
    let path = normal(path);
    provided.iter().any(|p| path.starts_with(normal(p)))
}

fn normal(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// Checks every requirement, files and programs here and servers with `probe` (which returns
/// why a server does not do, or `None`), all servers concurrently; returns every unmet one.
pub async fn check<F, Fut>(requirements: &[SpecRequirement], probe: F) -> Result<(), SpecErrors>
where
    F: Fn(String, Option<String>) -> Fut,
    Fut: Future<Output = Option<String>>,
{
    let checks = requirements.iter().map(|required| {
        let probe = &probe;
        async move {
            let why = match &required.requirement.resource {
                Resource::Path(path) => (!path.exists()).then(|| format!("`{}` does not exist", path.display())),
                Resource::Program(program) => {
                    (!program_exists(program)).then(|| format!("`{program}` is neither a file nor a program on PATH"))
                }
                Resource::Server { url, listing } => probe(url.clone(), listing.clone()).await,
            };
            why.map(|why| required.unmet(why))
        }
    });
    let unmet: Vec<SpecError> = futures::future::join_all(checks).await.into_iter().flatten().collect();
    if unmet.is_empty() { Ok(()) } else { Err(SpecErrors(unmet)) }
}

fn program_exists(program: &str) -> bool {
    if program.contains(std::path::MAIN_SEPARATOR) {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provided_paths_cover_what_lies_under_them() {
        let provided = vec![PathBuf::from("./data/world")];
        assert!(is_provided(Path::new("data/world/targets.jsonl"), &provided));
        assert!(is_provided(Path::new("./data/world"), &provided));
        assert!(!is_provided(Path::new("data/world-2/targets.jsonl"), &provided));
        assert!(!is_provided(Path::new("data/targets.jsonl"), &provided));
    }

    #[tokio::test]
    async fn every_unmet_requirement_is_reported_with_its_key_and_remedy() {
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().join("here.txt");
        std::fs::write(&here, "x").unwrap();
        let at = |key: &str, requirement| SpecRequirement {
            key: key.into(),
            location: Location { file: Some("spec.yaml".into()), line: Some(3), argument: None },
            requirement,
        };
        let requirements = vec![
            at("stages.a.file", Requirement::path("file", &here, "unused")),
            at("stages.a.missing", Requirement::path("missing", dir.path().join("gone.jsonl"), "make it")),
            at("stages.b.command", Requirement::program("command", "sh", "unused")),
            at("stages.b.trainer", Requirement::program("command", "no-such-program-anywhere", "install it")),
            at("model.base_url", Requirement::server("base_url", "http://x/v1/models", Some("m".into()), "serve m")),
        ];
        let probed = std::sync::Mutex::new(Vec::new());
        let errors = check(&requirements, |url, listing| {
            probed.lock().unwrap().push((url, listing));
            async { Some("nothing answers".to_string()) }
        })
        .await
        .unwrap_err();
        assert_eq!(probed.into_inner().unwrap(), vec![("http://x/v1/models".to_string(), Some("m".to_string()))]);
        let text: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].starts_with("spec.yaml:3: stages.a.missing: `"), "{}", text[0]);
        assert!(text[0].ends_with("gone.jsonl` does not exist; make it"), "{}", text[0]);
        assert_eq!(
            text[1],
            "spec.yaml:3: stages.b.trainer: `no-such-program-anywhere` is neither a file nor a program on PATH; install it"
        );
        assert_eq!(text[2], "spec.yaml:3: model.base_url: nothing answers; serve m");
    }
}
