//! Debian's Chromium, headless: a real browser's requests and what its page made of the answers.

use std::{path::Path, time::Duration};

/// Where Debian's `chromium` package puts it.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Whether Chromium is installed; prints why a test is skipped when it is not.
pub fn available() -> bool {
    let there = Path::new(CHROMIUM).exists();
    if !there {
        eprintln!("skipped: {CHROMIUM} is missing (Debian's chromium package)");
    }
    there
}

/// Loads `url` in a fresh profile with `args` besides the usual headless ones, runs its scripts for up to
/// 10 s of virtual time, and returns the page's DOM as it then stands and what Chromium printed.
pub async fn dump_dom(url: &str, args: &[String]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(CHROMIUM)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("chromium ends")
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
