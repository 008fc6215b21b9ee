//! One conformance suite, run on every store implementation.

use bytes::Bytes;

use super::ArtifactStore;

async fn put_then_get(store: &ArtifactStore) {
    store.put("a/b/one.txt", Bytes::from_static(b"one")).await.unwrap();
    assert_eq!(store.get("a/b/one.txt").await.unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(store.get("a/b/missing.txt").await.unwrap(), None);
    assert!(store.exists("a/b/one.txt").await.unwrap());
    assert!(!store.exists("a/b/missing.txt").await.unwrap());
}

async fn put_replaces(store: &ArtifactStore) {
    store.put("k", Bytes::from_static(b"old")).await.unwrap();
    store.put("k", Bytes::from_static(b"new")).await.unwrap();
    assert_eq!(store.get("k").await.unwrap().as_deref(), Some(&b"new"[..]));
}

async fn list_is_recursive_and_sorted(store: &ArtifactStore) {
    for key in ["t/x/step=2/part-0.parquet", "t/x/step=1/part-0.parquet", "t/y/step=1/part-0.parquet", "u/z"] {
        store.put(key, Bytes::from_static(b"-")).await.unwrap();
    }
    assert_eq!(
        store.list("t").await.unwrap(),
        vec!["t/x/step=1/part-0.parquet", "t/x/step=2/part-0.parquet", "t/y/step=1/part-0.parquet"]
    );
    assert_eq!(store.list_dirs("t").await.unwrap(), vec!["x", "y"]);
    assert_eq!(store.list("nothing").await.unwrap(), Vec::<String>::new());
}

async fn rename_moves(store: &ArtifactStore) {
    store.put("staging/f", Bytes::from_static(b"data")).await.unwrap();
    store.rename("staging/f", "final/deep/f").await.unwrap();
    assert_eq!(store.get("final/deep/f").await.unwrap().as_deref(), Some(&b"data"[..]));
    assert!(!store.exists("staging/f").await.unwrap());
}

async fn delete_is_idempotent(store: &ArtifactStore) {
    store.put("d", Bytes::from_static(b"x")).await.unwrap();
    store.delete("d").await.unwrap();
    store.delete("d").await.unwrap();
    assert!(!store.exists("d").await.unwrap());
}

async fn scoped_stores_see_their_prefix(store: &ArtifactStore) {
    let run = store.scoped("run-1");
    run.put("manifest.json", Bytes::from_static(b"{}")).await.unwrap();
    assert!(store.exists("run-1/manifest.json").await.unwrap());
    assert_eq!(run.list("").await.unwrap(), vec!["manifest.json"]);
    assert!(store.list_dirs("").await.unwrap().contains(&"run-1".to_string()));
}

/// A crash in the middle of a local write leaves `name#n`, which `list` does not show;
/// `delete_all` removes it with the rest.
#[tokio::test]
async fn delete_all_removes_interrupted_local_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path().to_str().unwrap()).unwrap().scoped("run");
    store.put("_staging/a.parquet", Bytes::from_static(b"a")).await.unwrap();
    store.put("kept/b", Bytes::from_static(b"b")).await.unwrap();
    std::fs::write(dir.path().join("run/_staging/c.parquet#1"), b"half").unwrap();
    assert_eq!(store.list("_staging").await.unwrap(), vec!["_staging/a.parquet"]);
    store.delete_all("_staging").await.unwrap();
    assert_eq!(std::fs::read_dir(dir.path().join("run/_staging")).unwrap().count(), 0);
    assert!(store.exists("kept/b").await.unwrap());
    store.delete_all("nothing-here").await.unwrap();
}

macro_rules! conformance {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;
            #[tokio::test]
            async fn put_then_get() {
                let (store, _guard) = $make;
                super::put_then_get(&store).await
            }
            #[tokio::test]
            async fn put_replaces() {
                let (store, _guard) = $make;
                super::put_replaces(&store).await
            }
            #[tokio::test]
            async fn list_is_recursive_and_sorted() {
                let (store, _guard) = $make;
                super::list_is_recursive_and_sorted(&store).await
            }
            #[tokio::test]
            async fn rename_moves() {
                let (store, _guard) = $make;
                super::rename_moves(&store).await
            }
            #[tokio::test]
            async fn delete_is_idempotent() {
                let (store, _guard) = $make;
                super::delete_is_idempotent(&store).await
            }
            #[tokio::test]
            async fn scoped_stores_see_their_prefix() {
                let (store, _guard) = $make;
                super::scoped_stores_see_their_prefix(&store).await
            }
        }
    };
}

conformance!(memory, (ArtifactStore::in_memory(), ()));
conformance!(local, {
    let dir = tempfile::tempdir().unwrap();
    (ArtifactStore::open(dir.path().to_str().unwrap()).unwrap(), dir)
});

#[test]
fn unsupported_locations_are_refused_with_the_reason() {
    let error = ArtifactStore::open("gs://bucket/x").unwrap_err();
    insta::assert_snapshot!(error.to_string(), @"cannot open the artifact store `gs://bucket/x`: supported: a local directory, file://, s3:// or memory://");
}

#[test]
fn write_whole_leaves_the_file_and_no_partial() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batch.parquet");
    std::fs::write(&path, b"old").unwrap();
    super::write_whole(&path, b"new bytes").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["batch.parquet"]);
}
