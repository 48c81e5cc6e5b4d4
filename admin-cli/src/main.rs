//! `cachectl`: talk to a running `lacquerd` through its admin API.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use lacquer_admin::{flatten, AdminClient, Target};

#[derive(Debug, Parser)]
#[command(version, about = "Operate a running lacquerd")]
struct Cli {
    /// Admin API address [env: LACQUER_ADMIN] [default: 127.0.0.1:6082]
    #[arg(long, global = true)]
    admin: Option<SocketAddr>,
    /// File holding the admin secret [env: LACQUER_SECRET_FILE] [default: /var/lib/lacquer/secret]
    #[arg(long, global = true)]
    secret: Option<PathBuf>,
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
    let target = match Target::discover(cli.admin, cli.secret) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cachectl: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = AdminClient::new(target);
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
