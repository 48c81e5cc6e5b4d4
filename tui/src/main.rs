//! `cachetop`: live statistics of a running lacquerd.

mod state;
mod view;

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Parser;
use crossterm::event::{self, Event, KeyCode};
use lacquer_admin::ConnectArgs;

use crate::{state::State, view::Theme};

#[derive(Debug, Parser)]
#[command(version, about = "Watch a running lacquerd live")]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print one frame as plain text and exit.
    #[arg(long)]
    once: bool,
    /// No colours.
    #[arg(long)]
    no_color: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let client = match cli.connect.client() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("cachetop: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
    let interval = Duration::from_secs_f64(cli.interval.max(0.1));
    // ratatui::init restores the terminal on panic as well.
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            match runtime.block_on(client.stats()) {
                Ok(stats) => state.update(stats, Instant::now()),
                Err(e) => state.disconnected(e.to_string()),
            }
            terminal.draw(|f| view::render(f, &state, &theme))?;
            let deadline = Instant::now() + interval;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if event::poll(left)? {
                    if let Event::Key(key) = event::read()? {
                        if matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) {
                            return Ok(());
                        }
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
