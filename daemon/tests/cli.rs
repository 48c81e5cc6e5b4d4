//! The command line: configuration errors are one line naming the key, with exit status 2.

use std::process::Command;

fn lacquerd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lacquerd"))
        .args(args)
        .output()
        .expect("lacquerd runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn check_accepts_a_good_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("store");
    let (code, out, err) = lacquerd(&[
        "--check",
        "--backend",
        "127.0.0.1:8080",
        "--disk",
        disk.to_str().unwrap(),
        "--memory",
        "64MiB",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "configuration ok");
}

#[test]
fn configuration_errors_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("store");
    let disk = disk.to_str().unwrap();
    let file = dir.path().join("lacquer.toml");
    std::fs::write(
        &file,
        "[backend]\naddress = \"127.0.0.1:8080\"\n\n[storage]\nmemroy = \"1GiB\"\n",
    )
    .unwrap();
    let bad_network = dir.path().join("purge.toml");
    std::fs::write(
        &bad_network,
        "[purge]\nhttp_methods = true\nallow_from = [\"10.0.0.0/33\"]\n",
    )
    .unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let unusable = blocker.join("store");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--check",
                "--config",
                file.to_str().unwrap(),
                "--disk",
                disk,
            ],
            "lacquer.toml:5:1: storage.memroy: unknown field `memroy`",
        ),
        (
            vec!["--check", "--disk", disk],
            "backend.address: no backend given",
        ),
        (
            vec![
                "--check",
                "--config",
                bad_network.to_str().unwrap(),
                "--backend",
                "127.0.0.1:1",
                "--disk",
                disk,
            ],
            "purge.toml:3:15: purge.allow_from[0]:",
        ),
        (
            vec!["--check", "--backend", "nonsense", "--disk", disk],
            "backend.address: \"nonsense\" is not HOST:PORT",
        ),
        (
            vec![
                "--check",
                "--backend",
                "127.0.0.1:1",
                "--disk",
                unusable.to_str().unwrap(),
            ],
            "storage.dir:",
        ),
        (
            vec![
                "--check",
                "--backend",
                "127.0.0.1:1",
                "--disk",
                disk,
                "--disk-size",
                "1MiB",
            ],
            "storage: invalid store setting: disk size",
        ),
        (
            vec!["--check", "--config", "/nonexistent/lacquer.toml"],
            "cannot read config file /nonexistent/lacquer.toml",
        ),
    ];
    for (args, want) in cases {
        let (code, _, err) = lacquerd(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err:?}");
    }
}

#[test]
fn bad_flag_values_are_usage_errors() {
    let (code, _, err) = lacquerd(&["--memory", "lots", "--backend", "127.0.0.1:1"]);
    assert_eq!(code, 2);
    assert!(err.contains("--memory"), "{err}");
}

#[test]
fn a_secret_other_users_can_read_is_refused_at_start() {
    use std::{
        io::Read,
        os::unix::fs::PermissionsExt,
        process::Stdio,
        time::{Duration, Instant},
    };

    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("store");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "correct-horse-battery-staple\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lacquerd"))
        .args(["--backend", "127.0.0.1:9", "--listen", "127.0.0.1:0"])
        .args(["--admin", "127.0.0.1:0", "--memory", "64MiB", "--disk"])
        .arg(&disk)
        .arg("--secret")
        .arg(&secret)
        .stderr(Stdio::piped())
        .spawn()
        .expect("lacquerd runs");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("lacquerd started with a group-readable secret");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    let path = secret.display();
    assert!(
        err.contains(&format!(
            "admin secret {path} is accessible by other users (mode 0640); run `chmod 600 {path}`"
        )),
        "{err}"
    );
}
