//! `cachectl warm`: URLs fetched through the cache, at a bounded rate and concurrency, so that what a list
//! or yesterday's access log names is stored before clients ask; then how each went, by `Cache-Status`.

use std::{
    collections::BTreeMap,
    io::IsTerminal,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::Serialize;

/// One URL to warm: its host and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub target: String,
}

impl Url {
    /// `http://host/target` (or `https://`; the request goes to the cache's listener either way), or a
    /// target with `host` given.
    pub fn parse(text: &str, host: Option<&str>) -> Result<Self, String> {
        let rest = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"));
        match (rest, host) {
            (Some(rest), _) => {
                let (authority, target) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                if authority.is_empty() {
                    return Err(format!("{text}: no host"));
                }
                Ok(Self {
                    host: authority.to_owned(),
                    target: if target.is_empty() { "/" } else { target }.to_owned(),
                })
            }
            (None, Some(host)) if text.starts_with('/') => Ok(Self {
                host: host.to_owned(),
                target: text.to_owned(),
            }),
            _ => Err(format!(
                "{text}: give http://host/path, or a path with --host"
            )),
        }
    }
}

impl Url {
    /// `http://host/target`, for messages.
    fn name(&self) -> String {
        format!("http://{}{}", self.host, self.target)
    }
}

/// The URLs a list names: one per line; blank lines and `#` comments skipped; each once, in order.
pub fn from_list(text: &str, host: Option<&str>) -> Result<Vec<Url>, String> {
    let lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    dedup(
        lines
            .map(|l| Url::parse(l, host))
            .collect::<Result<_, _>>()?,
    )
}

/// The URLs an access log's `GET` requests name, each once, in the order first seen: lacquerd's `default`
/// format carries the full URL in the request line; `combined` (and NGINX's, Apache's, varnishncsa's with
/// a path) needs `host`. Lines of other methods, or that are not log lines, are skipped.
pub fn from_log(text: &str, host: Option<&str>) -> Result<Vec<Url>, String> {
    let mut urls = Vec::new();
    for line in text.lines() {
        let Some(request) = line.split('"').nth(1) else {
            continue;
        };
        let mut words = request.split(' ');
        if words.next() != Some("GET") {
            continue;
        }
        if let Some(Ok(url)) = words.next().map(|t| Url::parse(t, host)) {
            urls.push(url);
        }
    }
    dedup(urls)
}

/// The largest sitemap read, decoded: the protocol's own limit (sitemaps.org: 50 MB uncompressed).
const MAX_SITEMAP: u64 = 50 << 20;

/// Sitemaps of an index read at most: an index lists up to 50 000, each of up to 50 000 URLs; warming
/// that many is not what a list is for.
const MAX_SITEMAPS: usize = 1000;

/// What a sitemap lists (sitemaps.org): pages (`<urlset>`), or other sitemaps (`<sitemapindex>`).
#[derive(Debug, PartialEq, Eq)]
enum Sitemap {
    Pages(Vec<String>),
    Index(Vec<String>),
}

/// Reads a sitemap's `<loc>` entries, entities and character references resolved, whitespace trimmed.
fn read_sitemap(xml: &[u8]) -> Result<Sitemap, String> {
    use quick_xml::{escape::resolve_predefined_entity, events::Event};
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut root: Option<Vec<u8>> = None;
    let mut loc: Option<String> = None;
    let mut locs = Vec::new();
    let bad = |e: &dyn std::fmt::Display, at: u64| format!("not a sitemap: {e} at byte {at}");
    loop {
        let event = reader
            .read_event()
            .map_err(|e| bad(&e, reader.error_position()))?;
        let at = reader.buffer_position();
        match event {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_vec();
                if name == b"loc" {
                    loc = Some(String::new());
                }
                root.get_or_insert(name);
            }
            Event::Text(t) => {
                if let Some(loc) = &mut loc {
                    loc.push_str(&t.decode().map_err(|e| bad(&e, at))?);
                }
            }
            Event::CData(t) => {
                if let Some(loc) = &mut loc {
                    loc.push_str(&t.decode().map_err(|e| bad(&e, at))?);
                }
            }
            Event::GeneralRef(r) => {
                if let Some(loc) = &mut loc {
                    match r.resolve_char_ref().map_err(|e| bad(&e, at))? {
                        Some(c) => loc.push(c),
                        None => {
                            let name = r.decode().map_err(|e| bad(&e, at))?;
                            let text = resolve_predefined_entity(&name)
                                .ok_or_else(|| bad(&format!("unknown entity &{name};"), at))?;
                            loc.push_str(text);
                        }
                    }
                }
            }
            Event::End(e) if e.local_name().as_ref() == b"loc" => {
                if let Some(found) = loc.take() {
                    locs.push(found.trim().to_owned());
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    match root.as_deref() {
        Some(b"urlset") => Ok(Sitemap::Pages(locs)),
        Some(b"sitemapindex") => Ok(Sitemap::Index(locs)),
        _ => Err("not a sitemap: its root is neither <urlset> nor <sitemapindex>".into()),
    }
}

/// The pages a sitemap at `url` lists, fetched through the cache at `via` (a sitemap index's sitemaps
/// too, at most [`MAX_SITEMAPS`]), each once, in order. Sitemaps compressed with gzip (`.xml.gz`) are
/// read too.
pub async fn from_sitemap(url: &Url, via: SocketAddr) -> Result<Vec<Url>, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let read = |url: Url| {
        let client = client.clone();
        async move {
            let body = fetch_body(&client, via, &url, MAX_SITEMAP).await?;
            read_sitemap(&body).map_err(|e| format!("{}: {e}", url.name()))
        }
    };
    let urls = |locs: Vec<String>| {
        locs.iter()
            .map(|l| Url::parse(l, None))
            .collect::<Result<Vec<_>, _>>()
    };
    match read(url.clone()).await? {
        Sitemap::Pages(locs) => dedup(urls(locs)?),
        Sitemap::Index(sitemaps) => {
            let mut all = Vec::new();
            for sitemap in urls(sitemaps)?.into_iter().take(MAX_SITEMAPS) {
                match read(sitemap.clone()).await? {
                    Sitemap::Pages(locs) => all.extend(urls(locs)?),
                    Sitemap::Index(_) => {
                        return Err(format!(
                            "{}: an index within an index (the protocol allows none)",
                            sitemap.name()
                        ))
                    }
                }
            }
            dedup(all)
        }
    }
}

/// `url`'s body, fetched through the cache at `via`, decoded when gzip'd (by `Content-Encoding`, or a
/// `.gz` file's own bytes), at most `limit` bytes decoded.
async fn fetch_body(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    via: SocketAddr,
    url: &Url,
    limit: u64,
) -> Result<Bytes, String> {
    use http_body::Body as _;
    let name = url.name();
    let req = http::Request::get(format!("http://{via}{}", url.target))
        .header(http::header::HOST, &url.host)
        .header(http::header::USER_AGENT, "cachectl-warm")
        .body(Empty::new())
        .map_err(|e| format!("{name}: {e}"))?;
    let resp = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .map_err(|_| format!("{name}: no answer in 60 s"))?
        .map_err(|e| format!("{name}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{name}: status {}", resp.status().as_u16()));
    }
    if resp.body().size_hint().lower() > limit {
        return Err(format!("{name}: larger than {limit} bytes"));
    }
    let mut body = resp.into_body();
    let mut raw = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("{name}: {e}"))?;
        if let Ok(data) = frame.into_data() {
            raw.extend_from_slice(&data);
            if raw.len() as u64 > limit {
                return Err(format!("{name}: larger than {limit} bytes"));
            }
        }
    }
    // A `.xml.gz` is gzip'd bytes, with or without a `Content-Encoding` saying so.
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(Bytes::from(raw));
    }
    let mut decoder = lacquer_codec::Decoder::new(lacquer_codec::Coding::Gzip, limit);
    decoder.feed(Bytes::from(raw));
    decoder.end();
    let mut out = Vec::new();
    while let Some(piece) = decoder.piece().map_err(|e| format!("{name}: {e}"))? {
        out.extend_from_slice(&piece);
    }
    Ok(Bytes::from(out))
}

fn dedup(urls: Vec<Url>) -> Result<Vec<Url>, String> {
    let mut seen = std::collections::HashSet::new();
    Ok(urls
        .into_iter()
        .filter(|u| seen.insert((u.host.clone(), u.target.clone())))
        .collect())
}

/// How the URLs went.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// URLs fetched.
    pub urls: usize,
    /// Served from the cache: stored already.
    pub cached: usize,
    /// Fetched from the origin and stored.
    pub stored: usize,
    /// Answered but not stored, by the `Cache-Status` detail (why).
    pub not_stored: BTreeMap<String, usize>,
    /// No answer, or an error status, by what happened.
    pub failed: BTreeMap<String, usize>,
    /// Seconds the run took.
    pub seconds: f64,
}

/// Warms `urls` through the cache listening at `via`: at most `rate` requests a second, `concurrency` at
/// once, each a plain `GET` as a client with nothing special sends (no `Accept-Encoding`: the variant
/// most clients share when lacquerd negotiates codings, as it does by default).
pub async fn warm(urls: Vec<Url>, via: SocketAddr, rate: f64, concurrency: usize) -> Summary {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let total = urls.len();
    let done = Arc::new(AtomicUsize::new(0));
    let progress = std::io::stderr().is_terminal();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    let mut tasks = Vec::with_capacity(total);
    for url in urls {
        ticks.tick().await;
        let permit = gate.clone().acquire_owned().await.expect("never closed");
        let (client, done) = (client.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = fetch(&client, via, &url).await;
            drop(permit);
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if progress {
                eprint!("\rwarming: {n}/{total}");
            }
            outcome
        }));
    }
    let mut summary = Summary {
        urls: total,
        ..Summary::default()
    };
    for task in tasks {
        match task.await.unwrap_or(Outcome::Failed("panicked".into())) {
            Outcome::Cached => summary.cached += 1,
            Outcome::Stored => summary.stored += 1,
            Outcome::NotStored(why) => *summary.not_stored.entry(why).or_default() += 1,
            Outcome::Failed(why) => *summary.failed.entry(why).or_default() += 1,
        }
    }
    if progress {
        eprintln!();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary
}

enum Outcome {
    Cached,
    Stored,
    NotStored(String),
    Failed(String),
}

async fn fetch(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    via: SocketAddr,
    url: &Url,
) -> Outcome {
    let req = http::Request::get(format!("http://{via}{}", url.target))
        .header(http::header::HOST, &url.host)
        .header(http::header::USER_AGENT, "cachectl-warm")
        .body(Empty::new());
    let Ok(req) = req else {
        return Outcome::Failed("not a request".into());
    };
    let resp = match tokio::time::timeout(Duration::from_secs(60), client.request(req)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(_)) => return Outcome::Failed("connection".into()),
        Err(_) => return Outcome::Failed("timeout".into()),
    };
    let status = resp.status();
    let cache_status = resp
        .headers()
        .get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // The body is read to its end: a fill stores what its readers took whole.
    if resp.into_body().collect().await.is_err() {
        return Outcome::Failed("body".into());
    }
    if status.is_server_error() {
        return Outcome::Failed(format!("status {}", status.as_u16()));
    }
    classify(&cache_status)
}

/// What lacquerd's `Cache-Status` says happened.
fn classify(cache_status: &str) -> Outcome {
    let params: Vec<&str> = cache_status.split(';').map(str::trim).collect();
    let detail = params
        .iter()
        .find_map(|p| p.strip_prefix("detail="))
        .map(|d| d.trim_matches('"').to_owned());
    if params.contains(&"hit") {
        Outcome::Cached
    } else if params.contains(&"stored") {
        Outcome::Stored
    } else if let Some(p) = params.iter().find(|p| p.starts_with("fwd=")) {
        Outcome::NotStored(detail.unwrap_or_else(|| p.trim_start_matches("fwd=").to_owned()))
    } else {
        Outcome::NotStored("no Cache-Status".into())
    }
}

/// The summary as people read it.
pub fn render(s: &Summary) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{} URLs in {:.1} s: {} already cached, {} stored, {} not stored, {} failed\n",
        s.urls,
        s.seconds,
        s.cached,
        s.stored,
        s.not_stored.values().sum::<usize>(),
        s.failed.values().sum::<usize>()
    );
    for (why, n) in &s.not_stored {
        let _ = writeln!(out, "  not stored: {why}: {n}");
    }
    for (why, n) in &s.failed {
        let _ = writeln!(out, "  failed: {why}: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sitemaps_as_sites_write_them() {
        // As sitemaps.org shows one, with an entity in a query and surrounding whitespace.
        let urlset = br#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
   <url>
      <loc>http://www.example.com/</loc>
      <lastmod>2005-01-01</lastmod>
      <changefreq>monthly</changefreq>
      <priority>0.8</priority>
   </url>
   <url>
      <loc>
        http://www.example.com/catalog?item=12&amp;desc=vacation_hawaii
      </loc>
   </url>
   <url><loc><![CDATA[http://www.example.com/cdata?a=1&b=2]]></loc></url>
   <url><loc>http://www.example.com/caf&#233;</loc></url>
</urlset>"#;
        assert_eq!(
            read_sitemap(urlset),
            Ok(Sitemap::Pages(vec![
                "http://www.example.com/".into(),
                "http://www.example.com/catalog?item=12&desc=vacation_hawaii".into(),
                "http://www.example.com/cdata?a=1&b=2".into(),
                "http://www.example.com/café".into(),
            ]))
        );
        // A prefixed namespace, as some generators write it; an index.
        let index = br#"<sm:sitemapindex xmlns:sm="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sm:sitemap><sm:loc>http://www.example.com/sitemap1.xml.gz</sm:loc></sm:sitemap>
  <sm:sitemap><sm:loc>http://www.example.com/sitemap2.xml.gz</sm:loc></sm:sitemap>
</sm:sitemapindex>"#;
        assert_eq!(
            read_sitemap(index),
            Ok(Sitemap::Index(vec![
                "http://www.example.com/sitemap1.xml.gz".into(),
                "http://www.example.com/sitemap2.xml.gz".into(),
            ]))
        );
        for bad in [
            &b"<html><body>not found</body></html>"[..],
            b"<urlset><url><loc>http://a/</url></urlset>",
            b"<urlset><url><loc>http://a/&nbsp;</loc></url></urlset>",
            b"",
        ] {
            assert!(
                read_sitemap(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lists_and_logs() {
        let list =
            "# the front\nhttp://shop.test/\nhttp://shop.test/a?b=1\n\n/c\nhttp://shop.test/\n";
        assert!(from_list(list, None).is_err(), "a path without --host");
        let urls = from_list(list, Some("shop.test")).unwrap();
        let targets: Vec<&str> = urls.iter().map(|u| u.target.as_str()).collect();
        assert_eq!(targets, ["/", "/a?b=1", "/c"]);
        let log = "203.0.113.7 - - [30/Nov/2026:07:36:14 +0000] \"GET http://www.example.com/a?b=1 HTTP/1.1\" 200 2048 \"-\" \"curl/8.0\" HIT 0.0001 0.0004 -\n\
                   203.0.113.7 - - [30/Nov/2026:07:36:15 +0000] \"POST http://www.example.com/cart HTTP/1.1\" 200 5 \"-\" \"curl/8.0\" PASS 0.01 0.01 -\n\
                   garbage\n\
                   203.0.113.8 - - [30/Nov/2026:07:36:16 +0000] \"GET /b HTTP/1.1\" 200 5 \"-\" \"x\"\n";
        let urls = from_log(log, Some("www.example.com")).unwrap();
        assert_eq!(
            urls,
            [
                Url::parse("http://www.example.com/a?b=1", None).unwrap(),
                Url::parse("http://www.example.com/b", None).unwrap(),
            ]
        );
    }

    #[test]
    fn cache_status_says_what_happened() {
        let table = [
            ("lacquer; hit; ttl=30", "cached"),
            ("lacquer; fwd=miss; stored", "stored"),
            ("lacquer; fwd=miss; stored; collapsed", "stored"),
            (
                "lacquer; fwd=miss; detail=\"private\"",
                "not stored: private",
            ),
            (
                "lacquer; fwd=bypass; detail=\"cookie\"",
                "not stored: cookie",
            ),
            ("lacquer; fwd=bypass", "not stored: bypass"),
        ];
        for (header, want) in table {
            let got = match classify(header) {
                Outcome::Cached => "cached".to_owned(),
                Outcome::Stored => "stored".to_owned(),
                Outcome::NotStored(why) => format!("not stored: {why}"),
                Outcome::Failed(why) => format!("failed: {why}"),
            };
            assert_eq!(got, want, "{header}");
        }
    }
}
