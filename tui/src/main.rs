//! `cachetop`: live statistics of a running lacquerd.

mod input;
mod state;
mod view;

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use clap::{CommandFactory, Parser};
use crossterm::event::{self, Event, KeyEventKind};
use lacquer_admin::{
    cluster::ClusterReport,
    wire::{BackendList, LogEntry, LogFilter, Stats},
    AdminClient, AdminError, ConnectArgs, LogEvent,
};

use crate::{
    input::Action,
    state::{Cluster, State, View},
    view::Theme,
};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Watch a running lacquerd live, the way varnishstat does"
)]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print one frame of the overview as plain text and exit.
    #[arg(long)]
    once: bool,
    /// No colours (also when NO_COLOR is set).
    #[arg(long)]
    no_color: bool,
    /// Print the manual page (roff), made from these flags, and exit: how the package builds it.
    #[arg(long, hide = true)]
    man: bool,
}

/// What the reader threads tell the screen.
enum Update {
    Stats(Box<Stats>),
    Backends(BackendList),
    Cluster(Box<ClusterReport>),
    /// Requests completed since the last batch (the top view).
    Log(Vec<LogEntry>),
    /// A single node, or a cluster that could not be read.
    NoCluster(Cluster),
    Lost(String),
    /// SIGTERM or SIGHUP: leave, restoring the terminal.
    Quit,
    /// A key, or a resize.
    Terminal(Event),
}

/// How often the screen checks that its terminal is still there when nothing else happens.
const IDLE: Duration = Duration::from_secs(1);

/// Between `--once`'s two samples.
const ONCE_INTERVAL: Duration = Duration::from_secs(1);

/// How often backend health and the cluster are asked for (the stats stream carries neither).
const BACKENDS_EVERY: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.man {
        let mut page = Vec::new();
        let written = clap_mangen::Man::new(Cli::command())
            .render(&mut page)
            .and_then(|()| std::io::Write::write_all(&mut std::io::stdout(), &page));
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cachetop: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let target = match cli.connect.target() {
        Ok(target) => target,
        Err(e) => {
            eprintln!("cachetop: {e}");
            return ExitCode::from(2);
        }
    };
    let client = AdminClient::new(target);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    let mut state = State::new(client.target().addr.to_string());
    let theme = Theme {
        color: !cli.no_color && std::env::var_os("NO_COLOR").is_none(),
    };
    if cli.once {
        // Rates are differences: two samples a second apart, as the live screen has after its first second.
        let sampled = runtime.block_on(async {
            for n in 0..2 {
                if n > 0 {
                    tokio::time::sleep(ONCE_INTERVAL).await;
                }
                let (stats, backends) = (client.stats().await?, client.backends().await);
                state.update(stats, Instant::now());
                if let Ok(list) = backends {
                    state.update_backends(list, Instant::now());
                }
            }
            Ok::<_, AdminError>(())
        });
        return match sampled {
            Ok(()) => {
                print!("{}", view::to_text(&state, &theme, 100, 30));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cachetop: {e}");
                ExitCode::from(e.exit_code())
            }
        };
    }
    let tty = match std::fs::File::open("/dev/tty") {
        Ok(tty) => tty,
        Err(e) => {
            eprintln!("cachetop: needs a terminal ({e}); use --once for plain text");
            return ExitCode::from(2);
        }
    };
    let (updates, received) = mpsc::channel();
    let keys = updates.clone();
    let wants_log = Arc::new(AtomicBool::new(false));
    let following = wants_log.clone();
    std::thread::spawn(move || runtime.block_on(follow(client, updates, following)));
    // ratatui::init restores the terminal on panic as well.
    let mut terminal = ratatui::init();
    // A blocking read sleeps until a key arrives; polling crossterm with a timeout instead costs about 1 % of
    // a core, spinning through its sub-millisecond remainder.
    std::thread::spawn(move || {
        while let Ok(event) = event::read() {
            if keys.send(Update::Terminal(event)).is_err() {
                return;
            }
        }
    });
    let result = (|| -> std::io::Result<()> {
        let mut changed = true;
        loop {
            // A terminal that went away leaves the key reader spinning on end of file (crossterm issue 793):
            // leave, which ends it too.
            if hung_up(&tty) {
                return Ok(());
            }
            if std::mem::take(&mut changed) {
                terminal.draw(|f| view::render(f, &state, &theme))?;
            }
            let update = match received.recv_timeout(IDLE) {
                Ok(update) => update,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            };
            changed = true;
            match update {
                Update::Quit => return Ok(()),
                Update::Terminal(Event::Key(key)) if key.kind == KeyEventKind::Press => {
                    if input::handle(&mut state, key) == Action::Quit {
                        return Ok(());
                    }
                    wants_log.store(state.view == View::Top, Relaxed);
                }
                Update::Terminal(_) => {}
                _ if state.paused => {}
                Update::Stats(stats) => state.update(*stats, Instant::now()),
                Update::Backends(list) => state.update_backends(list, Instant::now()),
                Update::Cluster(report) => state.update_cluster(*report, Instant::now()),
                Update::Log(entries) => state.update_log(entries, Instant::now()),
                Update::NoCluster(cluster) => state.no_cluster(cluster),
                Update::Lost(e) => state.disconnected(e),
            }
        }
    })();
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cachetop: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the terminal went away (a closed window, a dropped SSH session): nothing is left to draw on.
fn hung_up(tty: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: tty.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for an open descriptor, and a zero timeout.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Feeds the screen until it goes: the statistics stream (1 Hz polling when the daemon has no stream),
/// backend health and the cluster every two seconds, and the signals that should end the program cleanly.
async fn follow(client: AdminClient, updates: mpsc::Sender<Update>, wants_log: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    tokio::select! {
        _ = stats(&client, &updates) => {}
        _ = backends(&client, &updates) => {}
        _ = cluster(&client, &updates) => {}
        _ = log(&client, &updates, &wants_log) => {}
        _ = term.recv() => drop(updates.send(Update::Quit)),
        _ = hup.recv() => drop(updates.send(Update::Quit)),
    }
}

/// Reads the statistics, reconnecting every second while the daemon is away; returns when the screen is gone.
async fn stats(client: &AdminClient, updates: &mpsc::Sender<Update>) {
    let send = |stats| updates.send(Update::Stats(Box::new(stats))).is_ok();
    loop {
        let lost = match client.stats_stream().await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Ok(stats) => {
                        if !send(stats) {
                            return;
                        }
                    }
                    Err(e) => break e,
                }
            },
            Err(AdminError::Refused { status, .. }) if status == 404 => loop {
                match client.stats().await {
                    Ok(stats) => {
                        if !send(stats) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => break e,
                }
            },
            Err(e) => e,
        };
        if updates.send(Update::Lost(lost.to_string())).is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn backends(client: &AdminClient, updates: &mpsc::Sender<Update>) {
    loop {
        if let Ok(list) = client.backends().await {
            if updates.send(Update::Backends(list)).is_err() {
                return;
            }
        }
        tokio::time::sleep(BACKENDS_EVERY).await;
    }
}

/// How often the top view's requests are handed to the screen: each batch (empty or not) redraws it.
const LOG_BATCH_EVERY: Duration = Duration::from_millis(500);

/// Follows the log stream while the top view is shown, and only then: a follower makes the daemon record
/// every request. Hands the requests to the screen in batches, so a busy daemon does not redraw it for each.
async fn log(client: &AdminClient, updates: &mpsc::Sender<Update>, wanted: &AtomicBool) {
    let mut tick = tokio::time::interval(LOG_BATCH_EVERY);
    loop {
        tick.tick().await;
        if !wanted.load(Relaxed) {
            continue;
        }
        let Ok(mut stream) = client.log_stream(&LogFilter::default()).await else {
            continue;
        };
        let mut batch = Vec::new();
        while wanted.load(Relaxed) {
            tokio::select! {
                event = stream.next() => match event {
                    Ok(LogEvent::Entry(entry)) => batch.push(*entry),
                    Ok(LogEvent::Lagged(_)) => {}
                    Err(_) => break,
                },
                // Sent empty too: the window ages, and its rates are over the time counted so far.
                _ = tick.tick() => {
                    if updates.send(Update::Log(std::mem::take(&mut batch))).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Every member's view and statistics, through each one's own admin API.
async fn cluster(client: &AdminClient, updates: &mpsc::Sender<Update>) {
    loop {
        let update = match ClusterReport::gather(client).await {
            Ok(report) => Update::Cluster(Box::new(report)),
            Err(AdminError::NotClustered { .. }) => Update::NoCluster(Cluster::Single),
            Err(e) => Update::NoCluster(Cluster::Failed(e.to_string())),
        };
        if updates.send(update).is_err() {
            return;
        }
        tokio::time::sleep(BACKENDS_EVERY).await;
    }
}
