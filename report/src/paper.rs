//! The paper's reported numbers, kept as data (`paper.yaml`) with their source.

use serde::Deserialize;

/// Everything `paper.yaml` holds.
#[derive(Debug, Deserialize)]
pub struct Paper {
    /// Where the numbers come from.
    pub source: String,
    /// Table 1: base / +SSP / +SESA per backbone.
    pub table1: Vec<Table1Row>,
    /// Table 2: SSP / SESA-Off / SESA-On per backbone.
    pub table2: Vec<Table2Row>,
    /// Table 3: SESA and its ablations per benchmark.
    pub table3: Table3,
}

/// A row of Table 1.
#[derive(Debug, Deserialize)]
pub struct Table1Row {
    pub backbone: String,
    pub base: f64,
    pub ssp: f64,
    pub sesa: f64,
}

/// A row of Table 2.
#[derive(Debug, Deserialize)]
pub struct Table2Row {
    pub backbone: String,
    pub ssp: f64,
    pub sesa_off: f64,
    pub sesa_on: f64,
}

/// Table 3.
#[derive(Debug, Deserialize)]
pub struct Table3 {
    pub benchmarks: Vec<String>,
    pub rows: Vec<Table3Row>,
}

/// A row of Table 3.
#[derive(Debug, Deserialize)]
pub struct Table3Row {
    pub variant: String,
    pub scores: Vec<f64>,
    pub average: f64,
}

/// The numbers, parsed once from the file compiled in.
pub fn paper() -> Paper {
    // A test parses the file, so a malformed edit fails the build's tests, not a user's report.
    serde_yaml::from_str(include_str!("paper.yaml")).expect("paper.yaml is checked by a test")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_papers_numbers_parse_and_table_3_is_rectangular() {
        let paper = super::paper();
        assert_eq!(paper.table1.len(), 7);
        assert_eq!(paper.table2.len(), 2);
        for row in &paper.table3.rows {
            assert_eq!(row.scores.len(), paper.table3.benchmarks.len(), "{}", row.variant);
            let mean = row.scores.iter().sum::<f64>() / row.scores.len() as f64;
            assert!((mean - row.average).abs() < 0.06, "{}: {mean} vs {}", row.variant, row.average);
        }
    }
}
