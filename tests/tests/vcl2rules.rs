//! `cachectl vcl2rules` on the VCL of every recipe in docs/rules.md, the ports of Magento's `varnish6.vcl`
//! (recipe 26) and of a WordPress VCL (recipe 27) among them. Each translation passes `lacquerd --check`;
//! run with the recipe's own examples (those of its hand-written rules), a translation that reports
//! nothing untranslated behaves as the recipe does: what vcl2rules says it translated, it translated.

use lacquer_tests::{check_config as check, daemon::binary, run_tool};

/// One recipe: its heading's line, its VCL, and the examples of its rules.
struct Recipe {
    title: String,
    vcl: String,
    examples: Vec<toml::Value>,
}

fn recipes() -> Vec<Recipe> {
    let doc = include_str!("../../docs/rules.md");
    let mut recipes: Vec<Recipe> = Vec::new();
    let mut lines = doc.lines();
    let mut in_recipes = false;
    while let Some(line) = lines.next() {
        if line == "## Recipes" {
            in_recipes = true;
        }
        if !in_recipes {
            continue;
        }
        if let Some(title) = line.strip_prefix("### ") {
            recipes.push(Recipe {
                title: title.to_owned(),
                vcl: String::new(),
                examples: Vec::new(),
            });
            continue;
        }
        let Some(recipe) = recipes.last_mut() else {
            continue;
        };
        if line == "```vcl" || line == "```toml" {
            let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            let text = block.join("\n") + "\n";
            if line == "```vcl" {
                recipe.vcl.push_str(&text);
            } else {
                let table: toml::Table = text.parse().expect("the recipe's TOML parses");
                let rules = table.get("rule").and_then(|r| r.as_array());
                for rule in rules.into_iter().flatten() {
                    if let Some(examples) = rule.get("examples").and_then(|e| e.as_array()) {
                        recipe.examples.extend(examples.iter().cloned());
                    }
                }
            }
        }
    }
    recipes.retain(|r| !r.vcl.is_empty());
    recipes
}

/// The translation of `vcl`, made a configuration lacquerd starts with: the error pages it reads made,
/// and a backend declared for every name its rules use that the VCL did not declare.
fn translated(dir: &std::path::Path, vcl: &str) -> (String, usize) {
    let file = dir.join("recipe.vcl");
    std::fs::write(&file, vcl).unwrap();
    let (status, out, err) = run_tool(
        binary("cachectl").to_str().unwrap(),
        &["vcl2rules", file.to_str().unwrap()],
    );
    assert_eq!(status, 0, "{err}");
    let untranslated = out
        .lines()
        .skip_while(|l| !l.starts_with("# Not translated"))
        .take_while(|l| !l.starts_with("# Needs no rule"))
        .filter(|l| l.starts_with("#   line "))
        .count();
    let mut config = out;
    for page in ["403.html", "500.html", "503.html"] {
        let at = dir.join(page);
        std::fs::write(&at, "<h1>error</h1>\n").unwrap();
        config = config.replace(&format!("/etc/varnish/{page}"), &at.display().to_string());
    }
    let table: toml::Table = config.parse().expect("the translation is TOML");
    let declared: Vec<String> = table
        .get("backend")
        .and_then(|b| b.as_array())
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("name")?.as_str().map(str::to_owned))
        .collect();
    let mut used: Vec<String> = table
        .get("rule")
        .and_then(|r| r.as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("backend")?.as_str().map(str::to_owned))
        .filter(|name| !declared.contains(name))
        .collect();
    if declared.is_empty() && used.is_empty() {
        used.push("app".into());
    }
    used.dedup();
    let mut head = String::new();
    for name in used {
        head.push_str(&format!(
            "[[backend]]\nname = \"{name}\"\naddress = \"127.0.0.1:9\"\n\n"
        ));
    }
    (head + &config, untranslated)
}

#[test]
fn every_recipe_translates_and_what_it_says_it_translated_behaves_as_the_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let recipes = recipes();
    assert!(recipes.len() >= 25, "{} recipes with VCL", recipes.len());
    let mut whole = 0;
    let mut report = Vec::new();
    for recipe in &recipes {
        let (config, untranslated) = translated(dir.path(), &recipe.vcl);
        let (status, stderr) = check(dir.path(), &config);
        assert_eq!(status, Some(0), "{}: {stderr}\n{config}", recipe.title);
        if recipe.examples.is_empty() {
            continue;
        }
        // The examples run through the whole rule set, whichever rule holds them: the last one does.
        let mut doc: toml::Table = config.parse().unwrap();
        let Some(last) = doc
            .get_mut("rule")
            .and_then(|r| r.as_array_mut())
            .and_then(|r| r.last_mut())
            .and_then(|r| r.as_table_mut())
        else {
            report.push(format!("{}: no rule made", recipe.title));
            continue;
        };
        last.insert(
            "examples".into(),
            toml::Value::Array(recipe.examples.clone()),
        );
        let with_examples = toml::to_string(&doc).unwrap();
        let (status, stderr) = check(dir.path(), &with_examples);
        report.push(format!(
            "{}: {} untranslated, examples {}",
            recipe.title,
            untranslated,
            if status == Some(0) { "hold" } else { "fail" }
        ));
        if untranslated == 0 {
            assert_eq!(
                status,
                Some(0),
                "{}: translated whole, but the recipe's examples fail:\n{stderr}\n{with_examples}",
                recipe.title
            );
            whole += 1;
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        whole >= 10,
        "{whole} recipes translated whole:\n{}",
        report.join("\n")
    );
}

/// Magento's purge contract, as vcl2rules reads it: the bans of sibling branches are one rule, the ACL
/// that answers 405 is `[purge] allow_from`, the `synth(200)` after the bans is the ban's own answer.
#[test]
fn magentos_purge_block_translates_into_one_ban_rule_and_the_acl() {
    let vcl = r#"
acl purge {
    "localhost";
    "10.0.0.0"/8;
}
sub vcl_recv {
    if (req.method == "PURGE") {
        if (client.ip !~ purge) {
            return (synth(405, "Method not allowed"));
        }
        if (!req.http.X-Magento-Tags-Pattern && !req.http.X-Pool) {
            return (synth(400, "X-Magento-Tags-Pattern or X-Pool header required"));
        }
        if (req.http.X-Magento-Tags-Pattern) {
          ban("obj.http.X-Magento-Tags ~ " + req.http.X-Magento-Tags-Pattern);
        }
        if (req.http.X-Pool) {
          ban("obj.http.X-Pool ~ " + req.http.X-Pool);
        }
        return (synth(200, "Purged"));
    }
}
"#;
    let dir = tempfile::tempdir().unwrap();
    let (config, untranslated) = translated(dir.path(), vcl);
    assert_eq!(untranslated, 0, "{config}");
    let table: toml::Table = config.parse().unwrap();
    assert_eq!(
        table["purge"]["allow_from"],
        toml::Value::Array(
            ["127.0.0.1/32", "::1/128", "10.0.0.0/8"]
                .iter()
                .map(|s| toml::Value::String((*s).into()))
                .collect()
        ),
        "{config}"
    );
    let rules = table["rule"].as_array().unwrap();
    let bans: Vec<&toml::Value> = rules.iter().filter(|r| r.get("ban").is_some()).collect();
    assert_eq!(bans.len(), 1, "{config}");
    assert_eq!(bans[0]["ban"].as_array().unwrap().len(), 2);
    assert!(
        rules.iter().all(|r| r
            .get("respond")
            .is_none_or(|x| x["status"].as_integer() == Some(400))),
        "{config}"
    );
    let (status, stderr) = check(dir.path(), &config);
    assert_eq!(status, Some(0), "{stderr}");
}
