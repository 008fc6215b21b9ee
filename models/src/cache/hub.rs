//! `hf://` model references: files of a Hugging Face Hub repository, downloaded with hf-hub
//! into the model cache (`$SESA_HOME/models/huggingface`, laid out as the Hub's own cache, so a
//! file is fetched once and reused offline).
//!
//! `hf://ORG/REPO/FILE` names one file (a GGUF); `hf://ORG/REPO` names a Hugging Face model
//! directory (`config.json`, `model.safetensors`, `tokenizer.json` and, when the repository has
//! it, `tokenizer_config.json`, which holds the chat template). `@REVISION` after the repository
//! picks a branch, tag or commit. `HF_ENDPOINT` points at a mirror, `HF_TOKEN` (else the token
//! `huggingface-cli login` saved) opens gated repositories.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use hf_hub::api::tokio::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::ModelError;

/// The prefix of a Hub reference.
pub const SCHEME: &str = "hf://";

/// The files of a model directory, and whether each must exist.
const DIRECTORY_FILES: [(&str, bool); 4] =
    [("config.json", true), ("model.safetensors", true), ("tokenizer.json", true), ("tokenizer_config.json", false)];

/// A parsed `hf://ORG/REPO[@REVISION][/FILE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubReference {
    /// `ORG/REPO`.
    pub repo: String,
    /// The branch, tag or commit (default: `main`).
    pub revision: Option<String>,
    /// A file of the repository, or `None` for a model directory.
    pub file: Option<String>,
}

impl HubReference {
    /// `None` when `text` is not an `hf://` reference; an error says what is malformed.
    pub fn parse(text: &str) -> Option<Result<HubReference, String>> {
        let rest = text.strip_prefix(SCHEME)?;
        let bad = || format!("`{text}`: expected hf://ORG/REPO[@REVISION][/FILE]");
        let mut parts = rest.splitn(3, '/');
        let (Some(org), Some(repo)) = (parts.next(), parts.next()) else { return Some(Err(bad())) };
        let (repo, revision) = match repo.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision.to_string())),
            None => (repo, None),
        };
        let file = parts.next().map(str::to_string);
        if org.is_empty() || repo.is_empty() || revision.as_deref() == Some("") || file.as_deref() == Some("") {
            return Some(Err(bad()));
        }
        Some(Ok(HubReference { repo: format!("{org}/{repo}"), revision, file }))
    }

    /// Downloads what the reference names (files already in the cache are not fetched again)
    /// and returns the file, or the directory that holds the model's files.
    pub async fn fetch(&self, home: &Path) -> Result<PathBuf, ModelError> {
        let name = self.to_string();
        let error = |message: String| ModelError::Fetch { name: name.clone(), message };
        let cache = Cache::new(home.join("models").join("huggingface"));
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()).or_else(|| Cache::from_env().token());
        let mut builder =
            ApiBuilder::from_cache(cache).with_token(token).with_progress(std::io::stderr().is_terminal());
        if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        let api = builder.build().map_err(|e| error(e.to_string()))?;
        let revision = self.revision.clone().unwrap_or_else(|| "main".into());
        let repo = api.repo(Repo::with_revision(self.repo.clone(), RepoType::Model, revision));
        if let Some(file) = &self.file {
            return repo.get(file).await.map_err(|e| error(format!("{file}: {e}")));
        }
        let mut directory = None;
        for (file, required) in DIRECTORY_FILES {
            match repo.get(file).await {
                Ok(path) => directory = path.parent().map(Path::to_path_buf),
                Err(e) if required => return Err(error(format!("{file}: {e}"))),
                Err(_) => {}
            }
        }
        directory.ok_or_else(|| error("no files".into()))
    }
}

impl std::fmt::Display for HubReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SCHEME}{}", self.repo)?;
        if let Some(revision) = &self.revision {
            write!(f, "@{revision}")?;
        }
        if let Some(file) = &self.file {
            write!(f, "/{file}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_and_without_a_file_and_a_revision() {
        let parse = |text: &str| HubReference::parse(text).unwrap();
        assert_eq!(
            parse("hf://HuggingFaceTB/SmolLM2-135M-Instruct"),
            Ok(HubReference { repo: "HuggingFaceTB/SmolLM2-135M-Instruct".into(), revision: None, file: None })
        );
        let file = parse("hf://org/repo@v1/sub/model-Q8_0.gguf").unwrap();
        assert_eq!((file.revision.as_deref(), file.file.as_deref()), (Some("v1"), Some("sub/model-Q8_0.gguf")));
        assert_eq!(file.to_string(), "hf://org/repo@v1/sub/model-Q8_0.gguf");
        for bad in ["hf://org", "hf:///repo", "hf://org/", "hf://org/repo@", "hf://org/repo/"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(HubReference::parse("models/x.gguf").is_none());
    }
}
