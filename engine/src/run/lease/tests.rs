//! The lease against a local store: refused while its holder lives, taken over when it is
//! gone, and a writer that loses it finds out.

use std::time::Duration;

use super::*;

fn store() -> (tempfile::TempDir, ArtifactStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path().to_str().unwrap()).unwrap();
    (dir, store)
}

async fn plant(store: &ArtifactStore, holder: &LeaseHolder) {
    store.put(LEASE, encode(holder).unwrap()).await.unwrap();
}

fn other(host: &str, pid: u32, heartbeat_age: u64) -> LeaseHolder {
    LeaseHolder {
        host: host.into(),
        pid,
        started_at: "2026-12-01T00:00:00Z".into(),
        heartbeat_at: unix_now() - heartbeat_age,
        token: "theirs".into(),
    }
}

/// A pid that was alive a moment ago and is not now.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[tokio::test]
async fn a_live_writer_on_this_host_keeps_the_run_and_is_named() {
    let (_dir, store) = store();
    // pid 1 is always alive.
    let holder = other(&host_name(), 1, 0);
    plant(&store, &holder).await;
    let error = Lease::acquire(&store, false).await.err().expect("refused").to_string();
    assert!(error.contains(&format!("pid 1 on {}", host_name())) && error.contains("--force"), "{error}");
    assert_eq!(read_lease(&store).await.unwrap(), Some(holder), "left as it was");
    let forced = Lease::acquire(&store, true).await.unwrap();
    assert_eq!(read_lease(&store).await.unwrap().unwrap().token, forced.holder.token);
}

#[tokio::test]
async fn a_dead_pid_or_a_stale_heartbeat_elsewhere_is_taken_over() {
    let (_dir, store) = store();
    plant(&store, &other(&host_name(), dead_pid(), 0)).await;
    let lease = Lease::acquire(&store, false).await.unwrap();
    assert_eq!(read_lease(&store).await.unwrap().unwrap().pid, std::process::id());
    lease.release().await.unwrap();
    assert_eq!(read_lease(&store).await.unwrap(), None, "released");

    plant(&store, &other("elsewhere", 1, STALE_AFTER.as_secs() + 5)).await;
    Lease::acquire(&store, false).await.unwrap();

    let (_dir, store) = self::store();
    plant(&store, &other("elsewhere", 1, 5)).await;
    let error = Lease::acquire(&store, false).await.err().expect("a recent heartbeat").to_string();
    assert!(error.contains("pid 1 on elsewhere"), "{error}");
}

#[tokio::test]
async fn of_two_writers_racing_for_a_free_run_one_wins() {
    let (_dir, store) = store();
    // Both are this process, which never competes with itself; plant a live other holder
    // after the first create to see the second refused.
    let first = Lease::acquire(&store, false).await.unwrap();
    assert!(!store.create(LEASE, encode(&other("elsewhere", 1, 0)).unwrap()).await.unwrap());
    assert_eq!(read_lease(&store).await.unwrap().unwrap().token, first.holder.token);
}

#[tokio::test]
async fn a_writer_whose_lease_was_taken_finds_out_and_renews_its_own() {
    let (_dir, store) = store();
    let mut lease = Lease::acquire(&store, false).await.unwrap();
    lease.interval = Duration::from_millis(20);
    let before = read_lease(&store).await.unwrap().unwrap();
    lease.keep_alive();
    tokio::time::sleep(Duration::from_millis(100)).await;
    lease.check().unwrap();
    assert_eq!(read_lease(&store).await.unwrap().unwrap().token, before.token);
    plant(&store, &other("elsewhere", 1, 0)).await;
    // The keep-alive finds out at its next renewal: within a few intervals, later on a loaded
    // machine.
    let mut waited = Duration::ZERO;
    let error = loop {
        if let Err(error) = lease.check() {
            break error.to_string();
        }
        assert!(waited < Duration::from_secs(10), "the keep-alive never noticed the planted lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    };
    assert!(error.contains("taken by pid 1 on elsewhere"), "{error}");
    lease.release().await.unwrap();
    assert_eq!(read_lease(&store).await.unwrap().unwrap().token, "theirs", "another's lease is never deleted");
}

#[test]
fn zombies_and_missing_processes_are_not_alive() {
    assert!(process_alive(std::process::id()));
    assert!(!process_alive(dead_pid()));
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!process_alive(zombie.id()), "exited, not yet reaped");
    zombie.wait().unwrap();
}
