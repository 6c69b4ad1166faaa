//! `foxc`: the command-line driver. Exit codes: 0 ok, 1 user error (diagnostic printed),
//! 2 internal error.

use clap::Parser;
use foxc::cli::{Cli, Command};
use foxc::commands;

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { file } => commands::check(&file),
        Command::Compile(args) => commands::compile(&args),
        Command::Inputs { file, shape, seed, o } => commands::inputs(&file, &shape, seed, &o),
        Command::Run(args) => commands::run(&args),
        Command::Bench(args) => commands::bench(&args),
        Command::Mask { file, inputs, png, prune, target } => {
            commands::mask(&file, &inputs, &png, &prune, target)
        }
    };
    if let Err(e) = result {
        eprintln!("{}", e.message.trim_end());
        std::process::exit(e.exit_code());
    }
}
