//! `cachectl`: operate a running `lacquerd` through its admin API.

mod cluster;
mod explain;
mod invalidation;
mod log;
mod objects;
mod operations;
mod query;
mod stats;
mod table;
mod top;
mod warm;

use std::{io::Write, process::ExitCode};

use clap::{CommandFactory, Parser, Subcommand};
use lacquer_admin::{wire::LogFilter, AdminClient, AdminError, ConnectArgs};
use serde::Serialize;

const EXIT_STATUS: &str = "\
Exit status: 0 done; 1 lacquerd refused the operation (or, for `cluster`, is a single node);
2 bad usage or configuration; 3 lacquerd cannot be reached, or the secret does not match.";

#[derive(Debug, Parser)]
#[command(
    name = "cachectl",
    version,
    about = "Operate a running lacquerd: statistics, bans, purges, inspection, reload",
    after_help = EXIT_STATUS
)]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print JSON (one document per line) instead of text, for scripts.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Is lacquerd up? (needs no secret)
    Health,
    /// Counters, rates and ratios, like `varnishstat -1`.
    Stats {
        /// Refresh every SECONDS, showing rates over the last interval, until interrupted.
        #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
        watch: Option<f64>,
        /// Only values whose name contains TEXT, e.g. `ban` or `proxy.hit`.
        #[arg(long, short, value_name = "TEXT")]
        filter: Option<String>,
        /// Every member of the daemon's cluster: the values summed, and the main ones per member.
        #[arg(long)]
        cluster: bool,
    },
    /// The members of the daemon's cluster: state, lag behind the invalidation log, and their statistics
    /// summed.
    Cluster,
    /// Ban every stored object matching EXPRESSION, e.g. `req.url ~ "^/products/"`.
    Ban {
        /// The ban expression; several words are joined with spaces.
        #[arg(required = true, num_args = 1.., value_name = "EXPRESSION")]
        expression: Vec<String>,
    },
    /// List the bans: pending ones and the newest completed ones.
    Bans,
    /// Purge a URL (every variant), or with --tag every object carrying a surrogate key.
    #[command(group(clap::ArgGroup::new("target").required(true).args(["url", "tags"])))]
    Purge {
        /// `http://host/path`, or `/path` with --host.
        #[arg(value_name = "URL")]
        url: Option<String>,
        /// The host, when URL is a path.
        #[arg(long, conflicts_with = "tags")]
        host: Option<String>,
        /// A surrogate key (`Surrogate-Key`, `xkey`, `Cache-Tag`); repeatable.
        #[arg(long = "tag", value_name = "KEY", conflicts_with = "url")]
        tags: Vec<String>,
        /// Expire instead of removing: served stale within grace while fetched again.
        #[arg(long)]
        soft: bool,
    },
    /// What the store holds for a URL: variants, where, freshness, size, tags, headers.
    Inspect {
        /// `http://host/path`, or `/path` with --host.
        url: String,
        /// The host, when URL is a path.
        #[arg(long)]
        host: Option<String>,
    },
    /// What lacquerd would do with a request, and why: the rules tried at each phase, the route, backend
    /// and cache key, what the origin would be sent, a rule's own answer, the stored object it would be
    /// answered from. Nothing is sent to the origin.
    Explain {
        /// `http://host/path?query`, or `/path?query` with `-H 'Host: …'`.
        url: String,
        /// A request header, `Name: value`; repeatable, sent in the order given.
        #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = explain::header_field)]
        headers: Vec<lacquer_admin::wire::HeaderField>,
        /// The request method. Default: GET.
        #[arg(short = 'X', long = "method", value_name = "METHOD")]
        method: Option<String>,
        /// The client's address, as `client` conditions see it. Default: 192.0.2.1.
        #[arg(long = "client", value_name = "IP")]
        from: Option<std::net::IpAddr>,
        /// As if the request came over TLS (`${scheme}` is https).
        #[arg(long)]
        secure: bool,
        /// The request's body, as curl's `-d` (a POST a `cache_body` rule keys by it).
        #[arg(short = 'd', long = "data", value_name = "BODY")]
        body: Option<String>,
    },
    /// The backends and how their requests have been going.
    Backends,
    /// The certificates the listeners obtain by ACME: what is served, until when, how renewal goes.
    Certificates {
        /// Order every one now, whatever its age, and show the outcome (as `certbot renew
        /// --force-renewal`); a failed order keeps the certificate served.
        #[arg(long)]
        renew: bool,
    },
    /// Force a backend sick (drain it) or healthy whatever its probe says, or hand it back to the probe
    /// (`auto`), like `varnishadm backend.set_health`. Kept until set again or lacquerd restarts.
    Backend {
        /// The backend's `name`, as `cachectl backends` lists it.
        name: String,
        /// `sick`, `healthy` or `auto`.
        #[arg(value_parser = operations::admin_state)]
        health: lacquer_admin::wire::BackendAdmin,
    },
    /// Follow requests as they complete, as access log lines (like `varnishncsa`), until interrupted.
    Log {
        #[command(flatten)]
        filter: Filter,
    },
    /// Follow requests as they complete with every step the daemon took for each (route, cache key,
    /// lookup, fetch, backend, origin status, storing or why not, response), like `varnishlog`, until
    /// interrupted.
    Trace {
        #[command(flatten)]
        filter: Filter,
        /// Only requests the query selects, e.g. `status >= 500 and resp.http.x-foo ~ bar` (fields: url,
        /// host, method, client, status, cache, detail, backend, route, ttfb and duration in ms, bytes,
        /// req.http.NAME, resp.http.NAME; `==`, `!=`, `~`, `!~`, `<`, `<=`, `>`, `>=`; `and`, `or`, `not`
        /// and parentheses), like `varnishlog -q`.
        #[arg(short = 'q', long = "query", value_name = "EXPR", value_parser = query::Query::parse)]
        query: Option<query::Query>,
        /// Show every request and response header (`ReqHeader`, `RespHeader`), as varnishlog does.
        #[arg(long)]
        headers: bool,
    },
    /// The most frequent URLs, hosts, misses, origin fetches, statuses or backends over a sliding window,
    /// live, like `varnishtop`.
    Top {
        /// What to count requests by: url, host, miss, fetch, status, backend, or `header:NAME` (a request
        /// header's value, as `varnishtop -i ReqHeader -I '^NAME'`).
        #[arg(long, value_parser = top::Key::parse, default_value = "url")]
        by: top::Key,
        /// The window, in seconds.
        #[arg(long, value_name = "SECONDS", value_parser = positive_seconds, default_value = "60")]
        window: f64,
        /// How many rows.
        #[arg(long, value_name = "N", default_value = "20")]
        limit: usize,
        /// Count for SECONDS, print the table once and exit (instead of refreshing every second).
        #[arg(long = "for", value_name = "SECONDS", value_parser = positive_seconds)]
        duration: Option<f64>,
    },
    /// Read the configuration file again, as `systemctl reload lacquer` does.
    Reload,
    /// Print a completion script, e.g. `cachectl completions bash > /etc/bash_completion.d/cachectl`.
    Completions { shell: clap_complete::Shell },
    /// Fetch URLs through the cache so that they are stored before clients ask: from a list (one URL a
    /// line), or the GETs of an access log. At a bounded rate and concurrency; then how many were cached
    /// already, stored, or not stored and why (from `Cache-Status`). In a cluster, any node's listener
    /// will do: each URL is fetched on the node that owns it. Needs no secret.
    Warm {
        /// A file of URLs (`http://host/path`, or paths with --host), `-` for standard input.
        #[arg(value_name = "FILE", required_unless_present_any = ["from_log", "sitemap"])]
        file: Option<std::path::PathBuf>,
        /// An access log: lacquerd's `default` format names full URLs; with paths, give --host.
        #[arg(long, value_name = "FILE", conflicts_with = "file")]
        from_log: Option<std::path::PathBuf>,
        /// A sitemap (`http://host/sitemap.xml`, or a sitemap index, gzip'd or not), fetched through the
        /// cache: every page it lists.
        #[arg(long, value_name = "URL", conflicts_with_all = ["file", "from_log"])]
        sitemap: Option<String>,
        /// The host of URLs given as paths.
        #[arg(long)]
        host: Option<String>,
        /// The cache's client listener the requests are sent to.
        #[arg(long, default_value = "127.0.0.1:6081")]
        via: std::net::SocketAddr,
        /// Requests per second, at most.
        #[arg(long, default_value = "10")]
        rate: f64,
        /// Requests at once, at most.
        #[arg(long, default_value = "2")]
        concurrency: usize,
    },
    /// Sign a URL for a rule's `signed`: prints it with its expiry and signature appended. Needs no daemon.
    Sign {
        /// `http://host/path?query`, or `/path?query`.
        url: String,
        /// How long the link lives, e.g. `1h`, `7d`.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: std::time::Duration,
        /// The file holding the secret the rule's `signed.secret_file` names.
        #[arg(long, value_name = "FILE")]
        secret_file: std::path::PathBuf,
        /// The signature's query parameter (the rule's `signed.param`).
        #[arg(long, default_value = "sig")]
        param: String,
        /// The expiry's query parameter (the rule's `signed.expires`).
        #[arg(long, default_value = "exp")]
        expires_param: String,
        /// `hmac-sha256`, or `nginx-md5` for a link NGINX's `secure_link_md5` (and a rule's
        /// `algorithm = "nginx-md5"`) checks.
        #[arg(long, default_value = "hmac-sha256", value_parser = ["hmac-sha256", "nginx-md5"])]
        algorithm: String,
        /// With `nginx-md5`: what the MD5 is of (the rule's `signed.expression`).
        #[arg(long, default_value = lacquer_rules::NGINX_EXPRESSION)]
        expression: String,
        /// With `nginx-md5`: the client address the link is for, when the expression has `$remote_addr`.
        #[arg(long, default_value = "127.0.0.1")]
        client: std::net::IpAddr,
    },
    /// Translate a VCL file (the subset templates use) into lacquerd's configuration: backends, the purge
    /// ACL and rules, each under the VCL lines it came from, then every construct not translated, with its
    /// line and why. Needs no daemon. Review the result, then `lacquerd --check` it.
    Vcl2rules {
        /// The VCL file; `-` for standard input.
        #[arg(value_name = "FILE.vcl")]
        file: std::path::PathBuf,
    },
    /// Write the manual pages (roff), `cachectl.1` and one per command (`cachectl-ban.1`, …), into DIR:
    /// how the package builds them.
    #[command(hide = true)]
    Man {
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

/// Where results go: text for people, or JSON.
#[derive(Debug, Clone, Copy)]
struct Output {
    json: bool,
}

/// Which requests `log` and `trace` show: all given conditions must hold.
#[derive(Debug, clap::Args)]
struct Filter {
    /// Only URLs (path and query) containing TEXT.
    #[arg(long, value_name = "TEXT")]
    url: Option<String>,
    /// Only hosts containing TEXT.
    #[arg(long, value_name = "TEXT")]
    host: Option<String>,
    /// Only this status, or a class such as `5xx`.
    #[arg(long, value_name = "STATUS")]
    status: Option<String>,
    /// Only requests from this client address.
    #[arg(long, value_name = "ADDRESS")]
    client: Option<std::net::IpAddr>,
}

impl Filter {
    fn wire(self, trace: bool) -> LogFilter {
        LogFilter {
            url: self.url,
            host: self.host,
            status: self.status,
            client: self.client.map(|c| c.to_string()),
            trace: trace.then_some(true),
        }
    }
}

impl Output {
    /// JSON when asked for, else the text `human` writes.
    fn show<T: Serialize>(self, value: &T, human: impl FnOnce(&T) -> String) {
        if self.json {
            let mut line = serde_json::to_string(value).expect("wire types serialize");
            line.push('\n');
            write_out(&line);
        } else {
            write_out(&human(value));
        }
    }
}

/// `cachectl.1`, and `cachectl-<command>.1` for each command but the hidden ones, in `dir`.
fn manual_pages(dir: &std::path::Path) -> std::io::Result<()> {
    let top = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(top.clone()).render(&mut page)?;
    std::fs::write(dir.join("cachectl.1"), &page)?;
    for sub in top.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("cachectl-{}", sub.get_name());
        let mut page = Vec::new();
        let sub = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("cachectl {}", sub.get_name()));
        clap_mangen::Man::new(sub).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), &page)?;
    }
    Ok(())
}

/// `cachectl sign`: the URL with its expiry and signature appended (the secret read as the rule reads it:
/// a trailing newline is not part of it).
/// How `cachectl sign` signs: HMAC-SHA256, or NGINX's MD5 of `expression` for `client`.
enum Algorithm<'a> {
    HmacSha256,
    NginxMd5 {
        expression: &'a str,
        client: std::net::IpAddr,
    },
}

fn sign(
    url: &str,
    lives: std::time::Duration,
    secret_file: &std::path::Path,
    (param, expires_param): (&str, &str),
    algorithm: Algorithm<'_>,
    json: bool,
) -> ExitCode {
    let secret = match std::fs::read(secret_file) {
        Ok(secret) => secret,
        Err(e) => return fail(json, "io", &format!("{}: {e}", secret_file.display()), 1),
    };
    let secret = secret.strip_suffix(b"\n").unwrap_or(&secret);
    let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
    let (origin, target) = match url.find("://").map(|i| i + 3) {
        Some(after) => {
            let path_at = url[after..].find('/').map_or(url.len(), |p| after + p);
            (&url[..path_at], &url[path_at..])
        }
        None => ("", url),
    };
    if !target.starts_with('/') {
        return fail(
            json,
            "usage",
            &format!("{url}: give http://host/path or /path"),
            2,
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let expires_at = now + lives.as_secs();
    let signed = match algorithm {
        Algorithm::HmacSha256 => {
            lacquer_rules::sign(secret, target, expires_at, param, expires_param)
        }
        Algorithm::NginxMd5 { expression, client } => match lacquer_rules::sign_nginx_md5(
            secret,
            expression,
            target,
            client,
            expires_at,
            (param, expires_param),
        ) {
            Ok(signed) => signed,
            Err(why) => return fail(json, "usage", &format!("--expression: {why}"), 2),
        },
    };
    write_out(&format!("{origin}{signed}\n"));
    ExitCode::SUCCESS
}

/// `cachectl vcl2rules`: the configuration on standard output, a summary on standard error; exit 0 when it
/// translated (whatever it could not: that is listed), 1 when the file cannot be read or is not VCL.
fn vcl2rules(file: &std::path::Path, json: bool) -> ExitCode {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map(|_| text)
    } else {
        std::fs::read_to_string(file)
    };
    let text = match text {
        Ok(text) => text,
        Err(e) => return fail(json, "io", &format!("{}: {e}", file.display()), 1),
    };
    let translation = match lacquer_vcl::translate(&text) {
        Ok(t) => t,
        Err(e) => return fail(json, "not_vcl", &format!("{}: {e}", file.display()), 1),
    };
    let name = file.display().to_string();
    write_out(&lacquer_vcl::render(&translation, &name, &text));
    eprintln!(
        "cachectl: {} rule(s) from {name}; {} construct(s) not translated (listed at the end): review before use",
        translation.rules.len(),
        translation.untranslated.len()
    );
    ExitCode::SUCCESS
}

/// Writes `text` to stdout. When nobody reads it any more (`cachectl log | head -1`) cachectl is done:
/// it exits 0 quietly, as `head` and `true` expect of the command before them.
fn write_out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cachectl: writing the output: {e}");
        std::process::exit(1);
    }
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.1 => Ok(s),
        _ => Err("give a number of seconds, at least 0.1".into()),
    }
}

/// A failure as the operator sees it: one line on stderr, or with `--json` one JSON document on stderr
/// (stdout carries only results), and the exit status.
fn fail(json: bool, code: &str, message: &str, status: u8) -> ExitCode {
    if json {
        let error = serde_json::json!({
            "error": {"code": code, "message": message, "exit_status": status}
        });
        eprintln!("{error}");
    } else {
        eprintln!("cachectl: {message}");
    }
    ExitCode::from(status)
}

/// What `AdminError` stands for, as `--json` errors name it.
fn error_code(e: &AdminError) -> &str {
    match e {
        AdminError::Refused { error, .. } => &error.code,
        AdminError::Unreachable { .. } => "unreachable",
        AdminError::Unauthorized { .. } => "unauthorized",
        AdminError::Secret { .. } => "secret",
        AdminError::NotAdminApi { .. } => "not_admin_api",
        AdminError::NotClustered { .. } => "not_clustered",
    }
}

/// A URL given as a path with no `--host` names no object: a usage error, found before asking the daemon.
fn missing_host(command: &Command) -> Option<String> {
    let (url, host) = match command {
        Command::Purge {
            url: Some(url),
            host,
            ..
        }
        | Command::Inspect { url, host } => (url, host),
        Command::Explain { url, headers, .. } => {
            let has_host = headers.iter().any(|h| h.name.eq_ignore_ascii_case("host"));
            return (url.starts_with('/') && !has_host)
                .then(|| format!("{url} has no host: give http://host/path or -H 'Host: HOST'"));
        }
        _ => return None,
    };
    (url.starts_with('/') && host.is_none())
        .then(|| format!("{url} has no host: give http://host/path or --host HOST"))
}

fn main() -> ExitCode {
    // `--json` is known before clap has parsed, so that its own usage errors can be JSON too.
    let json = std::env::args_os().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !json || !e.use_stderr() => e.exit(),
        Err(e) => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            return fail(true, "usage", first.trim_start_matches("error: "), 2);
        }
    };
    if let Some(message) = missing_host(&cli.command) {
        return fail(cli.json, "usage", &message, 2);
    }
    if let Command::Man { dir } = &cli.command {
        return match manual_pages(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(cli.json, "io", &format!("{}: {e}", dir.display()), 1),
        };
    }
    if let Command::Vcl2rules { file } = &cli.command {
        return vcl2rules(file, cli.json);
    }
    if let Command::Warm {
        file,
        from_log,
        sitemap,
        host,
        via,
        rate,
        concurrency,
    } = &cli.command
    {
        if !rate.is_finite() || *rate <= 0.0 || *concurrency == 0 {
            return fail(
                cli.json,
                "usage",
                "--rate and --concurrency must be above 0",
                2,
            );
        }
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let urls = if let Some(sitemap) = sitemap {
            let url = match warm::Url::parse(sitemap, host.as_deref()) {
                Ok(url) => url,
                Err(e) => return fail(cli.json, "usage", &e, 2),
            };
            match runtime.block_on(warm::from_sitemap(&url, *via)) {
                Ok(urls) => urls,
                Err(e) => return fail(cli.json, "sitemap", &e, 1),
            }
        } else {
            let (path, log) = match (file, from_log) {
                (_, Some(log)) => (log, true),
                (Some(file), None) => (file, false),
                (None, None) => unreachable!("clap requires one"),
            };
            let text = if path.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map(|_| text)
            } else {
                std::fs::read_to_string(path)
            };
            let text = match text {
                Ok(text) => text,
                Err(e) => return fail(cli.json, "io", &format!("{}: {e}", path.display()), 1),
            };
            let urls = if log {
                warm::from_log(&text, host.as_deref())
            } else {
                warm::from_list(&text, host.as_deref())
            };
            match urls {
                Ok(urls) => urls,
                Err(e) => return fail(cli.json, "usage", &e, 2),
            }
        };
        let summary = runtime.block_on(warm::warm(urls, *via, *rate, *concurrency));
        if cli.json {
            write_out(&format!(
                "{}\n",
                serde_json::to_string(&summary).expect("a summary is JSON")
            ));
        } else {
            write_out(&warm::render(&summary));
        }
        return if summary.failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    if let Command::Sign {
        url,
        expires,
        secret_file,
        param,
        expires_param,
        algorithm,
        expression,
        client,
    } = &cli.command
    {
        let algorithm = match algorithm.as_str() {
            "nginx-md5" => Algorithm::NginxMd5 {
                expression,
                client: *client,
            },
            _ => Algorithm::HmacSha256,
        };
        return sign(
            url,
            *expires,
            secret_file,
            (param, expires_param),
            algorithm,
            cli.json,
        );
    }
    if let Command::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "cachectl", &mut script);
        write_out(&String::from_utf8_lossy(&script));
        return ExitCode::SUCCESS;
    }
    let target = match cli.connect.target() {
        Ok(target) => target,
        Err(e) => return fail(cli.json, "config", &e.to_string(), 2),
    };
    let client = AdminClient::new(target);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    match runtime.block_on(run(&client, cli.command, Output { json: cli.json })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(cli.json, error_code(&e), &e.to_string(), e.exit_code()),
    }
}

async fn run(client: &AdminClient, command: Command, out: Output) -> Result<(), AdminError> {
    match command {
        Command::Health => operations::health(client, out).await,
        Command::Stats {
            watch,
            filter,
            cluster,
        } => stats::run(client, out, watch, filter, cluster).await,
        Command::Cluster => cluster::show(client, out).await,
        Command::Ban { expression } => invalidation::ban(client, out, &expression.join(" ")).await,
        Command::Bans => invalidation::bans(client, out).await,
        Command::Purge {
            url,
            host,
            tags,
            soft,
        } => invalidation::purge(client, out, url, host, tags, soft).await,
        Command::Inspect { url, host } => objects::inspect(client, out, url, host).await,
        Command::Explain {
            url,
            headers,
            method,
            from,
            secure,
            body,
        } => {
            let request = lacquer_admin::wire::ExplainRequest {
                url,
                method,
                headers,
                client: from,
                secure,
                body,
            };
            explain::explain(client, out, request).await
        }
        Command::Backends => operations::backends(client, out).await,
        Command::Certificates { renew } => operations::certificates(client, out, renew).await,
        Command::Backend { name, health } => {
            operations::set_backend_health(client, out, &name, health).await
        }
        Command::Log { filter } => log::follow(client, out, filter.wire(false), None).await,
        Command::Trace {
            filter,
            query,
            headers,
        } => {
            let view = log::Traced { query, headers };
            log::follow(client, out, filter.wire(true), Some(view)).await
        }
        Command::Top {
            by,
            window,
            limit,
            duration,
        } => {
            let duration = duration.map(std::time::Duration::from_secs_f64);
            top::run(
                client,
                out,
                by,
                std::time::Duration::from_secs_f64(window),
                limit,
                duration,
            )
            .await
        }
        Command::Reload => operations::reload(client, out).await,
        Command::Completions { .. }
        | Command::Man { .. }
        | Command::Vcl2rules { .. }
        | Command::Warm { .. }
        | Command::Sign { .. } => {
            unreachable!("handled before connecting")
        }
    }
}
