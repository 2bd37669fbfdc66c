// SPDX-License-Identifier: Apache-2.0
//! The `insitu` command.
fn main() {
    // Like other Unix tools, end quietly when the reader of our output goes away.
    // SAFETY: restores the default action of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(insitu_cli::run(std::env::args_os()));
}
