//! Where log lines go: stderr, as text or JSON, without tearing the progress bars.

use std::io::{IsTerminal, Write};

use sesa_engine::Progress;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A writer that hides the progress bars while a log line is written.
#[derive(Clone)]
struct ProgressAwareStderr(Progress);

struct SuspendingWriter(Progress);

impl Write for SuspendingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.suspend(|| std::io::stderr().write_all(buf))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for ProgressAwareStderr {
    type Writer = SuspendingWriter;
    fn make_writer(&'a self) -> Self::Writer {
        SuspendingWriter(self.0.clone())
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the default level (`info`).
pub fn init(format: LogFormat, progress: &Progress) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let writer = ProgressAwareStderr(progress.clone());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.compact().try_init(),
        // The span list carries the run id, step and stage of every event.
        LogFormat::Json => builder.json().with_current_span(false).with_span_list(true).try_init(),
    };
}
