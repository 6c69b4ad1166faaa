//! `foxc`: the command-line driver. Exit codes: 0 ok, 1 user error (diagnostic printed; usage
//! errors such as an unknown flag or a bad flag value too), 2 internal error.

use clap::error::ErrorKind as ClapKind;
use clap::Parser;
use foxc::cli::{Cli, Command};
use foxc::commands;

fn main() {
    // A panic is a bug in foxc: report it as an internal error (exit 2), not Rust's 101.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("internal error: foxc panicked (a bug; please report it with the command line)");
        std::process::exit(2);
    }));
    // Lets the CLI tests see the internal-error path end to end (there is no input that panics).
    if std::env::var_os("FOXC_TEST_PANIC").is_some() {
        panic!("FOXC_TEST_PANIC is set");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are answers, not errors; every other clap error is a
            // usage error (exit 1; clap's own default would be 2, which foxc keeps for bugs).
            let code = match e.kind() {
                ClapKind::DisplayHelp | ClapKind::DisplayVersion => 0,
                _ => 1,
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let result = match cli.command {
        Command::Check { file } => commands::check(&file),
        Command::Compile(args) => commands::compile(&args),
        Command::Inputs { file, shape, seed, o } => commands::inputs(&file, &shape, seed, &o),
        Command::Run(args) => commands::run(&args),
        Command::Bench(args) => commands::bench(&args),
        Command::Grad(args) => commands::grad(&args),
        Command::Verify(args) => commands::verify(&args),
        Command::Rules => commands::rules(),
        Command::Mask { file, inputs, png, prune, target, rules } => {
            commands::mask(&file, &inputs, &png, &prune, target, &rules)
        }
    };
    if let Err(e) = result {
        eprintln!("{}", e.message.trim_end());
        std::process::exit(e.exit_code());
    }
}
