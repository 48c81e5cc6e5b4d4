//! `cachetop`: live statistics of a running lacquerd.

mod state;
mod view;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Parser;
use crossterm::event::{self, Event, KeyCode};
use lacquer_admin::{AdminClient, Target};
use ratatui::{backend::TestBackend, Terminal};

use crate::{state::State, view::Theme};

#[derive(Debug, Parser)]
#[command(version, about = "Watch a running lacquerd live")]
struct Cli {
    /// Admin API address [env: LACQUER_ADMIN] [default: 127.0.0.1:6082]
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// File holding the admin secret [env: LACQUER_SECRET_FILE] [default: /var/lib/lacquer/secret]
    #[arg(long)]
    secret: Option<PathBuf>,
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
    let target = match Target::discover(cli.admin, cli.secret) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cachetop: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = AdminClient::new(target);
    let mut state = State::new(client.target().addr.to_string());
    let theme = Theme {
        color: !cli.no_color && std::env::var_os("NO_COLOR").is_none(),
    };
    if cli.once {
        return match runtime.block_on(client.stats()) {
            Ok(stats) => {
                state.update(stats, Instant::now());
                print!("{}", once(&state, &theme));
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

/// One frame rendered off-screen, as text.
fn once(state: &State, theme: &Theme) -> String {
    let (w, h) = (100, 24);
    let mut terminal = Terminal::new(TestBackend::new(w, h)).expect("test backend");
    terminal
        .draw(|f| view::render(f, state, theme))
        .expect("draw");
    let buf = terminal.backend().buffer().clone();
    (0..h)
        .map(|y| {
            (0..w)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
                .trim_end()
                .to_owned()
                + "\n"
        })
        .collect()
}
