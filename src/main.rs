//! The `sesa` binary.

fn main() -> std::process::ExitCode {
    sesa::main_with(sesa_stages::registry())
}
