//! `sesa skills`: a run's skill bank, version by version (`show`, `diff`), and skill files
//! (`export`, `import`, `schema`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sesa_engine::{ArtifactStore, read_table};
use sesa_stages::memory::{Skill, SkillFile, skills_from_batch};

/// Every snapshot in the run's `skills` table, by bank version.
async fn versions(run: &str) -> Result<BTreeMap<u64, Vec<Skill>>> {
    let (root, run_id) = crate::support::split_run_location(run)?;
    let root = ArtifactStore::open(&root)?;
    let mut versions: BTreeMap<u64, Vec<Skill>> = BTreeMap::new();
    for (step, batch) in read_table(&root, &run_id, "skills").await.with_context(|| format!("reading `{run}`"))? {
        for (version, skill) in skills_from_batch(&batch).with_context(|| format!("step {step} of `{run}`"))? {
            versions.entry(version).or_default().push(skill);
        }
    }
    if versions.is_empty() {
        bail!("run `{run}` has no skill bank yet (its `skills` table is empty: no memory, or no step committed)");
    }
    Ok(versions)
}

/// The bank at `version`, or at the latest one.
pub(crate) async fn bank_at(run: &str, version: Option<u64>) -> Result<(u64, Vec<Skill>)> {
    let mut versions = versions(run).await?;
    let version = version.unwrap_or_else(|| *versions.keys().next_back().expect("not empty"));
    let known: Vec<String> = versions.keys().map(u64::to_string).collect();
    let skills = versions
        .remove(&version)
        .with_context(|| format!("run `{run}` has no bank version {version}; it has {}", known.join(", ")))?;
    Ok((version, skills))
}

/// `sesa skills show`.
pub async fn show(run: &str, version: Option<u64>) -> Result<u8> {
    let (version, skills) = bank_at(run, version).await?;
    let seeds = skills.iter().filter(|s| s.meta.seed).count();
    println!("bank version {version}: {} skills ({seeds} seed)", skills.len());
    println!("{:<12} {:>5} {:>6} {:>6} {:>6} {:>6}  DESCRIPTION", "SKILL", "SEED", "RETR", "HELPS", "HARMS", "ADDED");
    for skill in &skills {
        let meta = &skill.meta;
        println!(
            "{:<12} {:>5} {:>6} {:>6} {:>6} {:>6}  {}",
            skill.id,
            if meta.seed { "yes" } else { "" },
            meta.retrievals,
            meta.helps,
            meta.harms,
            format!("v{}", meta.version_added),
            crate::support::truncate(&skill.text.description, 80)
        );
    }
    Ok(0)
}

/// `sesa skills diff`: skills added and removed between two versions, and usage changes.
pub async fn diff(run: &str, from: u64, to: u64) -> Result<u8> {
    let (_, before) = bank_at(run, Some(from)).await?;
    let (_, after) = bank_at(run, Some(to)).await?;
    let before: BTreeMap<&str, &Skill> = before.iter().map(|s| (s.id.as_str(), s)).collect();
    let after: BTreeMap<&str, &Skill> = after.iter().map(|s| (s.id.as_str(), s)).collect();
    println!("bank version {from} → {to}: {} → {} skills", before.len(), after.len());
    for (id, skill) in &after {
        if !before.contains_key(id) {
            let lineage = &skill.meta.origin_failures;
            let from = if lineage.is_empty() { String::new() } else { format!(" (from {})", lineage.join(", ")) };
            println!("+ {id:<12} {}{from}", crate::support::truncate(&skill.text.description, 80));
        }
    }
    for (id, skill) in &before {
        if !after.contains_key(id) {
            println!("- {id:<12} {}", crate::support::truncate(&skill.text.description, 80));
        }
    }
    for (id, new) in &after {
        if let Some(old) = before.get(id) {
            let (a, b) = (&old.meta, &new.meta);
            if (a.retrievals, a.helps, a.harms) != (b.retrievals, b.helps, b.harms) {
                println!(
                    "~ {id:<12} retrievals {} → {}, helps {} → {}, harms {} → {}",
                    a.retrievals, b.retrievals, a.helps, b.helps, a.harms, b.harms
                );
            }
        }
    }
    Ok(0)
}

/// `sesa skills export`: the bank at a version as a skill file (stdout, or a file written
/// atomically).
pub async fn export(run: &str, version: Option<u64>, out: Option<&Path>) -> Result<u8> {
    let (version, skills) = bank_at(run, version).await?;
    let file = SkillFile { version, skills };
    let json = serde_json::to_string_pretty(&file)? + "\n";
    match out {
        None => print!("{json}"),
        Some(path) => {
            let partial = path.with_extension("partial");
            std::fs::write(&partial, &json).with_context(|| format!("writing {}", partial.display()))?;
            std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("exported bank version {version} ({} skills) to {}", file.skills.len(), path.display());
        }
    }
    Ok(0)
}

/// `sesa skills import`: checks a skill file (from `export` or written by hand) and says how a
/// run starts from it.
pub fn import(path: &Path) -> Result<u8> {
    let file = SkillFile::load(path)?;
    let seeds = file.skills.iter().filter(|s| s.meta.seed).count();
    println!(
        "{}: {} skills ({seeds} seed, {} distilled), exported at bank version {}",
        path.display(),
        file.skills.len(),
        file.skills.len() - seeds,
        file.version
    );
    println!(
        "start a run from it with `--set stages.<priming stage>.skills={}` (usage counts are kept; \
         skills that duplicate an earlier one under the run's `memory.dedup_by` are rejected and logged)",
        path.display()
    );
    Ok(0)
}
