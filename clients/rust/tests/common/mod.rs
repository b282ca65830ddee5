//! A real flight-serve server for the tests: `python -m flight_serve.cli serve --port 0` from
//! the project's venv (`FLIGHT_SERVE_PYTHON`, default `../../.venv/bin/python` from this crate)
//! in a temporary data directory, killed by its pid when the guard drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub fn python() -> PathBuf {
    match std::env::var_os("FLIGHT_SERVE_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
    }
}

/// A running server; dropping it kills the process (by its pid) and removes the data.
pub struct Server {
    child: Child,
    pub location: String,
    pub dir: tempfile::TempDir,
}

impl Server {
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("a temp dir");
        let data = dir.path().join("data");
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let python = python();
        assert!(
            python.exists(),
            "no Python for the server at {} (make the venv, or set FLIGHT_SERVE_PYTHON)",
            python.display()
        );
        let mut child = Command::new(&python)
            .args(["-m", "flight_serve.cli", "serve", "--port", "0", "--data-dir"])
            .arg(&data)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start flight-serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let location = line.trim().to_owned();
        if location.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "flight-serve did not start: {}",
                std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
            );
        }
        Server { child, location, dir }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed (by its pid) when dropped; its stdout read line by line.
pub struct Proc {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
}

impl Proc {
    pub fn spawn(command: &mut Command) -> Proc {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("spawn");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdout }
    }

    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `condition` every 50 ms for up to `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
