//! docs/rules.md cannot drift from what lacquerd accepts: every ```toml block in it is loaded as a
//! configuration file and its rules compiled, and every recipe shows the VCL beside the rule.

use std::path::PathBuf;

use super::*;

const DOC: &str = include_str!("../../../docs/rules.md");

/// The fenced blocks of `lang` in `doc`, each with the line it starts on.
fn blocks<'a>(doc: &'a str, lang: &str) -> Vec<(usize, String)> {
    let fence = format!("```{lang}");
    let mut out = Vec::new();
    let mut lines = doc.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim_end() != fence {
            continue;
        }
        let body: Vec<&'a str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim_end() != "```")
            .collect();
        out.push((n + 1, body.join("\n") + "\n"));
    }
    out
}

/// The doc's error pages and signing secret live in /etc/lacquer; the test writes them where it may and
/// points the blocks there, since `respond.file` and `signed.secret_file` are read when the rules are
/// compiled.
fn with_files(block: &str, dir: &std::path::Path) -> String {
    let mut out = block.to_owned();
    for name in [
        "403.html",
        "404.html",
        "500.html",
        "503.html",
        "maintenance.html",
    ] {
        let at = dir.join(name);
        std::fs::write(&at, "<h1>error</h1>\n").unwrap();
        out = out.replace(&format!("/etc/lacquer/{name}"), &at.display().to_string());
    }
    // A signed URL's secret, read when the rules are compiled.
    let secret = dir.join("url-secret");
    std::fs::write(&secret, "a secret of sixteen bytes or more\n").unwrap();
    out = out.replace("/etc/lacquer/url-secret", &secret.display().to_string());
    assert!(
        !out.contains("file = \"/etc/"),
        "a file the test does not provide:\n{out}"
    );
    out
}

#[test]
fn every_toml_block_of_docs_rules_md_is_a_valid_configuration() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("lacquer-rules-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = blocks(DOC, "toml");
    assert!(toml.len() >= 25, "{} toml blocks", toml.len());
    let mut rules = 0;
    for (line, block) in &toml {
        let origin = format!("docs/rules.md:{line}");
        let text = with_files(block, &dir);
        let config = lacquer_config::Config::parse(&text, &origin)
            .unwrap_or_else(|e| panic!("{origin}: {e}\n{block}"));
        // The backends and directors the block names, and those the doc's rules send requests to.
        let mut names: Vec<&str> = config.backend.iter().map(|b| b.name.as_str()).collect();
        names.extend(config.director.iter().map(|d| d.name.as_str()));
        names.extend(["app", "api", "static"]);
        Rules::compile(&config.rule, &names).unwrap_or_else(|e| panic!("{origin}: {e}\n{block}"));
        rules += config.rule.len();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(rules >= 40, "{rules} rules in docs/rules.md");
}

#[test]
fn every_recipe_shows_the_vcl_beside_the_rule() {
    let headings: Vec<(usize, &str)> = DOC
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("### "))
        .collect();
    let mut numbered = 0;
    for (i, (at, heading)) in headings.iter().enumerate() {
        let Some((n, _)) = heading[4..].split_once(". ") else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else { continue };
        numbered += 1;
        assert_eq!(n, numbered, "recipes are numbered in order: {heading}");
        let end = headings.get(i + 1).map_or(usize::MAX, |(e, _)| *e);
        let section: String = DOC
            .lines()
            .skip(*at)
            .take(end - at)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            !blocks(&section, "vcl").is_empty(),
            "{heading}: no ```vcl block"
        );
        assert!(
            !blocks(&section, "toml").is_empty(),
            "{heading}: no ```toml block"
        );
    }
    assert_eq!(
        numbered, 27,
        "the 25 recipes of the first issue, and the Magento and WordPress ports"
    );
}
