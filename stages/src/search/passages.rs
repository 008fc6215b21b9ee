//! Search over a handful of passages held in memory, scored by BM25 over them alone: a
//! verifier that answers the way the solver does, by searching, reads only the materials it
//! was given.

use futures::future::BoxFuture;

use super::{Doc, Hit, Search, SearchError};

/// BM25's term-frequency saturation and length normalisation (tantivy's and Lucene's defaults).
const K1: f32 = 1.2;
const B: f32 = 0.75;

/// Passages searched in memory.
pub struct PassageSearch {
    docs: Vec<Doc>,
    /// Each passage's terms (its title's and its text's).
    terms: Vec<Vec<String>>,
    /// The passages' mean length in terms.
    average: f32,
}

fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_lowercase).collect()
}

impl PassageSearch {
    /// Searches `docs`.
    pub fn new(docs: Vec<Doc>) -> PassageSearch {
        let terms: Vec<Vec<String>> = docs.iter().map(|d| terms(&format!("{} {}", d.title, d.text))).collect();
        let average = terms.iter().map(Vec::len).sum::<usize>() as f32 / terms.len().max(1) as f32;
        PassageSearch { docs, terms, average }
    }

    /// The top `k` passages for `query`, best first (ties in the passages' order); a passage
    /// that shares no term with the query is never returned.
    fn top(&self, query: &str, k: usize) -> Vec<Hit> {
        let n = self.docs.len() as f32;
        let mut query = terms(query);
        query.sort_unstable();
        query.dedup();
        // Each query term with its inverse document frequency, once for all passages.
        let weighted: Vec<(String, f32)> = query
            .into_iter()
            .map(|term| {
                let df = self.terms.iter().filter(|d| d.contains(&term)).count() as f32;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                (term, idf)
            })
            .collect();
        let mut scored: Vec<(usize, f32)> = (0..self.docs.len())
            .map(|i| {
                let length = self.terms[i].len() as f32;
                let score = weighted
                    .iter()
                    .map(|(term, idf)| {
                        let tf = self.terms[i].iter().filter(|t| *t == term).count() as f32;
                        idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * length / self.average.max(1.0)))
                    })
                    .sum::<f32>();
                (i, score)
            })
            .filter(|(_, score)| *score > 0.0)
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored.into_iter().take(k).map(|(i, score)| Hit { doc: self.docs[i].clone(), score }).collect()
    }
}

impl Search for PassageSearch {
    fn search<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Result<Vec<Vec<Hit>>, SearchError>> {
        let hits = queries.iter().map(|query| self.top(query, k)).collect();
        Box::pin(std::future::ready(Ok(hits)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(title: &str, text: &str) -> Doc {
        Doc { id: title.into(), title: title.into(), text: text.into() }
    }

    #[tokio::test]
    async fn finds_the_passage_a_query_names_and_nothing_unrelated() {
        let search = PassageSearch::new(vec![
            doc("Orla", "Orla is a river port. Orla is located in the country of Veltria."),
            doc("Mior Belsabri", "Mior Belsabri is a poet. Mior Belsabri was born in the city of Orla."),
            doc("Veltria", "Veltria is a country."),
        ]);
        let queries = vec!["Mior Belsabri birthplace".to_string(), "Orla country".to_string(), "Zzyx".to_string()];
        let hits = search.search(&queries, 2).await.unwrap();
        let best: Vec<Option<&str>> = hits.iter().map(|h| h.first().map(|h| h.doc.title.as_str())).collect();
        assert_eq!(best, [Some("Mior Belsabri"), Some("Orla"), None]);
        // Only passages that share a term ("birthplace" is in none), at most k of them.
        assert_eq!(hits.iter().map(Vec::len).collect::<Vec<_>>(), [1, 2, 0]);
        assert!(hits[1][0].score > hits[1][1].score);
    }
}
