//! Search results as a model sees them, exactly as SSP formats them (veRL's Search-R1 tool):
//! per query `Doc {i} (Title: "{title}")\n{text}\n\n` for i from 1, the whole stripped, and
//! queries joined by `\n---\n`. Every agent uses this one function.

use super::Hit;

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
}
