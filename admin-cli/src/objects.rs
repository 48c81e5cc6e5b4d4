//! `cachectl inspect`: what the store holds for a URL.

use std::{
    fmt::Write,
    time::{Duration, UNIX_EPOCH},
};

use lacquer_admin::{
    format::{bytes, duration},
    wire::{Inspection, NotStoredNote, ObjectQuery, StoredVariant},
    AdminClient, AdminError,
};

use crate::Output;

pub async fn inspect(
    client: &AdminClient,
    out: Output,
    url: String,
    host: Option<String>,
) -> Result<(), AdminError> {
    let inspection = client.inspect(&ObjectQuery { url, host }).await?;
    out.show(&inspection, render);
    Ok(())
}

fn render(i: &Inspection) -> String {
    let mut out = match i.cached {
        false => format!("not cached: {}\n", i.key),
        true => format!(
            "{}: {} variant{}\n",
            i.key,
            i.variants.len(),
            if i.variants.len() == 1 { "" } else { "s" }
        ),
    };
    if let Some(note) = &i.not_stored {
        out += &not_stored(note);
    }
    for (n, v) in i.variants.iter().enumerate() {
        out += &variant(n + 1, v);
    }
    out
}

fn not_stored(note: &NotStoredNote) -> String {
    let at = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(note.at));
    format!(
        "not stored {} ({at}); requests bypass the cache for {} more\n",
        note.reason,
        duration(note.bypass_seconds)
    )
}

fn variant(n: usize, v: &StoredVariant) -> String {
    let vary = if v.vary.is_empty() {
        String::new()
    } else {
        let pairs: Vec<String> = v
            .vary
            .iter()
            .map(|h| match h.value.as_str() {
                "" => format!("{} absent", h.name),
                value => format!("{}: {value}", h.name),
            })
            .collect();
        format!(" ({})", pairs.join(", "))
    };
    let ttl = if v.ttl_seconds >= 0 {
        format!("{} left", duration(v.ttl_seconds as u64))
    } else {
        format!("stale for {}", duration(v.ttl_seconds.unsigned_abs()))
    };
    let t = &v.tiers;
    let stored_at = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(v.stored_at));
    let mut out = String::new();
    let _ = writeln!(out, "\nvariant {n}{vary}");
    let _ = writeln!(
        out,
        "  status     {}, {}",
        v.status,
        bytes(v.total.unwrap_or(v.size))
    );
    match v.total {
        // Stored in parts: where each part is follows.
        Some(total) => {
            let (chunks, in_memory, on_disk) = v.parts.iter().fold((0, 0, 0), |(c, m, d), p| {
                (
                    c + p.tiers.chunks,
                    m + p.tiers.in_memory,
                    d + p.tiers.on_disk,
                )
            });
            let _ = writeln!(
                out,
                "  where      {} of {} held in {} part{}: {chunks} chunks, {in_memory} in memory, {on_disk} on disk",
                bytes(v.size),
                bytes(total),
                v.parts.len(),
                if v.parts.len() == 1 { "" } else { "s" },
            );
        }
        None => {
            let _ = writeln!(
                out,
                "  where      {} chunk{}: {} in memory, {} on disk",
                t.chunks,
                if t.chunks == 1 { "" } else { "s" },
                t.in_memory,
                t.on_disk
            );
        }
    }
    let _ = writeln!(
        out,
        "  freshness  {}: age {}, ttl {ttl}, grace {}, keep {}, stale-if-error {}{}",
        v.state,
        duration(v.age_seconds),
        duration(v.grace_seconds),
        duration(v.keep_seconds),
        duration(v.stale_if_error_seconds),
        match (v.no_stale, &v.stale_forbidden_by) {
            (true, Some(directive)) => {
                format!(", never served stale (the origin's {directive} forbids it, whatever grace a rule gives)")
            }
            (true, None) => ", never served stale".to_owned(),
            (false, _) => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "  stored     {stored_at} (generation {})",
        v.generation
    );
    for (i, p) in v.parts.iter().enumerate() {
        let label = if i == 0 { "parts" } else { "" };
        let _ = writeln!(
            out,
            "  {label:<9}  bytes {}-{}: {} in memory, {} on disk (generation {})",
            p.start,
            p.start + p.size.max(1) - 1,
            p.tiers.in_memory,
            p.tiers.on_disk,
            p.generation
        );
    }
    for r in &v.representations {
        let t = &r.tiers;
        let _ = writeln!(
            out,
            "  also as    {}, {}: {} in memory, {} on disk (generation {})",
            r.coding,
            bytes(r.size),
            t.in_memory,
            t.on_disk,
            r.generation
        );
    }
    if let Some(includes) = &v.esi_includes {
        if includes.is_empty() {
            let _ = writeln!(out, "  esi        a page without includes");
        }
        for (i, include) in includes.iter().enumerate() {
            let label = if i == 0 { "esi" } else { "" };
            let _ = writeln!(
                out,
                "  {label:<9}  include {}{}",
                include.src,
                if include.continue_on_error {
                    " (onerror=\"continue\")"
                } else {
                    ""
                }
            );
        }
    }
    if !v.tags.is_empty() {
        let _ = writeln!(out, "  tags       {}", v.tags.join(" "));
    }
    for (i, h) in v.headers.iter().enumerate() {
        let label = if i == 0 { "headers" } else { "" };
        let _ = writeln!(out, "  {label:<9}  {}: {}", h.name, h.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{EsiInclude, HeaderField, Representation, StoredPart, Tiers};

    use super::*;

    #[test]
    fn a_variant_reads_like_a_report() {
        let field = |name: &str, value: &str| HeaderField {
            name: name.into(),
            value: value.into(),
        };
        let i = Inspection {
            key: "example.com/a".into(),
            cached: true,
            variants: vec![StoredVariant {
                vary: vec![field("accept-encoding", "gzip")],
                status: 200,
                size: 2048,
                tiers: Tiers {
                    chunks: 1,
                    in_memory: 1,
                    on_disk: 0,
                },
                state: "grace".into(),
                stored_at: 1_700_000_000,
                age_seconds: 70,
                ttl_seconds: -10,
                grace_seconds: 60,
                keep_seconds: 0,
                stale_if_error_seconds: 0,
                no_stale: false,
                stale_forbidden_by: None,
                tags: vec!["p1".into(), "p2".into()],
                headers: vec![field("content-type", "text/html"), field("etag", "\"x\"")],
                generation: 9,
                representations: vec![Representation {
                    coding: "identity".into(),
                    size: 8192,
                    tiers: Tiers {
                        chunks: 1,
                        in_memory: 0,
                        on_disk: 1,
                    },
                    generation: 12,
                }],
                total: None,
                parts: Vec::new(),
                esi_includes: Some(vec![
                    EsiInclude {
                        src: "/nav".into(),
                        continue_on_error: false,
                    },
                    EsiInclude {
                        src: "footer?x=1".into(),
                        continue_on_error: true,
                    },
                ]),
            }],
            not_stored: None,
        };
        let text = render(&i);
        for want in [
            "example.com/a: 1 variant\n",
            "variant 1 (accept-encoding: gzip)\n",
            "  status     200, 2.0 KiB\n",
            "  where      1 chunk: 1 in memory, 0 on disk\n",
            "  freshness  grace: age 1m 10s, ttl stale for 10s, grace 1m 0s, keep 0s, stale-if-error 0s\n",
            "  stored     Tue, 14 Nov 2023 22:13:20 GMT (generation 9)\n",
            "  also as    identity, 8.0 KiB: 0 in memory, 1 on disk (generation 12)\n",
            "  esi        include /nav\n             include footer?x=1 (onerror=\"continue\")\n",
            "  tags       p1 p2\n",
            "  headers    content-type: text/html\n             etag: \"x\"\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let sliced = StoredVariant {
            size: 16 << 20,
            total: Some(1 << 30),
            parts: [0u64, 48 << 20]
                .iter()
                .enumerate()
                .map(|(n, &start)| StoredPart {
                    start,
                    size: 8 << 20,
                    tiers: Tiers {
                        chunks: 32,
                        in_memory: 2 * n as u32,
                        on_disk: 32,
                    },
                    generation: 20 + n as u64,
                })
                .collect(),
            representations: Vec::new(),
            ..i.variants[0].clone()
        };
        let text = render(&Inspection {
            variants: vec![sliced],
            ..i.clone()
        });
        for want in [
            "  status     200, 1.0 GiB\n",
            "  where      16.0 MiB of 1.0 GiB held in 2 parts: 64 chunks, 2 in memory, 64 on disk\n",
            "  parts      bytes 0-8388607: 0 in memory, 32 on disk (generation 20)\n",
            "             bytes 50331648-58720255: 2 in memory, 32 on disk (generation 21)\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let none = Inspection {
            key: "k".into(),
            cached: false,
            variants: vec![],
            not_stored: None,
        };
        assert_eq!(render(&none), "not cached: k\n");
        let private = Inspection {
            not_stored: Some(NotStoredNote {
                reason: "private".into(),
                at: 1_700_000_000,
                bypass_seconds: 95,
            }),
            ..none
        };
        assert_eq!(
            render(&private),
            "not cached: k\nnot stored private (Tue, 14 Nov 2023 22:13:20 GMT); requests bypass the cache for 1m 35s more\n"
        );
    }
}
