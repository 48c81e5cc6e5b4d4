//! `cachetop`: live statistics of a running lacquerd.

mod state;
mod view;

use std::{
    process::ExitCode,
    sync::mpsc,
    time::{Duration, Instant},
};

use clap::Parser;
use crossterm::event::{self, Event, KeyCode};
use lacquer_admin::{wire::Stats, AdminClient, ConnectArgs};

use crate::{state::State, view::Theme};

#[derive(Debug, Parser)]
#[command(version, about = "Watch a running lacquerd live")]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print one frame as plain text and exit.
    #[arg(long)]
    once: bool,
    /// No colours.
    #[arg(long)]
    no_color: bool,
}

/// What the stream reader tells the screen.
enum Update {
    Stats(Box<Stats>),
    Lost(String),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        return match runtime.block_on(client.stats()) {
            Ok(stats) => {
                state.update(stats, Instant::now());
                print!("{}", view::to_text(&state, &theme, 100, 24));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cachetop: {e}");
                ExitCode::from(e.exit_code())
            }
        };
    }
    let (updates, received) = mpsc::channel();
    std::thread::spawn(move || runtime.block_on(follow(client, updates)));
    // ratatui::init restores the terminal on panic as well.
    let mut terminal = ratatui::init();
    let result = (|| -> std::io::Result<()> {
        loop {
            for update in received.try_iter() {
                match update {
                    Update::Stats(stats) => state.update(*stats, Instant::now()),
                    Update::Lost(e) => state.disconnected(e),
                }
            }
            terminal.draw(|f| view::render(f, &state, &theme))?;
            if event::poll(Duration::from_millis(100))? {
                if let Event::Key(key) = event::read()? {
                    if matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) {
                        return Ok(());
                    }
                }
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

/// Reads the daemon's statistics stream, reconnecting every second while it is away, until the screen goes.
async fn follow(client: AdminClient, updates: mpsc::Sender<Update>) {
    loop {
        let lost = match client.stats_stream().await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Ok(stats) => {
                        if updates.send(Update::Stats(Box::new(stats))).is_err() {
                            return;
                        }
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
