//! The block crate's own driver for `img` (tests and bench.sh use it until
//! the `vmm` binary exposes `vmm img`).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "block-img",
    about = "qcow2/raw image tool (qemu-img/qemu-io flags)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: block::img::ImgCommand,
}

fn main() {
    let cli = Cli::parse();
    match block::img::run(cli.cmd) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("block-img: {e:#}");
            std::process::exit(1);
        }
    }
}
