//! A BM25 index on disk (tantivy): built once from a corpus, then opened read-only and queried
//! by any number of threads.
//!
//! Queries from models are untrusted text: they go through the index's own analyzer and become
//! a bag of terms (a disjunction of term queries), so no query syntax is ever interpreted and
//! no input can make a query fail. A query with no terms left (empty, punctuation, only
//! stopwords) matches nothing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, EnableScoring, Query, TermQuery};
use tantivy::schema::{FAST, Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer, TokenStream,
};
use tantivy::{
    DocAddress, DocSet, Index, IndexReader, ReloadPolicy, Score, Searcher, TERMINATED, TantivyDocument, Term,
};

use super::corpus::CorpusReader;
use super::{Doc, Hit, Search, SearchError};

/// The analyzer name stored in the index schema.
const ANALYZER: &str = "sesa_en";
/// Longer queries are cut here: a runaway model must not make one search take seconds.
const MAX_QUERY_TERMS: usize = 256;
const MAX_QUERY_BYTES: usize = 8 * 1024;
/// Up to this many passages, queries score every matching document into a dense array (what
/// bm25s does) instead of tantivy's block-WAND, which pays off only on large indexes. Both give
/// the same BM25 scores.
const EXHAUSTIVE_MAX_DOCS: u64 = 200_000;
/// About 16 KiB each: 16 MiB of decompressed passages at most.
const DOC_STORE_CACHE_BLOCKS: usize = 1024;

/// Lowercase, English stopwords removed, Porter-style stemming: close to Pyserini's default.
fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(StopWordFilter::new(Language::English).expect("tantivy ships English stopwords"))
        .filter(Stemmer::new(Language::English))
        .build()
}

struct Fields {
    id: Field,
    title: Field,
    text: Field,
    contents: Field,
    /// The passage's position in the corpus: ties are broken by it, so results do not depend on
    /// how a multi-threaded build split the passages into segments.
    ordinal: Field,
}

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    let id = builder.add_text_field("id", STRING | STORED);
    let title = builder.add_text_field("title", STORED);
    let text = builder.add_text_field("text", STORED);
    let indexing = TextFieldIndexing::default().set_tokenizer(ANALYZER).set_index_option(IndexRecordOption::WithFreqs);
    let contents = builder.add_text_field("contents", TextOptions::default().set_indexing_options(indexing));
    let ordinal = builder.add_u64_field("ordinal", FAST);
    (builder.build(), Fields { id, title, text, contents, ordinal })
}

/// What building an index did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    /// Passages indexed.
    pub passages: u64,
    /// Corpus bytes read.
    pub bytes: u64,
}

/// A BM25 index, opened for searching. Cheap to share: clone the `Arc`.
pub struct Bm25Index {
    path: PathBuf,
    reader: IndexReader,
    analyzer: TextAnalyzer,
    fields: Fields,
}

impl std::fmt::Debug for Bm25Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bm25Index({})", self.path.display())
    }
}

/// The corpus file an index was built from, as its size and modification time: cheap to
/// check on every open, and enough to notice a regenerated corpus.
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct CorpusStamp {
    bytes: u64,
    modified_secs: u64,
    modified_nanos: u32,
}

impl CorpusStamp {
    /// Its file inside the index directory (tantivy leaves files it does not manage alone).
    const FILE: &'static str = "sesa-corpus.json";

    fn of(corpus: &Path) -> Option<CorpusStamp> {
        let metadata = std::fs::metadata(corpus).ok()?;
        let modified = metadata.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(CorpusStamp {
            bytes: metadata.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        })
    }

    /// Whether `index` was built from `corpus` as it is now. An index without a stamp (built
    /// by an earlier sesa) is current unless the corpus was modified after it; an unreadable
    /// corpus leaves the index as it is.
    fn index_is_current(corpus: &Path, index: &Path) -> bool {
        let Some(now) = CorpusStamp::of(corpus) else { return true };
        match std::fs::read(index.join(CorpusStamp::FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<CorpusStamp>(&b).ok())
        {
            Some(built) => built == now,
            None => {
                let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
                match (modified(corpus), modified(index)) {
                    (Some(corpus), Some(index)) => corpus <= index,
                    _ => true,
                }
            }
        }
    }
}

impl Bm25Index {
    /// Builds an index of the JSONL corpus at `corpus` in the empty or new directory `out`,
    /// streaming the corpus. `progress(bytes_read)` is called every few thousand passages.
    pub fn build(corpus: &Path, out: &Path, progress: impl FnMut(u64)) -> Result<IndexStats, SearchError> {
        let index_error = |message: String| SearchError::Index { path: out.display().to_string(), message };
        if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
            return Err(index_error(
                "the output directory exists and is not empty; remove it or choose another".into(),
            ));
        }
        // Build beside the target and move it into place at the end, so that a failed or
        // interrupted build never leaves something that looks like an index.
        let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("index");
        let partial = out.with_file_name(format!("{name}.partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        match Self::build_into(corpus, &partial, progress) {
            Ok(stats) => {
                if out.exists() {
                    std::fs::remove_dir(out).map_err(|e| index_error(e.to_string()))?;
                }
                std::fs::rename(&partial, out).map_err(|e| index_error(e.to_string()))?;
                Ok(stats)
            }
            Err(message) => {
                let _ = std::fs::remove_dir_all(&partial);
                Err(index_error(message))
            }
        }
    }

    fn build_into(corpus: &Path, out: &Path, mut progress: impl FnMut(u64)) -> Result<IndexStats, String> {
        let mut reader = CorpusReader::open(corpus).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
        let (schema, fields) = schema();
        let index = Index::create_in_dir(out, schema).map_err(|e| e.to_string())?;
        index.tokenizers().register(ANALYZER, analyzer());
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
        let mut writer = index
            .writer_with_num_threads::<TantivyDocument>(threads, threads * 100_000_000)
            .map_err(|e| e.to_string())?;
        let mut passages = 0u64;
        while let Some(passage) = reader.next() {
            let passage = passage.map_err(|e| e.to_string())?;
            let mut document = TantivyDocument::default();
            document.add_text(fields.id, &passage.id);
            document.add_text(fields.title, &passage.title);
            document.add_text(fields.text, &passage.text);
            document.add_text(fields.contents, format!("{}\n{}", passage.title, passage.text));
            document.add_u64(fields.ordinal, passages);
            writer.add_document(document).map_err(|e| e.to_string())?;
            passages += 1;
            if passages.is_multiple_of(4096) {
                progress(reader.bytes_read());
            }
        }
        if passages == 0 {
            return Err(format!("the corpus `{}` has no passages", corpus.display()));
        }
        writer.commit().map_err(|e| e.to_string())?;
        writer.wait_merging_threads().map_err(|e| e.to_string())?;
        if let Some(stamp) = CorpusStamp::of(corpus) {
            let json = serde_json::to_vec(&stamp).map_err(|e| e.to_string())?;
            std::fs::write(out.join(CorpusStamp::FILE), json).map_err(|e| e.to_string())?;
        }
        progress(reader.bytes_read());
        Ok(IndexStats { passages, bytes: reader.bytes_read() })
    }

    /// Opens the index at `index`, first building it from `corpus` if it is missing (logged:
    /// a large corpus takes a while).
    /// An index built from another version of the corpus (a regenerated world) is rebuilt.
    pub fn open_or_build(corpus: &Path, index: &Path) -> Result<Bm25Index, SearchError> {
        if index.exists() && !CorpusStamp::index_is_current(corpus, index) {
            tracing::warn!(
                "{} changed since the index {} was built from it: rebuilding the index",
                corpus.display(),
                index.display()
            );
            std::fs::remove_dir_all(index)
                .map_err(|e| SearchError::Index { path: index.display().to_string(), message: e.to_string() })?;
        }
        if !index.exists() {
            tracing::info!(corpus = %corpus.display(), index = %index.display(), "building the search index");
            Bm25Index::build(corpus, index, |_| {})?;
        }
        Bm25Index::open(index)
    }

    /// Opens an index built by [`Bm25Index::build`].
    pub fn open(path: &Path) -> Result<Bm25Index, SearchError> {
        let index_error = |message: String| SearchError::Index { path: path.display().to_string(), message };
        let index = Index::open_in_dir(path).map_err(|e| {
            index_error(format!("{e}; build one with `sesa index build CORPUS.jsonl --out {}`", path.display()))
        })?;
        index.tokenizers().register(ANALYZER, analyzer());
        let (expected, _) = schema();
        let schema = index.schema();
        let field = |name: &str| {
            schema.get_field(name).map_err(|_| index_error(format!("not a sesa index: no `{name}` field")))
        };
        let fields = Fields {
            id: field("id")?,
            title: field("title")?,
            text: field("text")?,
            contents: field("contents")?,
            ordinal: field("ordinal")?,
        };
        if schema != expected {
            return Err(index_error("built by another version of sesa; rebuild it with `sesa index build`".into()));
        }
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            // Decompressed doc-store blocks are cached: hot passages cost no decompression.
            .doc_store_cache_num_blocks(DOC_STORE_CACHE_BLOCKS)
            .try_into()
            .map_err(|e: tantivy::TantivyError| index_error(e.to_string()))?;
        Ok(Bm25Index { path: path.to_path_buf(), reader, analyzer: analyzer(), fields })
    }

    /// How many passages the index holds.
    pub fn len(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The analyzed terms of `query`, capped in size.
    fn terms(&self, query: &str) -> Vec<Term> {
        let mut end = query.len().min(MAX_QUERY_BYTES);
        while !query.is_char_boundary(end) {
            end -= 1;
        }
        let mut analyzer = self.analyzer.clone();
        let mut stream = analyzer.token_stream(&query[..end]);
        let mut terms = Vec::new();
        while stream.advance() && terms.len() < MAX_QUERY_TERMS {
            terms.push(Term::from_field_text(self.fields.contents, &stream.token().text));
        }
        terms
    }

    /// The top-`k` passages for one free-text query. Never fails on any query text.
    pub fn search_one(&self, query: &str, k: usize) -> Result<Vec<Hit>, SearchError> {
        let terms = self.terms(query);
        if terms.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        let index_error = |e: tantivy::TantivyError| SearchError::Index {
            path: self.path.display().to_string(),
            message: e.to_string(),
        };
        let top = if searcher.num_docs() <= EXHAUSTIVE_MAX_DOCS {
            top_k_exhaustive(&searcher, &terms, k).map_err(index_error)?
        } else {
            // Block-WAND by score, with room for ties at the cut, then ties by corpus order.
            let found = searcher
                .search(&BooleanQuery::new_multiterms_query(terms), &TopDocs::with_limit(4 * k + 8).order_by_score())
                .map_err(index_error)?;
            let mut ranked = found
                .into_iter()
                .map(|(score, address)| Ok(Ranked { score, ordinal: ordinal_of(&searcher, address)?, address }))
                .collect::<tantivy::Result<Vec<_>>>()
                .map_err(index_error)?;
            ranked.sort_by(|a, b| b.cmp(a));
            ranked.into_iter().take(k).map(|r| (r.score, r.address)).collect()
        };
        top.into_iter()
            .map(|(score, address)| {
                let document: TantivyDocument = searcher.doc(address).map_err(index_error)?;
                let text = |field| document.get_first(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                Ok(Hit {
                    doc: Doc { id: text(self.fields.id), title: text(self.fields.title), text: text(self.fields.text) },
                    score,
                })
            })
            .collect()
    }

    /// The top-`k` passages for each query, using every core.
    pub fn search_batch(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>, SearchError> {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        if queries.len() < 8 || threads == 1 {
            return queries.iter().map(|q| self.search_one(q, k)).collect();
        }
        let chunk = queries.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = queries
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || part.iter().map(|q| self.search_one(q, k)).collect::<Result<Vec<_>, _>>())
                })
                .collect();
            let mut results = Vec::with_capacity(queries.len());
            for handle in handles {
                results.extend(handle.join().expect("search threads do not panic")?);
            }
            Ok(results)
        })
    }
}

/// A scored document, ordered by score, then earlier passages of the corpus first.
#[derive(Clone, Copy, PartialEq)]
struct Ranked {
    score: Score,
    ordinal: u64,
    address: DocAddress,
}

fn ordinal_of(searcher: &Searcher, address: DocAddress) -> tantivy::Result<u64> {
    let column = searcher.segment_reader(address.segment_ord).fast_fields().u64("ordinal")?;
    Ok(column.first(address.doc_id).unwrap_or(u64::MAX))
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&other.score).then(other.ordinal.cmp(&self.ordinal))
    }
}

/// Term-at-a-time BM25: each term's postings add its scores into a dense array per segment;
/// then the best `k`, ties broken by corpus order.
fn top_k_exhaustive(searcher: &Searcher, terms: &[Term], k: usize) -> tantivy::Result<Vec<(Score, DocAddress)>> {
    let scoring = EnableScoring::enabled_from_searcher(searcher);
    let weights = terms
        .iter()
        .map(|term| TermQuery::new(term.clone(), IndexRecordOption::WithFreqs).weight(scoring))
        .collect::<tantivy::Result<Vec<_>>>()?;
    // A min-heap of the best `k` so far: its top is the one to beat.
    let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::with_capacity(k + 1);
    for (segment_ord, segment) in searcher.segment_readers().iter().enumerate() {
        let ordinals = segment.fast_fields().u64("ordinal")?;
        let mut scores = vec![0.0 as Score; segment.max_doc() as usize];
        for weight in &weights {
            let mut scorer = weight.scorer(segment, 1.0)?;
            let mut doc = scorer.doc();
            while doc != TERMINATED {
                scores[doc as usize] += scorer.score();
                doc = scorer.advance();
            }
        }
        for (doc, &score) in scores.iter().enumerate() {
            if score <= 0.0 || (heap.len() == k && score < heap.peek().map_or(0.0, |worst| worst.0.score)) {
                continue;
            }
            let ordinal = ordinals.first(doc as u32).unwrap_or(u64::MAX);
            let candidate = Ranked { score, ordinal, address: DocAddress::new(segment_ord as u32, doc as u32) };
            if heap.len() == k && heap.peek().is_some_and(|worst| candidate <= worst.0) {
                continue;
            }
            heap.push(Reverse(candidate));
            if heap.len() > k {
                heap.pop();
            }
        }
    }
    let best = heap.into_sorted_vec().into_iter().map(|Reverse(r)| (r.score, r.address)).collect();
    Ok(best)
}

impl Search for Arc<Bm25Index> {
    fn search<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Result<Vec<Vec<Hit>>, SearchError>> {
        let index = self.clone();
        let queries = queries.to_vec();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || index.search_batch(&queries, k))
                .await
                .map_err(|e| SearchError::Index { path: "?".into(), message: format!("search task failed: {e}") })?
        })
    }
}

#[cfg(test)]
mod tests;
