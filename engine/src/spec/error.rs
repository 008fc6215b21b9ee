//! Spec problems: each names the file, line or dotted key and says what to do.

use std::fmt;
use std::path::PathBuf;

use super::source::Location;

/// One problem with a spec. Validation collects all of them before giving up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A file could not be read.
    #[error("{}: cannot read the spec: {message}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// What the OS said.
        message: String,
    },
    /// The YAML does not parse.
    #[error("{}{}: invalid YAML: {message}", file.display(), line_col(*line, *column))]
    Yaml {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: Option<usize>,
        /// 1-based column.
        column: Option<usize>,
        /// What the parser said.
        message: String,
    },
    /// `extends:` names a file that cannot be read.
    #[error("{}:{line}: `extends: {target}`: {} {message}", from.display(), looked_for.display())]
    ExtendsMissing {
        /// The spec with the `extends:` key.
        from: PathBuf,
        /// Its line.
        line: usize,
        /// The value as written.
        target: String,
        /// The path it resolves to (relative to the spec's directory).
        looked_for: PathBuf,
        /// What the OS said.
        message: String,
    },
    /// `extends:` comes back to a file already in the chain.
    #[error("`extends:` forms a cycle: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(" -> "))]
    ExtendsCycle {
        /// The chain, ending with the file seen twice.
        files: Vec<PathBuf>,
    },
    /// A `--set` argument is malformed.
    #[error("--set {argument}: {reason}")]
    BadOverride {
        /// The argument as given.
        argument: String,
        /// Why it was refused.
        reason: String,
    },
    /// A value has the wrong type, a key is unknown or missing, or a number is out of range.
    #[error("{}{}{message}", WhereFmt(location), KeyFmt(key))]
    Type {
        /// Where the offending key was set.
        location: Location,
        /// The dotted key (empty for the whole document).
        key: String,
        /// What is wrong and, where possible, what is expected.
        message: String,
    },
    /// A stage names a kind nobody registered.
    #[error(
        "{}stages.{stage}.kind: unknown stage kind `{kind}`; known kinds: {}",
        WhereFmt(location),
        list_or_none(known)
    )]
    UnknownStageKind {
        /// Where the kind was set.
        location: Location,
        /// The stage instance.
        stage: String,
        /// The kind asked for.
        kind: String,
        /// The registered kinds.
        known: Vec<String>,
    },
    /// `after:` names a stage that is not in the spec.
    #[error(
        "{}stages.{stage}.after: no stage named `{missing}` in this spec; stages: {}",
        WhereFmt(location),
        list_or_none(stages)
    )]
    MissingAfter {
        /// Where `after` was set.
        location: Location,
        /// The stage whose `after` is wrong.
        stage: String,
        /// The name that does not exist.
        missing: String,
        /// The stages that do exist.
        stages: Vec<String>,
    },
    /// The `after:` edges form a cycle.
    #[error("the stages form a cycle through `after:`: {}", cycle.join(" -> "))]
    Cycle {
        /// The stages on the cycle, the first repeated at the end.
        cycle: Vec<String>,
    },
    /// A stage reads a table that no stage upstream of it writes.
    #[error("{}stages.{stage}: reads table `{table}`, but {}", WhereFmt(location), producer_hint(producer.as_deref(), stage))]
    MissingInput {
        /// Where the stage was declared.
        location: Location,
        /// The reading stage.
        stage: String,
        /// The table it reads.
        table: String,
        /// A stage that writes the table but is not upstream, if any.
        producer: Option<String>,
    },
    /// Several stages write a table with different schemas.
    #[error("table `{table}` is written by {} with different columns; writers of one table must declare one schema", stages.join(", "))]
    ConflictingOutputs {
        /// The table.
        table: String,
        /// The writers.
        stages: Vec<String>,
    },
    /// Something the spec names outside the run (a file, a program, a server) is not there.
    #[error("{}{}{why}; {how}", WhereFmt(location), KeyFmt(key))]
    Unavailable {
        /// Where the key was set.
        location: Location,
        /// The dotted key that names it.
        key: String,
        /// What was found instead.
        why: String,
        /// How to provide it.
        how: String,
    },
    /// A stage reads a table that several stages write.
    #[error("{}stages.{stage}: reads table `{table}`, which several stages write ({}); only a table with one writer can be read", WhereFmt(location), writers.join(", "))]
    SharedInput {
        /// Where the stage was declared.
        location: Location,
        /// The reading stage.
        stage: String,
        /// The table.
        table: String,
        /// Its writers.
        writers: Vec<String>,
    },
}

fn producer_hint(producer: Option<&str>, stage: &str) -> String {
    match producer {
        Some(producer) => {
            format!("its writer `{producer}` is not upstream of it; add `{producer}` to `stages.{stage}.after`")
        }
        None => "no stage in this spec writes it".to_string(),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "(none)".to_string() } else { items.join(", ") }
}

fn line_col(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(":{line}:{column}"),
        (Some(line), None) => format!(":{line}"),
        _ => String::new(),
    }
}

struct WhereFmt<'a>(&'a Location);

impl fmt::Display for WhereFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0.file, &self.0.argument) {
            (Some(file), _) => write!(f, "{}{}: ", file.display(), line_col(self.0.line, None)),
            (None, Some(argument)) => write!(f, "--set {argument}: "),
            (None, None) => Ok(()),
        }
    }
}

struct KeyFmt<'a>(&'a str);

impl fmt::Display for KeyFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { Ok(()) } else { write!(f, "{}: ", self.0) }
    }
}

/// All the problems found in one spec.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        writeln!(f, "the spec has {count} problem{}:", if count == 1 { "" } else { "s" })?;
        for error in &self.0 {
            writeln!(f, "  - {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

impl From<SpecError> for SpecErrors {
    fn from(error: SpecError) -> Self {
        SpecErrors(vec![error])
    }
}
