//! The artifact store: write-once objects under a root, local or on S3, over `object_store`.
//!
//! Modelled on tantivy's `Directory`: few operations, each write atomic (an object is either
//! absent or complete, never partial), and keys are plain `/`-separated strings relative to the
//! store's root. The run layer decides the layout; stages never see this type.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store location could not be opened.
    #[error("cannot open the artifact store `{location}`: {reason}")]
    Open {
        /// The location as given.
        location: String,
        /// Why.
        reason: String,
    },
    /// An object operation failed.
    #[error("artifact store: {operation} `{key}` failed: {source}")]
    Object {
        /// What was being done.
        operation: &'static str,
        /// The key, as a full location.
        key: String,
        /// The underlying error.
        #[source]
        source: object_store::Error,
    },
}

/// A place to keep run artifacts: a local directory, an S3 prefix, or memory (tests).
#[derive(Clone)]
pub struct ArtifactStore {
    inner: Arc<dyn ObjectStore>,
    /// The same store when it is a local directory, for what only the file system shows.
    local: Option<Arc<LocalFileSystem>>,
    root: ObjectPath,
    /// How a person writes the root: `runs`, `/data/runs`, `s3://bucket/prefix`.
    display: String,
}

impl std::fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArtifactStore({})", self.display)
    }
}

impl ArtifactStore {
    /// Opens `location`: a local directory (created if missing), `file:///abs/dir`,
    /// `s3://bucket/prefix` (credentials, region and a custom endpoint come from the standard
    /// `AWS_*` variables, such as `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP=true`), or `memory://`.
    pub fn open(location: &str) -> Result<ArtifactStore, StoreError> {
        let open_error = |reason: String| StoreError::Open { location: location.to_string(), reason };
        let display = location.trim_end_matches('/').to_string();
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(open_error("expected s3://BUCKET/PREFIX".into()));
            }
            let s3 =
                AmazonS3Builder::from_env().with_bucket_name(bucket).build().map_err(|e| open_error(e.to_string()))?;
            return Ok(ArtifactStore { inner: Arc::new(s3), local: None, root: ObjectPath::from(prefix), display });
        }
        if location == "memory://" {
            return Ok(ArtifactStore::in_memory());
        }
        if location.contains("://") && !location.starts_with("file://") {
            return Err(open_error("supported: a local directory, file://, s3:// or memory://".into()));
        }
        let directory = location.strip_prefix("file://").unwrap_or(location);
        let directory = if directory.is_empty() { "." } else { directory };
        std::fs::create_dir_all(directory).map_err(|e| open_error(e.to_string()))?;
        let local = Arc::new(
            LocalFileSystem::new_with_prefix(directory)
                .map_err(|e| open_error(e.to_string()))?
                .with_automatic_cleanup(true),
        );
        Ok(ArtifactStore { inner: local.clone(), local: Some(local), root: ObjectPath::default(), display })
    }

    /// A store that lives in memory: for tests.
    pub fn in_memory() -> ArtifactStore {
        ArtifactStore {
            inner: Arc::new(InMemory::new()),
            local: None,
            root: ObjectPath::default(),
            display: "memory://".into(),
        }
    }

    /// The same store rooted at `prefix` below this root.
    pub fn scoped(&self, prefix: &str) -> ArtifactStore {
        ArtifactStore {
            inner: self.inner.clone(),
            local: self.local.clone(),
            root: self.path(prefix),
            display: format!("{}/{}", self.display, prefix.trim_matches('/')),
        }
    }

    /// Where `key` lives, as a person would write it (a path or a URL).
    pub fn describe(&self, key: &str) -> String {
        if key.is_empty() { self.display.clone() } else { format!("{}/{}", self.display, key) }
    }

    fn path(&self, key: &str) -> ObjectPath {
        let mut path = self.root.clone();
        for part in key.split('/').filter(|p| !p.is_empty()) {
            path = path.clone().join(part);
        }
        path
    }

    fn relative(&self, path: &ObjectPath) -> String {
        path.prefix_match(&self.root)
            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| path.to_string())
    }

    fn error(&self, operation: &'static str, key: &str) -> impl FnOnce(object_store::Error) -> StoreError {
        let key = self.describe(key);
        move |source| StoreError::Object { operation, key, source }
    }

    /// Writes `bytes` at `key`, replacing what was there. Atomic: readers see the old object,
    /// no object, or the whole new one.
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        self.inner.put(&self.path(key), PutPayload::from_bytes(bytes)).await.map_err(self.error("write", key))?;
        Ok(())
    }

    /// Writes `bytes` at `key` only if nothing is there (a conditional create: an atomic link
    /// on local disks, `If-None-Match: *` on S3). `false` when `key` already exists: of two
    /// writers racing for a key, exactly one gets `true`.
    pub async fn create(&self, key: &str, bytes: Bytes) -> Result<bool, StoreError> {
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.inner.put_opts(&self.path(key), PutPayload::from_bytes(bytes), options).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
            Err(source) => Err(self.error("create", key)(source)),
        }
    }

    /// Reads `key`, or `None` if it does not exist.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, StoreError> {
        match self.inner.get(&self.path(key)).await {
            Ok(result) => Ok(Some(result.bytes().await.map_err(self.error("read", key))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.error("read", key)(source)),
        }
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.inner.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(source) => Err(self.error("look up", key)(source)),
        }
    }

    /// Every key below `prefix`, recursively, sorted.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let path = self.path(prefix);
        let listed: Vec<_> = self.inner.list(Some(&path)).try_collect().await.map_err(self.error("list", prefix))?;
        let mut keys: Vec<String> = listed.iter().map(|meta| self.relative(&meta.location)).collect();
        keys.sort();
        Ok(keys)
    }

    /// The immediate "directories" below `prefix`, as names, sorted.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let path = self.path(prefix);
        let listed = self.inner.list_with_delimiter(Some(&path)).await.map_err(self.error("list", prefix))?;
        let mut names: Vec<String> =
            listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect();
        names.sort();
        Ok(names)
    }

    /// Moves `from` to `to`, replacing `to`. Atomic on local disks; on S3 a copy then a delete,
    /// so callers must tolerate finding both.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.inner.rename(&self.path(from), &self.path(to)).await.map_err(self.error("move", from))
    }

    /// Deletes `key`; deleting a missing key is not an error.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(self.error("delete", key)(source)),
        }
    }

    /// Deletes every object directly or deeply under `prefix`, and in a local directory also
    /// the partial files of writes a crash interrupted: a local `put` writes `name#n` and
    /// renames it, and `list` never shows such files.
    pub async fn delete_all(&self, prefix: &str) -> Result<(), StoreError> {
        for key in self.list(prefix).await? {
            self.delete(&key).await?;
        }
        let Some(local) = &self.local else { return Ok(()) };
        let directory = local.path_to_filesystem(&self.path(prefix)).map_err(self.error("clean", prefix))?;
        let Ok(entries) = std::fs::read_dir(&directory) else { return Ok(()) };
        for entry in entries.flatten().filter(|e| e.file_name().to_string_lossy().contains('#')) {
            if let Err(error) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), %error, "cannot remove an interrupted write");
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to the local file `path` whole or not at all: through `<path>.partial`, then
/// a rename, so a reader (or a crash) never sees half a file. For files outside a store that
/// other programs read: an external trainer's batch, a report, a targets file.
pub fn write_whole(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests;
