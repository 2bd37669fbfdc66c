// SPDX-License-Identifier: Apache-2.0
//! The `insitu` command.
fn main() {
    std::process::exit(insitu_cli::run(std::env::args_os()));
}
