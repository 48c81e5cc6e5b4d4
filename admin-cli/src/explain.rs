//! `cachectl explain`: what the running daemon would do with a request, and why, without the origin.

use std::fmt::Write;

use lacquer_admin::{
    format::duration,
    wire::{ExplainRequest, ExplainedResponse, Explanation, HeaderField},
    AdminClient, AdminError,
};

use crate::Output;

pub async fn explain(
    client: &AdminClient,
    out: Output,
    request: ExplainRequest,
) -> Result<(), AdminError> {
    let explanation = client.explain(&request).await?;
    out.show(&explanation, render);
    Ok(())
}

/// `Name: value`, as curl's `-H` takes it: the name before the first colon, the value trimmed.
pub fn header_field(text: &str) -> Result<HeaderField, String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: give a header as 'Name: value'"))?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("{text:?}: the header has no name before its colon"));
    }
    Ok(HeaderField {
        name: name.to_owned(),
        value: value.trim().to_owned(),
    })
}

/// The label column's width: every line reads `label  text`.
const LABEL: usize = 12;

fn line(out: &mut String, label: &str, text: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<LABEL$}{text}");
}

/// Header fields one per line, the first after `label`, the rest under it.
fn fields(out: &mut String, label: &str, first: Option<String>, headers: &[HeaderField]) {
    let mut label = label;
    if let Some(first) = first {
        line(out, label, first);
        label = "";
    }
    for h in headers {
        line(out, label, format!("{}: {}", h.name, h.value));
        label = "";
    }
}

fn response(out: &mut String, label: &str, r: &ExplainedResponse) {
    fields(out, label, Some(r.status.to_string()), &r.headers);
}

fn render(e: &Explanation) -> String {
    let mut out = String::new();
    match &e.reason {
        Some(reason) => line(&mut out, "action", format!("{} ({reason})", e.action)),
        None => line(&mut out, "action", &e.action),
    }
    // Neither is chosen for a request answered before routing (a rule's answer, a deny, a bad head).
    for (label, value) in [("route", &e.route), ("backend", &e.backend)] {
        if !value.is_empty() {
            line(&mut out, label, value);
        }
    }
    line(
        &mut out,
        "key",
        e.key.as_deref().unwrap_or("none (not looked up)"),
    );
    if !e.key_fields.is_empty() {
        line(&mut out, "key fields", e.key_fields.join(", "));
    }
    let mut label = "early hints";
    for link in &e.early_hints {
        line(&mut out, label, link);
        label = "";
    }
    if e.rules.is_empty() {
        line(&mut out, "rules", "none");
    }
    let name_width = e.rules.iter().map(|r| r.name.chars().count()).max();
    let mut label = "rules";
    for r in &e.rules {
        let mark = if r.matched { "matched" } else { "-" };
        let name = format!("{:<w$}", r.name, w = name_width.unwrap_or(0));
        line(&mut out, label, format!("{:<16}  {name}  {mark}", r.phase));
        label = "";
    }
    // Nothing leaves for the origin when the daemon answers itself.
    if !matches!(e.action.as_str(), "synthetic" | "denied" | "refused") {
        fields(
            &mut out,
            "to origin",
            Some(format!("{} {}", e.method, e.target)),
            &e.headers,
        );
    }
    if let Some(s) = &e.synthetic {
        response(&mut out, "synthetic", s);
    }
    match &e.stored {
        None if e.key.is_some() => line(&mut out, "stored", "nothing (a miss)"),
        None => {}
        Some(o) => {
            let ttl = if o.ttl_seconds >= 0 {
                format!("{} left", duration(o.ttl_seconds as u64))
            } else {
                format!("stale for {}", duration(o.ttl_seconds.unsigned_abs()))
            };
            line(&mut out, "stored", format!("{}, {ttl}", o.state));
            let grace = match (o.would_grace_seconds, &o.stale_forbidden_by) {
                (_, Some(directive)) => {
                    format!(", no grace (the origin's {directive} forbids serving it stale)")
                }
                (Some(g), None) if g > 0 => format!(", grace {}", duration(g)),
                _ => String::new(),
            };
            let storable = match (o.storable, &o.not_stored_because, o.would_ttl_seconds) {
                (true, _, Some(ttl)) => format!("yes, fresh for {}{grace}", duration(ttl)),
                (true, _, None) => "yes".to_owned(),
                (false, Some(why), _) => format!("no: {why}"),
                (false, None, _) => "no".to_owned(),
            };
            line(&mut out, "refetched", format!("stored again: {storable}"));
            response(&mut out, "response", &o.response);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{ExplainedObject, RuleStep};

    use super::*;

    fn field(name: &str, value: &str) -> HeaderField {
        HeaderField {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn headers_as_curl_takes_them() {
        let cases = [
            ("Host: example.com", Ok(("Host", "example.com"))),
            ("x-a:b", Ok(("x-a", "b"))),
            ("X-Empty:", Ok(("X-Empty", ""))),
            ("Cookie: a=1; b=2:3", Ok(("Cookie", "a=1; b=2:3"))),
            ("no colon", Err(())),
            (": value", Err(())),
            ("a b: c", Err(())),
        ];
        for (text, want) in cases {
            let got = header_field(text)
                .map(|h| (h.name, h.value))
                .map_err(|_| ());
            let want = want.map(|(n, v)| (n.to_owned(), v.to_owned()));
            assert_eq!(got, want, "{text:?}");
        }
    }

    fn step(index: usize, name: &str, phase: &str, matched: bool) -> RuleStep {
        RuleStep {
            index,
            name: name.into(),
            phase: phase.into(),
            matched,
        }
    }

    fn explanation() -> Explanation {
        Explanation {
            action: "lookup".into(),
            reason: None,
            rules: vec![
                step(0, "strip-utm", "request", true),
                step(2, "rule[2]", "request", false),
                step(3, "hsts", "deliver", true),
            ],
            method: "GET".into(),
            target: "/a?b=1".into(),
            headers: vec![field("host", "example.com"), field("x-device", "mobile")],
            route: "route[0]".into(),
            backend: "default".into(),
            key: Some("example.com/a?b=1".into()),
            key_fields: vec!["x-device".into(), "accept-encoding".into()],
            early_hints: vec![],
            synthetic: None,
            stored: Some(ExplainedObject {
                state: "grace".into(),
                ttl_seconds: -5,
                storable: true,
                not_stored_because: None,
                would_ttl_seconds: Some(60),
                would_grace_seconds: Some(0),
                stale_forbidden_by: Some("must-revalidate".into()),
                response: ExplainedResponse {
                    status: 200,
                    headers: vec![
                        field("content-type", "text/html"),
                        field("strict-transport-security", "max-age=300"),
                    ],
                },
            }),
        }
    }

    #[test]
    fn a_lookup_reads_like_a_report() {
        assert_eq!(
            render(&explanation()),
            "\
action      lookup
route       route[0]
backend     default
key         example.com/a?b=1
key fields  x-device, accept-encoding
rules       request           strip-utm  matched
            request           rule[2]    -
            deliver           hsts       matched
to origin   GET /a?b=1
            host: example.com
            x-device: mobile
stored      grace, stale for 5s
refetched   stored again: yes, fresh for 1m 0s, no grace (the origin's must-revalidate forbids serving it stale)
response    200
            content-type: text/html
            strict-transport-security: max-age=300
"
        );
    }

    #[test]
    fn a_synthetic_answer_sends_nothing_to_the_origin() {
        let e = Explanation {
            action: "synthetic".into(),
            reason: Some("rule \"old\"".into()),
            rules: vec![step(0, "old", "request", true)],
            key: None,
            key_fields: vec![],
            early_hints: vec![],
            synthetic: Some(ExplainedResponse {
                status: 301,
                headers: vec![field("location", "/new/a")],
            }),
            stored: None,
            route: String::new(),
            backend: String::new(),
            ..explanation()
        };
        assert_eq!(
            render(&e),
            "\
action      synthetic (rule \"old\")
key         none (not looked up)
rules       request           old  matched
synthetic   301
            location: /new/a
"
        );
        let pass = Explanation {
            action: "pass".into(),
            reason: Some("cookie".into()),
            rules: vec![],
            key: None,
            stored: None,
            headers: vec![],
            ..explanation()
        };
        let text = render(&pass);
        assert!(text.contains("rules       none\n"), "{text}");
        assert!(text.contains("to origin   GET /a?b=1\n"), "{text}");
        assert!(!text.contains("stored"), "{text}");
        let unstorable = Explanation {
            stored: Some(ExplainedObject {
                storable: false,
                not_stored_because: Some("rule \"no-store\"".into()),
                would_ttl_seconds: None,
                would_grace_seconds: None,
                stale_forbidden_by: None,
                ttl_seconds: 30,
                state: "fresh".into(),
                ..explanation().stored.unwrap()
            }),
            ..explanation()
        };
        let text = render(&unstorable);
        assert!(text.contains("stored      fresh, 30s left\n"), "{text}");
        assert!(
            text.contains("refetched   stored again: no: rule \"no-store\"\n"),
            "{text}"
        );
        let miss = Explanation {
            stored: None,
            ..explanation()
        };
        assert!(render(&miss).contains("stored      nothing (a miss)\n"));
    }
}
