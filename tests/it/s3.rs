//! Runs on S3: a local S3 server (moto, from PyPI; `scripts/test` installs it) stands in for
//! a bucket. Without `moto_server` the test says so and passes, except under CI.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{read_tables, run_sesa, sesa};

/// A moto S3 server on a free loopback port, stopped on drop.
struct S3Server {
    child: Child,
    endpoint: String,
}

impl S3Server {
    fn start() -> Option<S3Server> {
        let port = TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let server = S3Server { child, endpoint: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(server)
    }

    fn configure(&self, command: &mut Command) {
        command
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
    }

    /// Runs a Python snippet with `s3`, a boto3 client of this server.
    fn python(&self, code: &str) -> String {
        let script = format!(
            "import boto3\ns3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='test', aws_secret_access_key='test', region_name='us-east-1')\n{code}",
            self.endpoint
        );
        let output = Command::new("python3").args(["-c", &script]).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_run_on_s3_is_killed_resumed_and_matches_a_local_run() {
    let Some(server) = S3Server::start() else {
        sesa_engine::testing::skip(
            "a_run_on_s3_is_killed_resumed_and_matches_a_local_run",
            "no moto_server (python3 -m pip install 'moto[server]')",
        );
        return;
    };
    server.python("s3.create_bucket(Bucket='experiments')");
    let dir = tempfile::tempdir().unwrap();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline.yaml");
    let spec = spec.to_str().unwrap();
    let local = dir.path().join("local");
    let output = run_sesa(&["run", spec, "--store", local.to_str().unwrap()], dir.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reference = read_tables(&crate::support::only_run(&local));

    let store = "s3://experiments/team/runs";
    let mut command = sesa(&["run", spec, "--store", store, "--set", "stages.numbers.delay_ms=200"], dir.path());
    server.configure(&mut command);
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    child.kill().unwrap();
    child.wait().unwrap();

    let mut command = sesa(&["runs", "--store", store], dir.path());
    server.configure(&mut command);
    let listing = String::from_utf8_lossy(&command.output().unwrap().stdout).into_owned();
    let run_id = listing
        .lines()
        .find_map(|line| line.split_whitespace().next().filter(|id| id.starts_with("test-pipeline-")))
        .unwrap_or_else(|| panic!("no run listed: {listing}"))
        .to_string();
    let mut command = sesa(&["resume", &format!("{store}/{run_id}")], dir.path());
    server.configure(&mut command);
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let mirror = dir.path().join("mirror");
    server.python(&format!(
        "import os\n\
         prefix = 'team/runs/{run_id}/'\n\
         for page in s3.get_paginator('list_objects_v2').paginate(Bucket='experiments', Prefix=prefix):\n\
         \x20   for item in page.get('Contents', []):\n\
         \x20       target = os.path.join('{}', item['Key'][len(prefix):])\n\
         \x20       os.makedirs(os.path.dirname(target), exist_ok=True)\n\
         \x20       s3.download_file('experiments', item['Key'], target)",
        mirror.display()
    ));
    assert_eq!(read_tables(&mirror), reference);
    let staged = std::fs::read_dir(mirror.join("_staging")).map(|e| e.count()).unwrap_or(0);
    assert_eq!(staged, 0, "staging objects left on S3");
}
