//! `ferrite serve` configured by environment variables alone (as Kubernetes manifests set
//! them), logging JSON lines, and draining cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `GET path` on `addr`, the response's body.
fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

#[test]
fn serve_takes_every_setting_from_the_environment_and_logs_json() {
    let model = std::env::var("FERRITE_TEST_GGUF").unwrap_or_else(|_| "smollm2-135m".into());
    let env = [
        ("FERRITE_MODEL", model.as_str()),
        ("FERRITE_LISTEN", "127.0.0.1:0"),
        ("FERRITE_HTTP_LISTEN", "127.0.0.1:0"),
        ("FERRITE_SERVED_MODEL_NAME", "from-env"),
        ("FERRITE_MAX_MODEL_LEN", "512"),
        ("FERRITE_KV_CACHE_MIB", "64"),
        ("FERRITE_DEVICE", "cpu"),
        ("FERRITE_DRAIN_TIMEOUT_S", "5"),
        ("FERRITE_LOG", "info"),
        ("FERRITE_LOG_FORMAT", "json"),
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg("serve")
        .envs(env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut http = None;
    for line in stdout.lines() {
        let line = line.expect("line");
        if let Some(a) = line.split("(OpenAI-compatible):").nth(1) {
            http = Some(
                a.trim()
                    .trim_start_matches("http://")
                    .trim_end_matches("/v1")
                    .to_owned(),
            );
        }
        if line == "ready" {
            break;
        }
    }
    let http = http.expect("the HTTP address before ready");
    let models = get(&http, "/v1/models");
    assert!(models.contains("\"from-env\""), "{models}");
    assert!(models.contains("\"max_model_len\":512"), "{models}");

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["fields"].is_object())
    );
    let said = |text: &str| {
        lines.iter().any(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(text))
        })
    };
    assert!(said("draining"), "{stderr}");
}
