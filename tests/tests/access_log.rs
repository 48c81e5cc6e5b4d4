//! The access log end to end: the line formats (default, JSON lines, a format string, set by a reload), the
//! PROXY client in it, reopening on SIGUSR1, sampling, and the live stream on the admin API.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_admin::{wire::LogFilter, AdminClient, LogEvent, Target};
use lacquer_tests::{get, request, Daemon, Origin, Reply};
use regex::Regex;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

async fn origin() -> Origin {
    Origin::start(|seen| match seen.path.as_str() {
        "/missing" => Reply::ok("no").status(404),
        _ => Reply::ok("hello").header("cache-control", "max-age=60"),
    })
    .await
}

fn start(origin: &Origin, access_log: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[[listen]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n\
             [access_log]\n{access_log}"
        ),
    )
}

/// The file's lines once it has `n` of them (the writer flushes when its queue runs dry).
async fn lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {} lines, not {n}",
            path.display(),
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_request_gets_a_combined_line_with_cache_fields_and_logrotate_works() {
    let origin = origin().await;
    let d = start(&origin, "path = \"{dir}/access.log\"\n");
    let file = d.dir.path().join("access.log");
    get(d.addr, "/a?x=1").await;
    get(d.addr, "/a?x=1").await;
    request(
        d.addr,
        Method::GET,
        "/missing",
        &[
            ("referer", "https://example.test/"),
            ("user-agent", "curl/8.0 \"quoted\""),
        ],
        Bytes::new(),
    )
    .await
    .unwrap();
    let mut s = TcpStream::connect(d.listeners[1]).await.unwrap();
    s.write_all(b"PROXY TCP4 203.0.113.7 192.0.2.1 5000 80\r\nGET /a?x=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    s.read_to_end(&mut Vec::new()).await.unwrap();

    let got = lines(&file, 4).await;
    let line = Regex::new(
        r#"^(\S+) - - \[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] "GET http://[^/\s]+(\S+) HTTP/1\.1" (\d{3}) (\d+|-) "([^"]*)" "([^"]*)" (HIT|MISS|PASS|STALE|-) (\d+\.\d{6}) (\d+\.\d{6}) (\S+)$"#,
    )
    .unwrap();
    let fields: Vec<Vec<String>> = got
        .iter()
        .map(|l| {
            let c = line
                .captures(l)
                .unwrap_or_else(|| panic!("not a combined line: {l}"));
            (1..=10).map(|i| c[i].to_owned()).collect()
        })
        .collect();
    fn short(f: &[String]) -> Vec<&str> {
        [&f[0], &f[1], &f[2], &f[3], &f[6]]
            .map(|s| s.as_str())
            .to_vec()
    }
    assert_eq!(
        short(&fields[0]),
        ["127.0.0.1", "/a?x=1", "200", "5", "MISS"]
    );
    assert_eq!(
        short(&fields[1]),
        ["127.0.0.1", "/a?x=1", "200", "5", "HIT"]
    );
    assert_eq!(short(&fields[2])[1..3], ["/missing", "404"]);
    // Why it was not stored: Cache-Status's detail, last; `-` for the others.
    assert_eq!(
        [&fields[0][9], &fields[1][9], &fields[2][9]],
        ["-", "-", "not-fresh"]
    );
    assert_eq!(fields[2][4], "https://example.test/");
    assert_eq!(
        fields[2][5], "curl/8.0 \\x22quoted\\x22",
        "quotes cannot end the field"
    );
    assert_eq!(
        short(&fields[3]),
        ["203.0.113.7", "/a?x=1", "200", "5", "MISS"],
        "the PROXY client"
    );
    for f in &fields {
        let (ttfb, total): (f64, f64) = (f[7].parse().unwrap(), f[8].parse().unwrap());
        assert!(ttfb <= total && total < 5.0, "{f:?}");
    }

    // logrotate: the file is moved away, SIGUSR1, and new lines go to a new file.
    let rotated = d.dir.path().join("access.log.1");
    std::fs::rename(&file, &rotated).unwrap();
    d.notify(libc::SIGUSR1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() {
        assert!(Instant::now() < deadline, "no new file after SIGUSR1");
        get(d.addr, "/after").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Lines for requests made while the signal was on its way may be in either file; later ones are new.
    get(d.addr, "/fresh").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&file).unwrap().contains("/fresh") {
        assert!(
            Instant::now() < deadline,
            "/fresh never reached the new file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.starts_with(&got.join("\n")), "{old}");
    assert!(!old.contains("/fresh"), "{old}");
}

#[tokio::test]
async fn the_default_line_has_the_host_and_json_lines_escape_hostile_heads() {
    let origin = origin().await;
    let d = start(&origin, "path = \"{dir}/access.log\"\nformat = \"json\"\n");
    let file = d.dir.path().join("access.log");
    // A head no well-behaved client sends: quotes, a backslash, braces, a tab, bytes that are not UTF-8,
    // in fields the log writes (hyper refuses other control bytes before any line is written).
    let mut s = TcpStream::connect(d.addr).await.unwrap();
    s.write_all(
        b"GET /a?q=%22x HTTP/1.1\r\nHost: shop.test\r\nUser-Agent: \"},{\"status\":1 \\ \xff\xfe\r\n\
          Referer: \"\tx\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    s.read_to_end(&mut Vec::new()).await.unwrap();
    request(
        d.addr,
        Method::GET,
        "/a?q=%22x",
        &[("host", "shop.test")],
        Bytes::new(),
    )
    .await
    .unwrap();
    let got = lines(&file, 2).await;
    let records: Vec<serde_json::Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let first = &records[0];
    assert_eq!(first["host"], "shop.test");
    assert_eq!(first["url"], "/a?q=%22x");
    assert_eq!(first["status"], 200);
    assert_eq!(first["cache"], "MISS");
    assert_eq!(first["backend"], "default");
    assert_eq!(first["route"], "default");
    assert_eq!(first["user_agent"], "\"},{\"status\":1 \\ \u{fffd}\u{fffd}");
    assert_eq!(first["referer"], "\"\tx");
    assert!(
        !got[0].contains('\t'),
        "control bytes are escaped: {}",
        got[0]
    );
    assert_eq!(records[1]["cache"], "HIT");
    assert_eq!(
        records[1]["backend"],
        serde_json::Value::Null,
        "a hit is sent nowhere"
    );
}

#[tokio::test]
async fn a_format_string_is_compiled_at_start_and_replaced_by_a_reload() {
    let origin = origin().await;
    let d = start(
        &origin,
        "path = \"{dir}/access.log\"\nformat = \"%{host}x %m %U%q %s %{Varnish:hitmiss}x %{backend}x %{route}x %{Content-Length}o %{X-Trace}i %%\"\n",
    );
    let file = d.dir.path().join("access.log");
    request(
        d.addr,
        Method::GET,
        "/f?x=1",
        &[("host", "f.test"), ("x-trace", "t\"1")],
        Bytes::new(),
    )
    .await
    .unwrap();
    request(
        d.addr,
        Method::GET,
        "/f?x=1",
        &[("host", "f.test")],
        Bytes::new(),
    )
    .await
    .unwrap();
    let got = lines(&file, 2).await;
    assert_eq!(
        got[0],
        "f.test GET /f?x=1 200 miss default default 5 t\\x221 %"
    );
    assert_eq!(got[1], "f.test GET /f?x=1 200 hit - default 5 - %");

    // A reload with an unknown field changes nothing and names the setting and the field.
    let config = d.config_file();
    let text = std::fs::read_to_string(&config).unwrap();
    let (head, _) = text.split_once("format = ").unwrap();
    std::fs::write(&config, format!("{head}format = \"%h %{{nope}}x\"\n")).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 400);
    let error: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("access_log.format: unknown field %{nope}x"),
        "{message}"
    );

    std::fs::write(&config, format!("{head}format = \"combined\"\n")).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let reloaded: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        reloaded["applied"],
        serde_json::json!(["access_log.format"]),
        "{reloaded}"
    );
    get(d.addr, "/after-reload").await;
    let got = lines(&file, 3).await;
    assert!(
        got[2].starts_with("127.0.0.1 - - [")
            && got[2].contains("] \"GET /after-reload HTTP/1.1\" 200 5 \"-\" \"-\""),
        "{}",
        got[2]
    );
}

#[test]
fn an_unknown_field_stops_the_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lacquer.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\naddress = \"127.0.0.1:1\"\n[storage]\ndir = \"{}\"\n[access_log]\nformat = \"%h %Z\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let (code, _, err) = lacquer_tests::run_tool(
        lacquer_tests::daemon::binary("lacquerd").to_str().unwrap(),
        &["--check", "--config", config.to_str().unwrap()],
    );
    assert_ne!(code, 0);
    assert!(err.contains("access_log.format: unknown field %Z"), "{err}");
}

#[tokio::test]
async fn sampling_writes_a_share_and_zero_writes_none() {
    let origin = origin().await;
    let none = start(&origin, "path = \"{dir}/access.log\"\nsample = 0.0\n");
    for _ in 0..20 {
        get(none.addr, "/a").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(none.dir.path().join("access.log")).unwrap();
    assert_eq!(text, "", "the file is created, nothing is written");

    let half = start(&origin, "path = \"{dir}/access.log\"\nsample = 0.5\n");
    for _ in 0..200 {
        get(half.addr, "/a").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = std::fs::read_to_string(half.dir.path().join("access.log"))
        .unwrap()
        .lines()
        .count();
    assert!((50..150).contains(&n), "{n} of 200 lines at sample = 0.5");
}

#[tokio::test]
async fn the_stream_follows_requests_filtered_without_a_log_file() {
    let origin = origin().await;
    let d = start(&origin, "");
    let client = AdminClient::new(Target {
        addr: d.admin,
        secret_file: d.secret_file(),
    });
    let filter = |url: Option<&str>, status: Option<&str>| LogFilter {
        url: url.map(str::to_owned),
        status: status.map(str::to_owned),
        ..Default::default()
    };
    let mut errors = client.log_stream(&filter(None, Some("4xx"))).await.unwrap();
    let mut by_url = client.log_stream(&filter(Some("/b"), None)).await.unwrap();
    get(d.addr, "/a").await;
    get(d.addr, "/b?1").await;
    get(d.addr, "/missing").await;
    let next = |event| match event {
        LogEvent::Entry(entry) => serde_json::to_value(*entry).unwrap(),
        LogEvent::Lagged(n) => panic!("{n} records missed"),
    };
    let entry = next(errors.next().await.unwrap());
    assert_eq!(
        (entry["url"].as_str(), entry["status"].as_u64()),
        (Some("/missing"), Some(404))
    );
    assert_eq!(entry["client"], "127.0.0.1");
    assert_eq!(entry["cache"], "MISS");
    assert_eq!(entry["detail"], "not-fresh");
    assert!(entry["duration"].as_f64().unwrap() >= entry["ttfb"].as_f64().unwrap());
    let entry = next(by_url.next().await.unwrap());
    assert_eq!(entry["url"], "/b?1");

    let bad = d
        .admin_get("/v1/log/stream?status=9xx", Some(&d.secret()))
        .await;
    assert_eq!(bad.status, 400);
}

/// Every step of the requests a `trace=true` stream follows, in order, and none in anyone else's records.
#[tokio::test(flavor = "multi_thread")]
async fn a_trace_shows_every_step_and_only_to_those_who_asked() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/private" => Reply::ok("mine").header("cache-control", "private"),
        _ => Reply::ok("hello").header("cache-control", "max-age=60"),
    })
    .await;
    let d = start(&origin, "");
    let client = AdminClient::new(Target {
        addr: d.admin,
        secret_file: d.secret_file(),
    });
    let mut plain = client.log_stream(&LogFilter::default()).await.unwrap();
    let mut traced = client
        .log_stream(&LogFilter {
            trace: Some(true),
            client: Some("127.0.0.1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut other_host = client
        .log_stream(&LogFilter {
            host: Some("EXAMPLE.org".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    get(d.addr, "/a").await;
    // The second is a hit from the store only once the first's fill has published what it stored: the
    // client can have every byte before that, and would then join the fill instead.
    d.wait_for_stats("the object stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    get(d.addr, "/a").await;
    get(d.addr, "/private").await;
    request(
        d.addr,
        Method::GET,
        "/a",
        &[("host", "www.example.org")],
        Bytes::new(),
    )
    .await
    .unwrap();
    let next = |event| match event {
        LogEvent::Entry(entry) => *entry,
        LogEvent::Lagged(n) => panic!("{n} records missed"),
    };
    let steps = |entry: &lacquer_admin::wire::LogEntry| {
        entry
            .steps
            .iter()
            .map(|s| format!("{} {}", s.tag, s.detail))
            .collect::<Vec<_>>()
    };
    let has = |steps: &[String], prefix: &str| steps.iter().any(|s| s.starts_with(prefix));

    let miss = next(traced.next().await.unwrap());
    let miss_steps = steps(&miss);
    for expected in [
        "Route default",
        "Class lookup",
        "Key ",
        "Lookup nothing stored",
        "Fetch started",
        "Backend default",
        "Origin 200 OK",
        "Store storing: ttl 60 s",
    ] {
        assert!(
            has(&miss_steps, expected),
            "{expected} not in {miss_steps:#?}"
        );
    }
    let order: Vec<&str> = miss.steps.iter().map(|s| s.tag.as_str()).collect();
    let position = |tag| order.iter().position(|t| *t == tag).unwrap();
    assert!(
        position("Route") < position("Lookup")
            && position("Lookup") < position("Origin")
            && position("Origin") < position("Store"),
        "{order:?}"
    );
    assert!(
        miss.steps.windows(2).all(|w| w[0].at_us <= w[1].at_us),
        "{miss_steps:#?}"
    );

    let hit = next(traced.next().await.unwrap());
    let hit_steps = steps(&hit);
    assert!(
        has(&hit_steps, "Lookup variant 1 of 1, fresh"),
        "{hit_steps:#?}"
    );
    assert!(
        has(&hit_steps, "Body stored, Memory tier"),
        "{hit_steps:#?}"
    );
    assert!(
        !has(&hit_steps, "Fetch"),
        "a hit fetches nothing: {hit_steps:#?}"
    );

    let private = next(traced.next().await.unwrap());
    let private_steps = steps(&private);
    assert!(
        has(&private_steps, "Store not stored: private"),
        "{private_steps:#?}"
    );

    for _ in 0..4 {
        let entry = next(plain.next().await.unwrap());
        assert!(
            entry.steps.is_empty(),
            "an untraced follower got steps: {entry:?}"
        );
    }
    let entry = next(other_host.next().await.unwrap());
    assert_eq!(entry.host.as_deref(), Some("www.example.org"));

    let bad = d
        .admin_get("/v1/log/stream?trace=maybe", Some(&d.secret()))
        .await;
    assert_eq!(bad.status, 400);
}
