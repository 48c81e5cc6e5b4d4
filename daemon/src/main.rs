//! `lacquerd`: the Lacquer caching reverse proxy.

mod reload;
mod secret;
mod settings;

use std::{
    io::IsTerminal,
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, OnceLock},
};

use anyhow::Context;
use bytesize::ByteSize;
use clap::{CommandFactory, Parser};
use tokio::sync::watch;
use tracing_subscriber::{
    layer::SubscriberExt, reload as log_reload, util::SubscriberInitExt, EnvFilter,
};

use lacquer_admin_server::Reload;
use lacquer_backends::probe::Probes;
use lacquer_config::{Config, Overrides};
use lacquer_edge::WorkerSettings;
use lacquer_proxy::{
    access_log::AccessLog,
    stats::Stats,
    worker::{Shared, Worker},
};

use crate::{
    reload::{Reloader, SetLogLevel},
    settings::Settings,
};

/// glibc's malloc degrades as a cache churns: in `bench/invalidation.py` (three rounds of filling 100 000
/// objects and banning half), hits took p50 0.22 ms / p99 1.75 ms and the lurker 2.3 s with glibc, against
/// 0.17 / 0.63 ms and 1.4 s with jemalloc (Varnish's allocator too), all else equal.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Persistent, disk-tiered HTTP caching reverse proxy.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// TOML configuration file; the flags below override it.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Client listen address (repeatable). Default: 0.0.0.0:6081.
    #[arg(long)]
    listen: Vec<SocketAddr>,
    /// Origin as HOST:PORT, http://HOST[:PORT] or https://HOST[:PORT] (the first backend's address).
    #[arg(long, short = 'b')]
    backend: Option<String>,
    /// Admin API address. Default: 127.0.0.1:6082.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Admin secret file. Default: <disk dir>/secret, generated on first start.
    #[arg(long)]
    secret: Option<PathBuf>,
    /// Memory tier size, e.g. 256MiB.
    #[arg(long)]
    memory: Option<ByteSize>,
    /// Store directory. Default: /var/lib/lacquer (or ~/.local/state/lacquer when that is not writable).
    #[arg(long)]
    disk: Option<PathBuf>,
    /// Disk tier size, e.g. 1GiB.
    #[arg(long)]
    disk_size: Option<ByteSize>,
    /// Validate the configuration, print the problem if any, and exit.
    #[arg(long)]
    check: bool,
    /// Print the manual page (roff), made from these flags, and exit: how the package builds it.
    #[arg(long, hide = true)]
    man: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.man {
        return manual_page(Cli::command());
    }
    let overrides = Overrides {
        listen: cli.listen,
        backend: cli.backend,
        admin: cli.admin,
        secret: cli.secret,
        memory: cli.memory,
        disk: cli.disk,
        disk_size: cli.disk_size,
    };
    let loaded = Config::load(cli.config.as_deref(), overrides.clone())
        .and_then(|config| settings::compile(&config).map(|settings| (config, settings)));
    let (config, mut settings) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("lacquerd: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!("configuration ok");
        return ExitCode::SUCCESS;
    }
    let log_filter = std::mem::take(&mut settings.log_filter);
    let filter = EnvFilter::try_from_default_env().unwrap_or(log_filter);
    let (filter, log_handle) = log_reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .init();
    let set_log_level: SetLogLevel = Box::new(move |level| {
        let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        log_handle.reload(filter).map_err(|e| e.to_string())
    });
    match run(config, settings, cli.config, overrides, set_log_level) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("lacquerd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    config: Config,
    settings: Settings,
    config_file: Option<PathBuf>,
    overrides: Overrides,
    set_log_level: SetLogLevel,
) -> anyhow::Result<()> {
    // The store (foyer's disk tasks, the write pipeline, the sweeper) and the admin API run here, apart from
    // the per-core client runtimes.
    let control = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lacquer-store")
        .enable_all()
        .build()
        .context("cannot start the store runtime")?;
    let Settings {
        listeners,
        backends,
        live,
        store,
        log_filter: _,
        access_format,
        cluster,
        acme,
    } = settings;
    let store = control
        .block_on(store.open(control.handle().clone()))
        .with_context(|| {
            format!(
                "cannot open the store in {}",
                config.storage_dir().display()
            )
        })?;
    store.report_panics();
    let secret_file = config.secret_file();
    let secret = secret::load(
        &secret_file,
        secret_file == config.storage_dir().join("secret"),
    )?;
    let stats = Arc::new(Stats::default());
    let (access_log, access_log_writer) =
        AccessLog::start(&config.access_log, access_format, stats.clone())?;
    let telemetry = {
        // The exports are tasks of this runtime, beside the admin API: never on a worker's.
        let _control = control.enter();
        let counting = stats.clone();
        let dropped = Box::new(move |n| {
            counting
                .trace_spans_dropped
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        });
        lacquer_telemetry::Telemetry::start(&config.telemetry, dropped)?
    };

    if let Some(acme) = &acme {
        // Before the listeners accept: a restart serves the certificates it kept at once.
        acme.load();
    }
    let workers = config.workers();
    let listeners: Vec<_> = listeners.into_iter().map(Arc::new).collect();
    let (sockets, bound) = lacquer_edge::bind(&listeners, workers)?;
    let admin_listener = control
        .block_on(tokio::net::TcpListener::bind(config.admin.listen))
        .with_context(|| format!("cannot listen on admin address {}", config.admin.listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let cluster = match cluster {
        Some(mut settings) => {
            // Port 0 in the configuration: the port bound just now is the one to advertise.
            if settings.advertise.port() == 0 {
                settings
                    .advertise
                    .set_port(bound.first().map_or(0, |a| a.port()));
            }
            if settings.advertise_admin.port() == 0 {
                settings.advertise_admin.set_port(admin_addr.port());
            }
            let cluster = control
                .block_on(lacquer_cluster::Cluster::start(
                    settings,
                    store.clone(),
                    control.handle(),
                ))
                .context("cannot join the cluster")?;
            Some(cluster)
        }
        None => None,
    };
    store.weigh_edited_heads(live.rules.edited_fields());
    let mut shared = Shared::new(live, store.clone(), stats.clone(), access_log.clone())
        .with_hit_for_miss_memory(config.server.hit_for_miss_memory.as_u64() as usize)
        .with_telemetry(telemetry);
    if let Some(cluster) = &cluster {
        shared = shared.with_cluster(Arc::new(cluster.clone()));
    }
    if let Some(acme) = &acme {
        shared = shared.with_acme(acme.clone());
    }
    let shared = Arc::new(shared);
    let (stop, stopped) = watch::channel(false);
    let settings = Arc::new(WorkerSettings {
        shutdown_timeout: config.server.shutdown_timeout,
    });
    let forgetting = shared.clone();
    control.spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            every.tick().await;
            forgetting.live.load().router.forget_idle_clients();
        }
    });
    let probes = Probes {
        runtime: control.handle().clone(),
        stop: stopped.clone(),
    };
    probes.start(&backends);
    if let Some(acme) = &acme {
        acme.start(control.handle(), stopped.clone());
    }
    let serving = shared.clone();
    let threads = lacquer_edge::spawn_workers(
        Arc::new(move || Worker::new(serving.clone())),
        settings,
        listeners.clone(),
        sockets,
        stopped.clone(),
    )?;
    let reloader = Arc::new(Reloader::new(
        config_file,
        overrides,
        config.clone(),
        shared.clone(),
        listeners.clone(),
        probes,
        set_log_level,
    ));
    let app = lacquer_admin_server::router(lacquer_admin_server::AdminState {
        shared: shared.clone(),
        secret: secret.value.into(),
        reloader: reloader.clone(),
        open_metrics: config.admin.open_metrics,
        stopping: stopped.clone(),
        openapi: Arc::new(OnceLock::new()),
    });
    let admin_settings = config.admin.clone();
    let admin_stop = stopped.clone();
    let admin_server = control.spawn(async move {
        lacquer_admin_server::serve(admin_listener, app, &admin_settings, admin_stop).await;
    });
    for (addr, listener) in bound.iter().zip(&listeners) {
        let c = &listener.config;
        let tls = (!c.tls.is_empty() || c.acme.is_some()).then_some("tls");
        let acme = c.acme.is_some().then_some("acme");
        let proxy = c.proxy_protocol.then_some("proxy");
        let h2 = c.http2.then_some("h2");
        let h3 = c.quic.then_some("h3");
        let features: Vec<&str> = [tls, acme, proxy, h2, h3].into_iter().flatten().collect();
        tracing::info!(%addr, features = %features.join(","), "listening");
    }
    tracing::info!(addr = %admin_addr, "admin listening");
    if let Some(endpoint) = &config.telemetry.endpoint {
        tracing::info!(%endpoint, sample_ratio = config.telemetry.sample_ratio, "exporting traces");
    }
    tracing::info!(
        backend = %config.first_backend(),
        backends = config.backend.len(),
        store = %config.storage_dir().display(),
        secret = %secret.file.display(),
        workers,
        "lacquerd ready"
    );

    control.block_on(wait_for_stop(&reloader, &access_log))?;
    tracing::info!("shutting down: finishing in-flight responses");
    if let Some(cluster) = &cluster {
        // Out of the ring first, so that peers stop sending this node the keys it owns.
        control.block_on(cluster.leave());
    }
    stop.send_replace(true);
    for thread in threads {
        let _ = thread.join();
    }
    // A ban or purge being answered finishes before the store closes.
    let admin_done = control.block_on(async {
        tokio::time::timeout(config.server.shutdown_timeout, admin_server).await
    });
    if admin_done.is_err() {
        tracing::warn!("admin requests still running at shutdown_timeout; closing anyway");
    }
    access_log.close();
    if let Some(writer) = access_log_writer {
        let _ = writer.join();
    }
    // While the control runtime, which runs the exports, still runs.
    shared.telemetry.shutdown();
    tracing::info!("flushing the store");
    control
        .block_on(store.close(config.server.shutdown_timeout))
        .context("flushing the store failed")?;
    drop(shared);
    control.shutdown_timeout(std::time::Duration::from_secs(5));
    tracing::info!("stopped");
    Ok(())
}

/// Waits for SIGTERM or SIGINT; meanwhile SIGHUP reloads the configuration, as `systemctl reload` expects,
/// and SIGUSR1 reopens the access log, as logrotate expects.
async fn wait_for_stop(reloader: &Arc<Reloader>, access_log: &AccessLog) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    let mut usr1 = signal(SignalKind::user_defined1()).context("cannot watch SIGUSR1")?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = usr1.recv() => access_log.reopen(),
            _ = hup.recv() => {
                let reloader = reloader.clone();
                // The outcome is logged by the reloader; a bad file keeps the running configuration.
                let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
            }
        }
    }
}

/// Writes the manual page of `command` to stdout (`--man`).
fn manual_page(command: clap::Command) -> ExitCode {
    let mut page = Vec::new();
    if let Err(e) = clap_mangen::Man::new(command).render(&mut page) {
        eprintln!("lacquerd: {e}");
        return ExitCode::FAILURE;
    }
    match std::io::Write::write_all(&mut std::io::stdout(), &page) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lacquerd: {e}");
            ExitCode::FAILURE
        }
    }
}
