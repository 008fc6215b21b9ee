//! Search results as a model sees them, exactly as SSP formats them (veRL's Search-R1 tool):
//! per query `Doc {i} (Title: "{title}")\n{text}\n\n` for i from 1, the whole stripped, and
//! queries joined by `\n---\n`. Every agent uses this one function, and [`parse_results`]
//! reads it back.

use super::{Doc, Hit};

/// Formats the hits of each query for the `<information>` block.
pub fn format_results(results: &[Vec<Hit>]) -> String {
    results
        .iter()
        .map(|hits| {
            if hits.is_empty() {
                return "No search results found.".to_string();
            }
            let mut text = String::new();
            for (index, hit) in hits.iter().enumerate() {
                text.push_str(&format!("Doc {} (Title: \"{}\")\n{}\n\n", index + 1, hit.doc.title, hit.doc.text));
            }
            text.trim().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// The passages in text that [`format_results`] wrote (a proposer's materials, several
/// `<information>` blocks' contents), in order, each title once; the title is the id.
pub fn parse_results(text: &str) -> Vec<Doc> {
    let mut docs: Vec<Doc> = Vec::new();
    let mut current: Option<(String, Vec<&str>)> = None;
    let mut close = |current: &mut Option<(String, Vec<&str>)>| {
        if let Some((title, lines)) = current.take()
            && !docs.iter().any(|d| d.title == title)
        {
            docs.push(Doc { id: title.clone(), title, text: lines.join("\n").trim().to_string() });
        }
    };
    for line in text.lines() {
        if let Some(title) = header(line) {
            close(&mut current);
            current = Some((title.to_string(), Vec::new()));
        } else if line == "---" || line == "No search results found." {
            close(&mut current);
        } else if let Some((_, lines)) = &mut current {
            lines.push(line);
        }
    }
    close(&mut current);
    docs
}

/// The title of a `Doc {i} (Title: "{title}")` line.
fn header(line: &str) -> Option<&str> {
    let (number, rest) = line.strip_prefix("Doc ")?.split_once(' ')?;
    number.parse::<usize>().ok()?;
    rest.strip_prefix("(Title: \"")?.strip_suffix("\")")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::Doc;

    fn hit(title: &str, text: &str) -> Hit {
        Hit { doc: Doc { id: "x".into(), title: title.into(), text: text.into() }, score: 1.0 }
    }

    #[test]
    fn formats_like_ssp() {
        let results = vec![
            vec![hit("William Boyd (pathologist)", "William Boyd was a pathologist."), hit("Paris", "Capital.")],
            vec![],
            vec![hit("Lyon", "A city.")],
        ];
        insta::assert_snapshot!(format_results(&results), @r#"
        Doc 1 (Title: "William Boyd (pathologist)")
        William Boyd was a pathologist.

        Doc 2 (Title: "Paris")
        Capital.
        ---
        No search results found.
        ---
        Doc 1 (Title: "Lyon")
        A city.
        "#);
    }

    #[test]
    fn parsing_reads_back_what_formatting_wrote() {
        let results = vec![
            vec![hit("Orla", "Orla is a river port.\nIt is old."), hit("Paris", "Capital.")],
            vec![],
            vec![hit("Lyon", "A city."), hit("Orla", "Orla is a river port.\nIt is old.")],
        ];
        let block = crate::agent::information_block(&format_results(&results));
        let materials = format!("{block}\n\n{}", format_results(&results[2..]));
        let docs = parse_results(&materials);
        let read: Vec<(&str, &str)> = docs.iter().map(|d| (d.title.as_str(), d.text.as_str())).collect();
        assert_eq!(read, [("Orla", "Orla is a river port.\nIt is old."), ("Paris", "Capital."), ("Lyon", "A city.")]);
        assert!(parse_results("Doc one (Title: \"X\")\ntext").is_empty());
    }
}
