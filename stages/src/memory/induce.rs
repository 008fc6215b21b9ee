//! Skill induction by rules, for setups with no judge model: a frontier question's failed
//! rollouts, contrasted with a successful rollout of the same question, become one skill.
//!
//! - trigger: the question with its named entities masked and its relation words kept
//!   ("In which country is the city where the founder of <entity> was born?");
//! - query template: the successful rollout's searches, each entity replaced by a slot: the
//!   question's entities by `<entity …>`, entities found along the way by `<result k>`;
//! - avoid: where the failures went wrong, against that success (stopped early, answered with
//!   an intermediate entity, searched a relation the success did not, no answer, a repeat).
//!
//! With [`Induction::Episodic`] the successful rollout is kept as it was instead (its question
//! and searches): raw episodic memory, the baseline LLM-rewritten memory is measured against.
//!
//! Names are found without a tagger: runs of capitalised or numeric words (joined by "of",
//! "the", "and", … between two of them) and quoted phrases, as questions in English write
//! them. A skill that would still show the question's answer or one of its entities is not
//! made: it would be a leak, not a strategy.

use std::collections::{BTreeMap, BTreeSet};

use super::distill::{Distilled, FailureRecord};
use super::sanitize::{clean, limits};
use super::skill::SkillText;
use crate::data::metrics::{contains_answer, normalize_answer};

/// Lowercase words that may join two capitalised words into one name ("Bank of America").
/// Not "and": "Is X and Y …" names two things far more often than one.
const CONNECTORS: &[&str] = &["of", "the", "for", "de", "du", "von", "van", "la", "le", "&"];

/// Words that are capitalised only because they open the question.
const OPENERS: &[&str] = &[
    "which", "who", "whom", "whose", "what", "where", "when", "why", "how", "in", "on", "at", "from", "by", "for",
    "is", "was", "are", "were", "did", "does", "do", "the", "a", "an", "of", "to", "and", "or", "name", "as",
];

/// One whitespace-separated word: the punctuation around it and its core.
#[derive(Debug, Clone, Copy)]
struct Word<'a> {
    lead: &'a str,
    core: &'a str,
    trail: &'a str,
}

fn words(text: &str) -> Vec<Word<'_>> {
    let edge = |c: char| !c.is_alphanumeric() && c != '&';
    text.split_whitespace()
        .map(|token| {
            let core_start = token.find(|c: char| !edge(c)).unwrap_or(token.len());
            let core_end = token
                .rfind(|c: char| !edge(c))
                .map_or(core_start, |i| i + token[i..].chars().next().map_or(1, char::len_utf8));
            let core_end = core_end.max(core_start);
            Word { lead: &token[..core_start], core: &token[core_start..core_end], trail: &token[core_end..] }
        })
        .collect()
}

/// Whether a word looks like part of a name: a capital anywhere or a digit.
fn name_like(core: &str) -> bool {
    core.chars().any(|c| c.is_uppercase() || c.is_ascii_digit())
}

fn is_quote(s: &str) -> bool {
    s.contains(['"', '“', '”'])
}

/// The word ranges of `words` that name something, in order: quoted phrases whole, and runs of
/// capitalised words or words marked `known` (a name the searches showed, however the text
/// writes it), joined by a connector between two of them and ended by punctuation.
fn name_spans(words: &[Word<'_>], known: &[bool]) -> Vec<std::ops::Range<usize>> {
    let named = |i: usize| {
        let w = &words[i];
        let opener = i == 0 && OPENERS.contains(&w.core.to_lowercase().as_str());
        !w.core.is_empty() && (known.get(i).copied().unwrap_or(false) || (!opener && name_like(w.core)))
    };
    let mut spans = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let quoted = is_quote(words[i].lead).then(|| (i..words.len()).find(|&j| is_quote(words[j].trail))).flatten();
        if let Some(last) = quoted {
            spans.push(i..last + 1);
            i = last + 1;
            continue;
        }
        if !named(i) {
            i += 1;
            continue;
        }
        let start = i;
        loop {
            if ends_phrase(words[i].trail) || i + 1 == words.len() || is_quote(words[i + 1].lead) {
                break;
            }
            let joins = CONNECTORS.contains(&words[i + 1].core)
                && words[i + 1].trail.is_empty()
                && i + 2 < words.len()
                && named(i + 2);
            if named(i + 1) {
                i += 1;
            } else if joins {
                i += 2;
            } else {
                break;
            }
        }
        spans.push(start..i + 1);
        i += 1;
    }
    spans
}

fn ends_phrase(trail: &str) -> bool {
    !trail.is_empty() && !is_quote(trail)
}

/// The words of a span's core, lowercased, connectors left out.
fn key_words(words: &[Word<'_>], span: &std::ops::Range<usize>) -> Vec<String> {
    words[span.clone()]
        .iter()
        .map(|w| w.core.to_lowercase())
        .filter(|w| !w.is_empty() && !CONNECTORS.contains(&w.as_str()))
        .collect()
}

/// A question read for induction: its entities and its masked pattern.
struct Pattern {
    /// Each entity's words, lowercased (connectors left out).
    entities: Vec<Vec<String>>,
    /// The entity texts as written, for the leak check.
    entity_texts: Vec<String>,
    /// The question with each entity replaced by its slot.
    masked: String,
}

/// `question` with its named entities masked as a rule-based skill's trigger masks them: what
/// `memory.retrieve_by: pattern` compares with triggers.
pub fn question_pattern(question: &str) -> String {
    pattern(question, &[]).masked
}

impl Pattern {
    /// Whether `answer` is one of the question's entities, as answers are compared.
    fn named(&self, answer: &str) -> bool {
        let answer = normalize_answer(answer);
        !answer.is_empty() && self.entity_texts.iter().any(|t| normalize_answer(t) == answer)
    }
}

fn entity_slot(k: usize, of: usize) -> String {
    if of == 1 { "<entity>".to_string() } else { format!("<entity {}>", k + 1) }
}

/// The slot of what the `position`-th search (0-based) found, in a later search's template.
fn result_slot(position: usize) -> String {
    format!("<result {position}>")
}

/// Between the searches of a query template.
const THEN: &str = " → ";

/// `question` read against the searches made for it: a name a search wrote capitalised is a
/// name in the question too, however the question writes it.
fn pattern(question: &str, searches: &[String]) -> Pattern {
    let lower = |words: &[Word<'_>]| words.iter().map(|w| w.core.to_lowercase()).collect::<Vec<_>>();
    let words = words(question);
    let question_lower = lower(&words);
    let mut names_searched: BTreeSet<Vec<String>> = BTreeSet::new();
    for query in searches {
        let query_words = self::words(query);
        names_searched.extend(name_spans(&query_words, &[]).into_iter().map(|span| lower(&query_words[span])));
        // A search that is a short phrase of the question, with a capital in it, is a name the
        // question writes in lowercase in part ("Le roi malgré lui").
        if query_words.iter().any(|w| name_like(w.core)) && query_words.len() * 2 <= words.len() {
            names_searched.insert(lower(&query_words));
        }
    }
    let mut known = vec![false; words.len()];
    for name in names_searched.iter().filter(|n| !n.is_empty()) {
        for start in 0..words.len().saturating_sub(name.len() - 1) {
            if question_lower[start..start + name.len()] == name[..] {
                known[start..start + name.len()].iter_mut().for_each(|k| *k = true);
            }
        }
    }
    let spans = name_spans(&words, &known);
    let mut entities: Vec<Vec<String>> = Vec::new();
    let mut entity_texts = Vec::new();
    let mut slot_of_span = Vec::new();
    for span in &spans {
        let key = key_words(&words, span);
        let k = entities.iter().position(|e| *e == key).unwrap_or_else(|| {
            entities.push(key);
            entity_texts.push(words[span.clone()].iter().map(|w| w.core).collect::<Vec<_>>().join(" "));
            entities.len() - 1
        });
        slot_of_span.push(k);
    }
    let n = entities.len();
    let masked = rebuild(&words, spans.iter().zip(&slot_of_span).map(|(s, &k)| (s.clone(), entity_slot(k, n))));
    Pattern { entities, entity_texts, masked }
}

/// `words` joined by spaces with each span replaced by its slot (the punctuation before its
/// first word and after its last kept).
fn rebuild(words: &[Word<'_>], slots: impl Iterator<Item = (std::ops::Range<usize>, String)>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut next = 0;
    for (span, slot) in slots {
        out.extend(words[next..span.start].iter().map(|w| format!("{}{}{}", w.lead, w.core, w.trail)));
        let (first, last) = (words[span.start], words[span.end - 1]);
        let lead = if is_quote(first.lead) { "" } else { first.lead };
        let trail = if is_quote(last.trail) { last.trail.trim_start_matches(['"', '“', '”']) } else { last.trail };
        out.push(format!("{lead}{slot}{trail}"));
        next = span.end;
    }
    out.extend(words[next..].iter().map(|w| format!("{}{}{}", w.lead, w.core, w.trail)));
    out.join(" ")
}

/// What a word of a search query is, for masking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueryWord {
    Kept,
    /// A word of the question's entity `k`.
    Entity(usize),
    /// A name that is not the question's: found by an earlier search (or the answer).
    Found,
}

/// A search query with every entity replaced by a slot: the question's by its `<entity …>`,
/// other names (and the words of `answers`) by `<result k>` when an earlier search `k` could
/// have found them, else by `<entity>`. `position` is the query's 0-based place in its rollout.
fn mask_query(query: &str, pattern: &Pattern, answers: &BTreeSet<String>, position: usize) -> String {
    let words = words(query);
    let named: BTreeSet<usize> = name_spans(&words, &[]).into_iter().flatten().collect();
    let mut kinds: Vec<QueryWord> = words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let lower = w.core.to_lowercase();
            if CONNECTORS.contains(&lower.as_str()) {
                QueryWord::Kept
            } else if let Some(k) = pattern.entities.iter().position(|e| e.contains(&lower)) {
                QueryWord::Entity(k)
            } else if named.contains(&i) || answers.contains(&normalize_answer(w.core)) {
                QueryWord::Found
            } else {
                QueryWord::Kept
            }
        })
        .collect();
    // A connector between two words of one name is part of it ("Goat on the Roof"), and so is
    // a capitalised one that opens it ("The Seventh Orchard").
    for i in 0..words.len().saturating_sub(1) {
        let connector = CONNECTORS.contains(&words[i].core.to_lowercase().as_str());
        let (before, after) = (i.checked_sub(1).map(|b| kinds[b]), kinds[i + 1]);
        let inside = before.is_some_and(|b| b != QueryWord::Kept && b == after);
        let opens = name_like(words[i].core) && after != QueryWord::Kept;
        if connector && kinds[i] == QueryWord::Kept && (inside || opens) {
            kinds[i] = after;
        }
    }
    let n = pattern.entities.len();
    let mut slots = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if kinds[i] == QueryWord::Kept {
            i += 1;
            continue;
        }
        let start = i;
        while i + 1 < words.len() && kinds[i + 1] == kinds[start] {
            i += 1;
        }
        let slot = match kinds[start] {
            QueryWord::Entity(k) if n > 0 => entity_slot(k, n),
            _ if position > 0 => result_slot(position),
            _ => "<entity>".to_string(),
        };
        slots.push((start..i + 1, slot));
        i += 1;
    }
    rebuild(&words, slots.into_iter())
}

/// The normalised words of the answers a skill must not hold: the target's, and the names in
/// what the failures answered (often an intermediate entity; a failure that answered with a
/// query, "Orla birthplace", must not mask the relation word of every search), articles and
/// connectors left out.
fn answer_words(records: &[&FailureRecord]) -> BTreeSet<String> {
    let names = |answer: &str| -> Vec<String> {
        words(answer).iter().filter(|w| name_like(w.core)).map(|w| normalize_answer(w.core)).collect()
    };
    records
        .iter()
        .flat_map(|r| {
            let target = normalize_answer(&r.target).split_whitespace().map(str::to_string).collect::<Vec<_>>();
            target.into_iter().chain(r.predicted.as_deref().map(names).unwrap_or_default())
        })
        .filter(|w| !w.is_empty() && !CONNECTORS.contains(&w.as_str()) && !OPENERS.contains(&w.as_str()))
        .collect()
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 { format!("1 {one}") } else { format!("{n} {one}es") }
}

/// Where each failure went wrong against the successful searches `solved` (masked), most
/// frequent first, at most three.
fn pitfalls(
    failures: &[&FailureRecord],
    pattern: &Pattern,
    answers: &BTreeSet<String>,
    solved: &[String],
) -> Vec<String> {
    let n = solved.len();
    let mut counted: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut note = |order: usize, text: String| {
        let entry = counted.entry(text).or_insert((0, order));
        entry.0 += 1;
    };
    for failure in failures {
        let k = failure.searches.len();
        let masked: Vec<String> =
            failure.searches.iter().enumerate().map(|(i, q)| mask_query(q, pattern, answers, i)).collect();
        if k < n {
            note(0, format!("Stopping after {}: this question needs {n}.", plural(k, "search")));
        }
        match failure.predicted.as_deref() {
            None => note(3, "Ending without an answer: answer with what the last search found.".to_string()),
            Some(predicted) => {
                let named = pattern.named(predicted);
                let found_at = failure
                    .solved_searches
                    .iter()
                    .enumerate()
                    .skip(1)
                    .find(|(_, q)| !named && contains_answer(q, predicted));
                if let Some((j, _)) = found_at {
                    note(
                        1,
                        format!(
                            "Answering with <result {j}>, an intermediate entity, instead of searching on from it."
                        ),
                    );
                } else if named && !pattern.named(&failure.target) {
                    // (A comparison's answer is one of the question's entities.)
                    note(1, "Answering with an entity named in the question.".to_string());
                }
            }
        }
        for (i, query) in masked.iter().enumerate() {
            if !solved.contains(query)
                && let Some(right) = solved.get(i)
                && right != query
            {
                note(2, format!("Searching \"{query}\" where \"{right}\" was needed."));
                break;
            }
        }
        let distinct: BTreeSet<&str> = failure.searches.iter().map(|q| q.trim()).collect();
        if distinct.len() < k {
            note(4, "Repeating a search: a query that found nothing will not find it the second time.".to_string());
        }
    }
    let mut ranked: Vec<(String, (usize, usize))> = counted.into_iter().collect();
    ranked.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
    ranked.into_iter().take(limits::AVOID_ITEMS).map(|(text, _)| text).collect()
}

/// How a question's group becomes a skill without a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Induction {
    /// The pattern, the masked chain and the pitfalls ([`induce`]'s rules).
    Rules,
    /// The successful rollout itself, unabstracted: the question as its trigger and its
    /// searches as written (episodic memory, a baseline the paper does not have).
    Episodic,
}

/// The skill one question's failures teach, against a successful rollout's searches (every
/// record of a group carries the same `solved_searches`). `None` when no rollout of the question
/// succeeded with a search, or when the skill would still name the target (or, by rules, an
/// entity of the question).
pub fn induce(failures: &[&FailureRecord], how: Induction) -> Option<SkillText> {
    let first = failures.first()?;
    let solved_raw = &first.solved_searches;
    if solved_raw.is_empty() {
        return None;
    }
    let (skill, entities) = match how {
        Induction::Rules => {
            let searched: Vec<String> =
                failures.iter().flat_map(|f| f.searches.iter()).chain(solved_raw).cloned().collect();
            let pattern = pattern(&first.question, &searched);
            (by_rules(failures, &pattern), pattern.entity_texts)
        }
        Induction::Episodic => (exemplar(&first.question, solved_raw), Vec::new()),
    };
    let skill = skill.sanitized()?;
    let rendered = skill.render();
    let leaks = failures.iter().map(|f| f.target.as_str()).chain(entities.iter().map(String::as_str));
    let leaked = leaks.into_iter().any(|name| contains_answer(&rendered, name));
    (!leaked).then_some(skill)
}

fn by_rules(failures: &[&FailureRecord], pattern: &Pattern) -> SkillText {
    let answers = answer_words(failures);
    let mut solved: Vec<String> =
        failures[0].solved_searches.iter().enumerate().map(|(i, q)| mask_query(q, pattern, &answers, i)).collect();
    solved.dedup();
    let n = solved.len();
    let steps = solved.iter().map(|q| format!("\"{q}\"")).collect::<Vec<_>>().join(", then ");
    let description = if n == 1 {
        format!("One search answers this: {steps}; answer with what it finds.")
    } else {
        format!("Search one hop at a time, {}: {steps}; answer with what the last one finds.", plural(n, "search"))
    };
    SkillText {
        description: clean(&description, limits::DESCRIPTION),
        trigger: clean(&pattern.masked, limits::TRIGGER),
        avoid: pitfalls(failures, pattern, &answers, &solved),
        query_template: clean(&solved.join(THEN), limits::QUERY_TEMPLATE),
    }
}

/// Rule-induced skills read back as question templates, to compose the chain a question's
/// plan follows: the entity it starts from and the relation each search asks for, in order.
///
/// Each skill whose trigger holds one `<entity>` and whose query template reads one search a
/// hop ("<entity> author → <result 1> birthplace", as [`induce`] writes the searches of a solver
/// that searched one hop at a time) is a *template*: the question's words around the entity,
/// and the chain from it. Two templates that differ by words wrapped around the entity and by
/// the relations before the shorter one's chain ("In which city was <entity> born?": birthplace;
/// "In which city was the author of <entity> born?": author, birthplace) teach a *wrapper*:
/// "the author of <entity>" adds the relation author. A question is read as a template whose
/// entity is the question's own name inside any number of known wrappers, innermost relation
/// first: a deeper question than any skill was induced from gets a chain when its parts were
/// seen.
pub struct ChainReader<'a> {
    templates: Vec<Template<'a>>,
    wrappers: Vec<Wrapper>,
}

impl<'a> ChainReader<'a> {
    /// The templates of `skills` and every wrapper they teach.
    pub fn new(skills: &[&'a SkillText]) -> ChainReader<'a> {
        let templates: Vec<Template<'a>> = skills.iter().enumerate().filter_map(|(i, s)| Template::of(i, s)).collect();
        let wrappers = wrappers(&templates);
        ChainReader { templates, wrappers }
    }

    /// `question`'s chain, with the indices of the skills it was read from; `None` when no
    /// template and known wrappers leave the question's one name at the centre.
    pub fn read(&self, question: &str) -> Option<ComposedChain> {
        // The question's one name, as its pattern masks it: alone, "The Hollow Winter" would
        // read its article as the question's opening word.
        let names = pattern(question, &[]).entity_texts;
        let [name] = names.as_slice() else {
            return None;
        };
        let mut best: Option<(usize, ComposedChain)> = None;
        for template in &self.templates {
            let Some(mut subject) =
                question.strip_prefix(template.prefix).and_then(|rest| rest.strip_suffix(template.suffix))
            else {
                continue;
            };
            let (mut peeled, mut used) = (Vec::new(), vec![template.skill]);
            // The longest wrapper first: "the city where <entity> was born" before "the … of".
            while let Some(wrapper) = self
                .wrappers
                .iter()
                .filter(|w| {
                    subject.len() > w.prefix.len() + w.suffix.len()
                        && subject.starts_with(&w.prefix)
                        && subject.ends_with(&w.suffix)
                })
                .max_by_key(|w| w.prefix.len() + w.suffix.len())
            {
                subject = &subject[wrapper.prefix.len()..subject.len() - wrapper.suffix.len()];
                peeled.push(wrapper.relation.clone());
                used.extend(&wrapper.skills);
            }
            // The template that needs the fewest wrappers: a skill of the question's own
            // pattern reads it as it was induced.
            if subject != name || best.as_ref().is_some_and(|(wrapped, _)| *wrapped <= peeled.len()) {
                continue;
            }
            let wrapped = peeled.len();
            peeled.reverse();
            peeled.extend(template.relations.iter().cloned());
            used.sort_unstable();
            used.dedup();
            best = Some((wrapped, ComposedChain { start: subject.to_string(), relations: peeled, skills: used }));
        }
        best.map(|(_, composed)| composed)
    }
}

/// What [`ChainReader::read`] reads: where a question's chain starts, the relations it
/// follows, and the skills it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposedChain {
    /// The question's entity, as the question writes it.
    pub start: String,
    /// The relation of each search, first to last.
    pub relations: Vec<String>,
    /// The indices of the skills it was read from (its template and its wrappers' teachers).
    pub skills: Vec<usize>,
}

/// A skill read as a question template (see [`ChainReader`]).
struct Template<'a> {
    skill: usize,
    prefix: &'a str,
    suffix: &'a str,
    relations: Vec<String>,
}

impl<'a> Template<'a> {
    fn of(skill: usize, text: &'a SkillText) -> Option<Template<'a>> {
        let entity = entity_slot(0, 1);
        let (prefix, suffix) = text.trigger.split_once(&entity)?;
        if prefix.contains('<') || suffix.contains('<') {
            return None;
        }
        let relations = text
            .query_template
            .split(THEN)
            .enumerate()
            .map(|(k, step)| {
                let slot = if k == 0 { entity.clone() } else { result_slot(k) };
                let relation = step.strip_prefix(&slot)?.strip_prefix(' ')?.trim();
                (!relation.is_empty() && !relation.contains(['<', '>', '"'])).then(|| relation.to_string())
            })
            .collect::<Option<Vec<String>>>()?;
        Some(Template { skill, prefix, suffix, relations })
    }
}

/// Words around an entity that add one relation before a template's chain.
struct Wrapper {
    prefix: String,
    suffix: String,
    relation: String,
    /// The two templates it was learnt from.
    skills: [usize; 2],
}

/// Every wrapper two templates teach, until no pair teaches another: a pair whose longer
/// template adds several relations teaches the innermost once the outer ones are known.
fn wrappers(templates: &[Template<'_>]) -> Vec<Wrapper> {
    let mut wrappers: Vec<Wrapper> = Vec::new();
    loop {
        let mut learned = false;
        for (outer, inner) in templates.iter().flat_map(|a| templates.iter().map(move |b| (a, b))) {
            let extra = inner.relations.len().saturating_sub(outer.relations.len());
            if extra == 0 || !inner.relations.ends_with(&outer.relations) {
                continue;
            }
            let (Some(mut prefix), Some(mut suffix)) =
                (inner.prefix.strip_prefix(outer.prefix), inner.suffix.strip_suffix(outer.suffix))
            else {
                continue;
            };
            // Known wrappers are taken off either end: the outermost adds the last relation,
            // the innermost the first.
            let mut added = &inner.relations[..extra];
            while added.len() > 1 {
                let fits = |w: &&Wrapper| prefix.len() + suffix.len() > w.prefix.len() + w.suffix.len();
                let (first, last) = (&added[0], &added[added.len() - 1]);
                if let Some(w) = wrappers
                    .iter()
                    .filter(fits)
                    .find(|w| &w.relation == last && prefix.starts_with(&w.prefix) && suffix.ends_with(&w.suffix))
                {
                    prefix = &prefix[w.prefix.len()..];
                    suffix = &suffix[..suffix.len() - w.suffix.len()];
                    added = &added[..added.len() - 1];
                } else if let Some(w) = wrappers
                    .iter()
                    .filter(fits)
                    .find(|w| &w.relation == first && prefix.ends_with(&w.prefix) && suffix.starts_with(&w.suffix))
                {
                    prefix = &prefix[..prefix.len() - w.prefix.len()];
                    suffix = &suffix[w.suffix.len()..];
                    added = &added[1..];
                } else {
                    break;
                }
            }
            if let [relation] = added
                && !(prefix.is_empty() && suffix.is_empty())
                && !wrappers.iter().any(|w| w.prefix == prefix && w.suffix == suffix)
            {
                wrappers.push(Wrapper {
                    prefix: prefix.to_string(),
                    suffix: suffix.to_string(),
                    relation: relation.clone(),
                    skills: [outer.skill, inner.skill],
                });
                learned = true;
            }
        }
        if !learned {
            return wrappers;
        }
    }
}

fn exemplar(question: &str, searches: &[String]) -> SkillText {
    let steps = searches.iter().map(|q| format!("\"{q}\"")).collect::<Vec<_>>().join(", then ");
    SkillText {
        description: clean(
            &format!(
                "A similar question was solved by searching {steps}, then answering with what the last search found."
            ),
            limits::DESCRIPTION,
        ),
        trigger: clean(question, limits::TRIGGER),
        avoid: Vec::new(),
        query_template: clean(&searches.join(THEN), limits::QUERY_TEMPLATE),
    }
}

/// Skills from a batch of failure records: one per question (in first-seen order), at most
/// `max_skills`; a question no skill could be made for is reported in `malformed`.
pub fn induce_batch(batch: &[FailureRecord], max_skills: usize, how: Induction) -> Distilled {
    let mut questions: Vec<&str> = Vec::new();
    for record in batch {
        if !questions.contains(&record.question.as_str()) {
            questions.push(&record.question);
        }
    }
    let mut out = Distilled::default();
    for question in questions {
        if out.candidates.len() == max_skills {
            break;
        }
        let group: Vec<&FailureRecord> = batch.iter().filter(|r| r.question == question).collect();
        match induce(&group, how) {
            Some(skill) => out.candidates.push(skill),
            None if group[0].solved_searches.is_empty() => {
                out.malformed.push(format!("{:?}: no successful rollout with a search to learn from", group[0].id))
            }
            None => out.malformed.push(format!("{:?}: the skill would name the answer or an entity", group[0].id)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
