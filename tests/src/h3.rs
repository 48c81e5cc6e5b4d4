//! HTTP/3 to the daemon through aioquic (`tests/h3client.py`): a QUIC and HTTP/3 stack we did not write.

use std::{net::SocketAddr, path::PathBuf};

use serde_json::{json, Value};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("h3client.py")
}

/// Whether aioquic can be imported; prints why a test is skipped when it cannot.
pub fn available() -> bool {
    let there = std::process::Command::new("python3")
        .args(["-c", "import aioquic"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !there {
        eprintln!(
            "skipped: python3 cannot import aioquic (pip install aioquic==1.2.0; CI installs it)"
        );
    }
    there
}

/// One request as the script takes it.
pub fn get(path: &str) -> Value {
    json!({ "method": "GET", "path": path })
}

/// Runs the client with `spec` (see the script's documentation) against `addr`, adding the address, and
/// returns what it printed.
pub async fn run(addr: SocketAddr, mut spec: Value) -> Value {
    spec["addr"] = json!(addr.to_string());
    let out = tokio::process::Command::new("python3")
        .arg(script())
        .arg(spec.to_string())
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "h3client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("h3client prints JSON")
}

/// The first value of response header `name` in one of the script's results.
pub fn header<'a>(result: &'a Value, name: &str) -> Option<&'a str> {
    result["headers"]
        .as_array()?
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_str())
}
