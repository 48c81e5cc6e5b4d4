//! The seed corpus in `fuzz/corpus/<target>/`: real-world inputs the property tests run before their
#![warn(missing_docs)]
//! generated cases, so that every value that ever broke (or nearly broke) a parser stays a test.
//!
//! A `*.lines` file holds one case per line (a header value, for instance); any other file is one case.

use std::path::PathBuf;

/// The corpus directory of a fuzz target.
pub fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Every case of a target, with where it came from for failure messages.
pub fn cases(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".lines") {
            for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
                if !line.is_empty() {
                    cases.push((format!("{name}:{}", n + 1), line.to_vec()));
                }
            }
        } else {
            cases.push((name, bytes));
        }
    }
    assert!(!cases.is_empty(), "corpus {} is empty", dir.display());
    cases
}

/// The cases that are text (header values are; a PROXY v2 header is not).
pub fn text_cases(target: &str) -> Vec<(String, String)> {
    cases(target)
        .into_iter()
        .map(|(at, bytes)| {
            let text = String::from_utf8(bytes).unwrap_or_else(|_| panic!("{at} is not UTF-8"));
            (at, text)
        })
        .collect()
}
