//! The report's content (run list, the paper's three tables, the curves), built once and
//! rendered both as Markdown and as HTML.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::data::{RunData, Score, average, scores};
use crate::figures::{Chart, Line, render};
use crate::paper::paper;
use crate::{ReportError, write_atomically};

/// The paper's row a run fills, from its spec name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Ssp,
    Sesa,
    NoPriming,
    NoFrontier,
    NoDistillation,
}

impl Variant {
    fn of(name: &str) -> Option<Variant> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        match name.as_str() {
            "ssp" => Some(Variant::Ssp),
            "sesa" => Some(Variant::Sesa),
            _ if name.contains("no-priming") => Some(Variant::NoPriming),
            _ if name.contains("no-frontier") => Some(Variant::NoFrontier),
            _ if name.contains("no-distillation") => Some(Variant::NoDistillation),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Ssp => "SSP",
            Variant::Sesa => "SESA",
            Variant::NoPriming => "− priming",
            Variant::NoFrontier => "− frontier",
            Variant::NoDistillation => "− distillation",
        }
    }
}

/// A table: a caption, a header and rows of cells.
struct Table {
    caption: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// A section: a title, paragraphs, tables and figures, in that order.
struct Section {
    title: String,
    paragraphs: Vec<String>,
    tables: Vec<Table>,
    figures: Vec<Chart>,
}

impl Section {
    fn new(title: &str) -> Section {
        Section { title: title.into(), paragraphs: Vec::new(), tables: Vec::new(), figures: Vec::new() }
    }
}

/// A report over some runs.
pub struct Report {
    runs: Vec<RunData>,
}

/// The last evaluation of `mode` among `runs` (the newest run that has one, at its last step
/// with that mode), as scores per benchmark, with the versions evaluated.
fn last_evaluation(runs: &[&RunData], mode: &str) -> Option<(BTreeMap<String, Score>, u64, u64)> {
    let run = runs.iter().rev().find(|r| r.evals.iter().any(|e| e.mode == mode))?;
    let step = run.evals.iter().filter(|e| e.mode == mode).map(|e| e.step).max()?;
    let records: Vec<_> = run.evals.iter().filter(|e| e.mode == mode && e.step == step).collect();
    let policy = records.iter().map(|e| e.policy_version).max().unwrap_or(0);
    let bank = records.iter().map(|e| e.bank_version).max().unwrap_or(0);
    Some((scores(records.iter().copied()), policy, bank))
}

/// The 95% Wilson score interval of a proportion `p` over `n` questions: honest at the small
/// samples a CPU evaluates, where the normal approximation leaves [0, 1].
fn wilson(p: f64, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (z, n) = (1.96_f64, n as f64);
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn percent(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{:.1}", 100.0 * v))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The little Markdown the report's text uses (`code`, **bold**) as HTML, escaped.
fn rich(text: &str) -> String {
    let mut html = String::new();
    for (i, part) in escape(text).split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(html, "<code>{part}</code>");
            continue;
        }
        for (j, run) in part.split("**").enumerate() {
            if j % 2 == 1 {
                let _ = write!(html, "<b>{run}</b>");
            } else {
                html.push_str(run);
            }
        }
    }
    html
}

impl Report {
    /// A report over `runs`, in the order given.
    pub fn new(mut runs: Vec<RunData>) -> Report {
        runs.sort_by(|a, b| a.manifest.created_at.cmp(&b.manifest.created_at));
        Report { runs }
    }

    /// The runs of a paper row, oldest first.
    fn variant(&self, variant: Variant) -> Vec<&RunData> {
        self.runs.iter().filter(|r| Variant::of(&r.manifest.name) == Some(variant)).collect()
    }

    /// Whether every score the tables show is judge accuracy, none is, or some are.
    fn metric_note(&self) -> String {
        let all: Vec<Score> = self.runs.iter().flat_map(|r| scores(&r.evals).into_values()).collect();
        if all.is_empty() {
            "No run has evaluations yet: add an `evaluate` stage or run `sesa eval`.".into()
        } else if all.iter().all(|s| s.judged) {
            "Scores are judge accuracy (exact match first, the judge for the rest), in percent.".into()
        } else if all.iter().all(|s| !s.judged) {
            "Scores are exact match in percent (no judge was configured), not the paper's judge accuracy, \
             which counts more answers as correct."
                .into()
        } else {
            "Scores are judge accuracy where a judge ruled and exact match elsewhere (in percent); \
             the two are not comparable."
                .into()
        }
    }

    fn runs_section(&self) -> Section {
        let mut section = Section::new("Runs");
        let rows = self
            .runs
            .iter()
            .map(|run| {
                let m = &run.manifest;
                let evaluated: Vec<String> = run
                    .modes()
                    .iter()
                    .filter_map(|mode| {
                        let (_, policy, bank) = last_evaluation(&[run], mode)?;
                        Some(format!("{mode}: policy v{policy}, bank v{bank}"))
                    })
                    .collect();
                vec![
                    format!("`{}`", m.run_id),
                    m.name.clone(),
                    m.spec_hash.chars().take(12).collect(),
                    run.model.clone().unwrap_or_else(|| "–".into()),
                    format!("{}/{}", m.committed_steps, m.steps),
                    m.status.to_string(),
                    format!("{:.1} min", run.wall_ms as f64 / 60_000.0),
                    if evaluated.is_empty() { "–".into() } else { evaluated.join("; ") },
                ]
            })
            .collect();
        section.tables.push(Table {
            caption: "Each run: spec name and hash, model, steps committed, status, wall time, versions evaluated."
                .into(),
            header: ["run", "spec", "spec hash", "model", "steps", "status", "wall", "evaluated"]
                .map(String::from)
                .to_vec(),
            rows,
        });
        section
    }

    /// A run row's label: the model the runs served.
    fn model_label(&self) -> String {
        let mut models: Vec<&str> = self.runs.iter().filter_map(|r| r.model.as_deref()).collect();
        models.sort_unstable();
        models.dedup();
        let name = |m: &str| Path::new(m).file_name().and_then(|f| f.to_str()).unwrap_or(m).to_string();
        match models.as_slice() {
            [] => "these runs".into(),
            [one] => format!("{} (these runs)", name(one)),
            many => format!("{} (these runs)", many.iter().map(|m| name(m)).collect::<Vec<_>>().join(", ")),
        }
    }

    fn tables_section(&self) -> Section {
        let paper = paper();
        let mut section = Section::new("The paper's tables");
        section.paragraphs.push(self.metric_note());
        section.paragraphs.push(format!(
            "Paper rows: {}. The paper trains Qwen3 and other 4–8B models on Wikipedia and averages seven \
             benchmarks; runs with another model, corpus or benchmarks give other numbers, and the rows \
             compare only in shape.",
            paper.source
        ));
        let average_of = |runs: &[&RunData], mode: &str| last_evaluation(runs, mode).and_then(|(s, _, _)| average(&s));
        let (ssp, sesa) = (self.variant(Variant::Ssp), self.variant(Variant::Sesa));
        // Base: the initial policy, from whichever run evaluated it (SESA's first).
        let every: Vec<&RunData> = self.variant(Variant::Ssp).into_iter().chain(self.variant(Variant::Sesa)).collect();
        let base = average_of(&sesa, "base").or_else(|| average_of(&every, "base"));
        let mut rows = vec![vec![
            format!("**{}**", self.model_label()),
            percent(base),
            percent(average_of(&ssp, "memory_off")),
            percent(average_of(&sesa, "memory_on")),
        ]];
        rows.extend(paper.table1.iter().map(|r| {
            vec![r.backbone.clone(), format!("{:.1}", r.base), format!("{:.1}", r.ssp), format!("{:.1}", r.sesa)]
        }));
        section.tables.push(Table {
            caption: "Table 1: average score; base (initial policy), +SSP (the `ssp` run), +SESA (the `sesa` run \
                      with its bank)."
                .into(),
            header: ["backbone", "base", "+SSP", "+SESA"].map(String::from).to_vec(),
            rows,
        });
        let mut rows = vec![vec![
            format!("**{}**", self.model_label()),
            percent(average_of(&ssp, "memory_off")),
            percent(average_of(&sesa, "memory_off")),
            percent(average_of(&sesa, "memory_on")),
        ]];
        rows.extend(paper.table2.iter().map(|r| {
            vec![r.backbone.clone(), format!("{:.1}", r.ssp), format!("{:.1}", r.sesa_off), format!("{:.1}", r.sesa_on)]
        }));
        section.tables.push(Table {
            caption: "Table 2: average score; SESA-Off is the SESA policy evaluated without its memory.".into(),
            header: ["backbone", "SSP", "SESA-Off", "SESA-On"].map(String::from).to_vec(),
            rows,
        });
        let variants = [Variant::Sesa, Variant::NoPriming, Variant::NoFrontier, Variant::NoDistillation];
        let evaluations: Vec<(Variant, BTreeMap<String, Score>)> =
            variants.iter().filter_map(|&v| Some((v, last_evaluation(&self.variant(v), "memory_on")?.0))).collect();
        let mut benchmarks: Vec<String> = evaluations.iter().flat_map(|(_, s)| s.keys().cloned()).collect();
        benchmarks.sort();
        benchmarks.dedup();
        let rows = variants
            .iter()
            .map(|&variant| {
                let found = evaluations.iter().find(|(v, _)| *v == variant).map(|(_, s)| s);
                let mut row = vec![variant.label().to_string()];
                row.extend(benchmarks.iter().map(|b| percent(found.and_then(|s| s.get(b)).map(|s| s.value))));
                row.push(percent(found.and_then(average)));
                row
            })
            .collect();
        let mut header = vec!["variant".to_string()];
        header.extend(benchmarks.iter().cloned());
        header.push("Avg".into());
        section.tables.push(Table {
            caption: format!("Table 3 ({}): SESA and its ablations with memory on, per benchmark.", self.model_label()),
            header,
            rows,
        });
        let mut header = vec!["variant".to_string()];
        header.extend(paper.table3.benchmarks.iter().cloned());
        header.push("Avg".into());
        section.tables.push(Table {
            caption: "Table 3 as the paper reports it (Qwen3-4B).".into(),
            header,
            rows: paper
                .table3
                .rows
                .iter()
                .map(|r| {
                    let mut row = vec![r.variant.clone()];
                    row.extend(r.scores.iter().map(|s| format!("{s:.1}")));
                    row.push(format!("{:.1}", r.average));
                    row
                })
                .collect(),
        });
        section
    }

    /// One line per run that trains (its name, and its id's tail where names repeat), numbered by
    /// the run's place among them whether or not it has points here.
    fn lines(&self, points: impl Fn(&RunData) -> Vec<(u64, f64)>) -> Vec<Line> {
        self.runs
            .iter()
            .filter(|run| !run.evaluation_only)
            .enumerate()
            .filter_map(|(series, run)| {
                let points = points(run);
                if points.is_empty() {
                    return None;
                }
                let twins =
                    self.runs.iter().filter(|r| !r.evaluation_only && r.manifest.name == run.manifest.name).count();
                let label = if twins > 1 {
                    let id = &run.manifest.run_id;
                    format!("{} ({})", run.manifest.name, &id[id.len().saturating_sub(4)..])
                } else {
                    run.manifest.name.clone()
                };
                Some(Line { label, series, points })
            })
            .collect()
    }

    fn curves_section(&self) -> Section {
        let mut section = Section::new("Figure 3 and the loop's curves");
        section.paragraphs.push(
            "One line per training run (evaluation-only runs, as `sesa eval` makes, fill the tables only). (a) validation score: the mean over benchmarks of each evaluation step \
             (memory on where the run evaluates it, else memory off, else the base policy); (b) the share \
             of proposals that pass the validity rules (the paper's extraction success); (c) skills in the \
             bank after each step; then the proposer's mean reward, mean p̂ and the solver's success rate."
                .into(),
        );
        let validation = |run: &RunData| {
            let modes = run.modes();
            let Some(mode) = ["memory_on", "memory_off", "base"].into_iter().find(|m| modes.contains(m)) else {
                return Vec::new();
            };
            let mut steps: Vec<u64> = run.evals.iter().filter(|e| e.mode == mode).map(|e| e.step).collect();
            steps.dedup();
            steps
                .into_iter()
                .filter_map(|step| {
                    let at = scores(run.evals.iter().filter(|e| e.mode == mode && e.step == step));
                    Some((step, 100.0 * average(&at)?))
                })
                .collect()
        };
        let judged = self.runs.iter().flat_map(|r| scores(&r.evals).into_values()).all(|s| s.judged);
        let score_name = if judged { "judge accuracy (%)" } else { "exact match (%)" };
        section.figures.push(Chart {
            name: "validation_accuracy",
            title: "(a) Validation score".into(),
            y_label: score_name.into(),
            lines: self.lines(validation),
        });
        let curves: [(&'static str, &str, &str, &str, f64); 5] = [
            ("valid_rate", "valid_rate", "(b) Valid questions (extraction success)", "share of proposals (%)", 100.0),
            ("active_skills", "bank_size", "(c) Active skills", "skills in the bank", 1.0),
            ("proposer_reward", "proposer_reward_mean", "Proposer reward", "mean reward", 1.0),
            ("mean_p_hat", "mean_p_hat", "Mean p̂ of proposed questions", "mean p̂", 1.0),
            ("solver_success", "solver_success", "Solver success", "rollouts rewarded (%)", 100.0),
        ];
        for (name, metric, title, y_label, scale) in curves {
            section.figures.push(Chart {
                name,
                title: title.into(),
                y_label: y_label.into(),
                lines: self.lines(|run| run.curve(metric).into_iter().map(|(s, v)| (s, v * scale)).collect()),
            });
        }
        section
    }

    /// Every run's last evaluation per mode, whatever its name: what runs outside the paper's
    /// matrix (`learn`, a user's own spec) are judged by.
    fn evaluations_section(&self) -> Section {
        let mut section = Section::new("Every run's last evaluation");
        let mut benchmarks: Vec<String> =
            self.runs.iter().flat_map(|r| r.evals.iter().map(|e| e.benchmark.clone())).collect();
        benchmarks.sort();
        benchmarks.dedup();
        let mut rows = Vec::new();
        for run in &self.runs {
            for mode in run.modes() {
                let Some((scores, policy, bank)) = last_evaluation(&[run], mode) else { continue };
                let step = run.evals.iter().filter(|e| e.mode == mode).map(|e| e.step).max().unwrap_or(0);
                let mut row = vec![
                    run.manifest.name.clone(),
                    mode.to_string(),
                    step.to_string(),
                    format!("v{policy}"),
                    format!("v{bank}"),
                ];
                row.extend(benchmarks.iter().map(|b| {
                    scores.get(b).map_or("–".into(), |s| {
                        let (low, high) = wilson(s.value, s.questions);
                        format!("{:.1} [{:.1}, {:.1}] ({})", 100.0 * s.value, 100.0 * low, 100.0 * high, s.questions)
                    })
                }));
                row.push(percent(average(&scores)));
                rows.push(row);
            }
        }
        let mut header: Vec<String> = ["run", "mode", "step", "policy", "bank"].map(String::from).to_vec();
        header.extend(benchmarks.iter().cloned());
        header.push("Avg".into());
        section.tables.push(Table {
            caption: "Score per benchmark (questions in parentheses) at each run's last evaluation of each mode."
                .into(),
            header,
            rows,
        });
        section
    }

    fn sections(&self) -> Vec<Section> {
        vec![self.runs_section(), self.tables_section(), self.evaluations_section(), self.curves_section()]
    }

    fn markdown(sections: &[Section]) -> String {
        let mut md = String::from("# sesa report\n\n");
        for section in sections {
            let _ = writeln!(md, "## {}\n", section.title);
            for paragraph in &section.paragraphs {
                let _ = writeln!(md, "{paragraph}\n");
            }
            for table in &section.tables {
                let _ = writeln!(md, "{}\n", table.caption);
                let _ = writeln!(md, "| {} |", table.header.join(" | "));
                let _ = writeln!(md, "|{}", "---|".repeat(table.header.len()));
                for row in &table.rows {
                    let _ = writeln!(md, "| {} |", row.join(" | "));
                }
                md.push('\n');
            }
            for figure in &section.figures {
                let _ = writeln!(md, "![{}]({}.png)\n", figure.title, figure.name);
            }
        }
        md
    }

    fn html(sections: &[Section], svgs: &BTreeMap<&str, String>, refresh_s: Option<u32>) -> String {
        let mut html = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
        if let Some(seconds) = refresh_s {
            let _ = writeln!(html, "<meta http-equiv=\"refresh\" content=\"{seconds}\">");
        }
        html.push_str(
            "<title>sesa report</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;\
             padding:0 1em;color:#222}table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid \
             #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}.caption{\
             font-style:italic;margin:1em 0 0.2em}figure{display:inline-block;margin:0.5em}code{font-size:90%}</style>\
             \n</head><body>\n<h1>sesa report</h1>\n",
        );
        for section in sections {
            let _ = writeln!(html, "<h2>{}</h2>", escape(&section.title));
            for paragraph in &section.paragraphs {
                let _ = writeln!(html, "<p>{}</p>", rich(paragraph));
            }
            for table in &section.tables {
                let _ = write!(html, "<p class=\"caption\">{}</p>\n<table><tr>", rich(&table.caption));
                for cell in &table.header {
                    let _ = write!(html, "<th>{}</th>", escape(cell));
                }
                html.push_str("</tr>\n");
                for row in &table.rows {
                    html.push_str("<tr>");
                    for cell in row {
                        let _ = write!(html, "<td>{}</td>", rich(cell));
                    }
                    html.push_str("</tr>\n");
                }
                html.push_str("</table>\n");
            }
            for figure in &section.figures {
                let _ = writeln!(html, "<figure>{}</figure>", svgs.get(figure.name).map_or("", String::as_str));
            }
        }
        html.push_str("</body></html>\n");
        html
    }

    /// The Markdown alone (what a snapshot test fixes).
    pub fn to_markdown(&self) -> String {
        Self::markdown(&self.sections())
    }

    /// Writes `report.md`, `report.html` and each figure as PNG and SVG into `out`.
    pub fn write(&self, out: &Path, refresh_s: Option<u32>) -> Result<Vec<PathBuf>, ReportError> {
        std::fs::create_dir_all(out).map_err(|source| ReportError::Write { path: out.to_path_buf(), source })?;
        let sections = self.sections();
        let mut written = Vec::new();
        let mut svgs = BTreeMap::new();
        for figure in sections.iter().flat_map(|s| &s.figures) {
            let rendered = render(figure)?;
            for (extension, bytes) in [("png", rendered.png.as_slice()), ("svg", rendered.svg.as_bytes())] {
                let path = out.join(format!("{}.{extension}", figure.name));
                write_atomically(&path, bytes)?;
                written.push(path);
            }
            svgs.insert(figure.name, rendered.svg);
        }
        for (name, text) in
            [("report.md", Self::markdown(&sections)), ("report.html", Self::html(&sections, &svgs, refresh_s))]
        {
            let path = out.join(name);
            write_atomically(&path, text.as_bytes())?;
            written.push(path);
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::Variant;

    #[test]
    fn wilson_intervals_hold_the_estimate_and_shrink_with_more_questions() {
        let (low, high) = super::wilson(0.5, 60);
        assert!((low - 0.3773).abs() < 1e-3 && (high - 0.6227).abs() < 1e-3, "{low} {high}");
        let (low, high) = super::wilson(0.0, 10);
        assert_eq!(low, 0.0);
        assert!((high - 0.2775).abs() < 1e-3, "{high}");
        let (narrow_low, narrow_high) = super::wilson(0.5, 600);
        assert!(narrow_high - narrow_low < 0.1);
    }

    #[test]
    fn spec_names_match_the_papers_rows() {
        assert_eq!(Variant::of("ssp"), Some(Variant::Ssp));
        assert_eq!(Variant::of("sesa"), Some(Variant::Sesa));
        assert_eq!(Variant::of("sesa-no-frontier"), Some(Variant::NoFrontier));
        assert_eq!(Variant::of("ablation_no_priming"), Some(Variant::NoPriming));
        assert_eq!(Variant::of("sesa-no-distillation"), Some(Variant::NoDistillation));
        assert_eq!(Variant::of("learn"), None);
    }
}
