//! `cachectl`: talk to a running `lacquerd` through its admin API.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lacquer_admin::{flatten, ConnectArgs};

#[derive(Debug, Parser)]
#[command(version, about = "Operate a running lacquerd")]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Is the daemon up? (needs no secret)
    Health,
    /// Counters and gauges.
    Stats,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let client = match cli.connect.client() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("cachectl: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Health => client.health().await,
            Command::Stats => client.stats().await,
        }
    });
    match result {
        Ok(doc) if cli.json => {
            println!("{doc}");
            ExitCode::SUCCESS
        }
        Ok(doc) => {
            let mut rows = Vec::new();
            flatten("", &doc, &mut rows);
            let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, value) in rows {
                let value = value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_owned);
                println!("{name:<width$}  {value:>16}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cachectl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
