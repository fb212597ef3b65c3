//! `deltascope serve` in a test: on a model directory (or the demo), on a free port, killed
//! when dropped; and broken copies of the demo made by `scripts/break_checkpoint.py`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `deltascope serve` on a model directory, on a free port; killed when dropped.
pub struct Serve(pub Child, pub String);

impl Serve {
    pub fn start(model: Option<&Path>) -> Serve {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltascope"));
        cmd.args(["serve", "--port", "0", "--device", "cpu"]);
        if let Some(m) = model {
            cmd.arg("--model").arg(m);
        }
        // The listening line is serve's stdout; its logs and notes go to stderr.
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("starting serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("serve exited before listening").unwrap();
            if let Some(rest) = line.split(" on http://").nth(1) {
                break format!("http://{}", rest.split_whitespace().next().unwrap());
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Serve(child, url)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A copy of the demo in `dir/name` with `tensor` changed as `how` says (break_checkpoint.py's flags).
pub fn broken(dir: &Path, name: &str, tensor: &str, how: &[&str]) -> std::path::PathBuf {
    let dst = dir.join(name);
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/break_checkpoint.py"))
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/models/demo"))
        .arg(&dst)
        .arg(tensor)
        .args(how)
        .output()
        .expect("python3 runs break_checkpoint.py");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dst
}
