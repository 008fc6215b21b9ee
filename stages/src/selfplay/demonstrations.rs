//! Demonstrations for the supervised warm start: trajectories written, not sampled, in the
//! exact layout the agent loop produces (the same prompt templates, the same `<information>`
//! blocks from the same search tool, the same token mask), so a warm-started model sees what
//! it will see in the loop.
//!
//! From a generated world's question with its supporting chain `t₁ … tₙ` and answer `a`:
//! - the solver thinks, then searches each hop's entity with the relation it needs
//!   (`tᵢ rᵢ`, with the relations the world records), in reading order, reads the real results
//!   and answers `a`; kept only when each search returns its hop's passage;
//! - the proposer, given `a` and `n`, walks back from the answer: it searches `a` and reads,
//!   among the passages found, one that states `a` (some `sₙ`), then searches `sₙ` and reads
//!   one that names it (`sₙ₋₁`), and so on for `n` steps, then writes the question that
//!   composes the chain `s₁ … sₙ` ([`WalkBack`]). In a generated world the walk goes wherever
//!   the search results lead (the world's facts say which passage names what), trying the
//!   passages best first, depth first, until a chain's question passes the validity rules;
//!   without the world it must find the question's own chain `tₙ … t₁` or is dropped, which a
//!   walk from a common answer (a country, a year) rarely does. When the rules ask for more
//!   searches than there are hops (SSP's two for a one-hop question), it then confirms the
//!   chain from its start, `s₁ r₁`, `s₂ r₂`, … as the solver would search it.
//!
//! A user's own demonstrations are rows in the `rollouts` (or `proposals`) table's layout:
//! `prompt_ids`, `token_ids` and `loss_mask`, from JSONL or Parquet.

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;

use super::rules::ValidityRules;
use crate::agent::{PromptTemplate, Role, information_block};
use crate::data::datasets::Question;
use crate::data::world::World;
use crate::memory::{FailureRecord, Induction, Skill, SkillMeta, induce, prompt_block};
use crate::search::{Search, format_results};
use sesa_engine::columns::Reader;
use sesa_models::policy::Policy;
use sesa_models::train::TrainSequence;

/// A demonstration: its role, its text and its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Demonstration {
    /// `solver` or `proposer`.
    pub role: &'static str,
    /// Hops of the question it was written from (0 for a user's).
    pub hops: u8,
    /// The tokens to train on.
    pub sequence: TrainSequence,
}

impl Demonstration {
    /// The role whose policy learns from it: a user's demonstrations are solver rollouts.
    pub fn played_by(&self) -> Role {
        if self.role == "proposer" { Role::Proposer } else { Role::Solver }
    }
}

/// The searches that walk `question`'s supporting chain, one per hop: each entity with the
/// relation the hop needs ("Orla country"), or its title alone where the dataset names no
/// relation.
pub fn chain_searches(question: &Question) -> Vec<String> {
    let relations = &question.supporting_relations;
    question
        .supporting_titles
        .iter()
        .enumerate()
        .map(|(hop, title)| relations.get(hop).map_or_else(|| title.clone(), |r| format!("{title} {r}")))
        .collect()
}

/// Where a proposer's walk back from an answer can go: which passage a search's results lead
/// to, and the question a finished chain makes.
pub trait WalkBack: Sync {
    /// Among `found` (the titles a search returned, best first), the passages that state
    /// `object` and may stand `from_end` hops before the answer (0: the last hop), never one
    /// of `walked`, in the same order; each with the relation by which it states `object`,
    /// when known.
    fn steps(
        &self,
        found: &[String],
        object: &str,
        from_end: usize,
        walked: &[String],
    ) -> Vec<(String, Option<String>)>;

    /// The question of a chain, `titles` and their `relations` in reading order, whose answer
    /// is `answer`.
    fn question(&self, titles: &[String], relations: &[String], answer: &str) -> Option<String>;
}

/// A question walks back along its own chain only.
impl WalkBack for Question {
    fn steps(&self, found: &[String], _: &str, from_end: usize, _: &[String]) -> Vec<(String, Option<String>)> {
        let Some(hop) = self.supporting_titles.len().checked_sub(from_end + 1) else { return Vec::new() };
        let title = &self.supporting_titles[hop];
        found
            .contains(title)
            .then(|| (title.clone(), self.supporting_relations.get(hop).cloned()))
            .into_iter()
            .collect()
    }

    fn question(&self, titles: &[String], _: &[String], _: &str) -> Option<String> {
        (titles == self.supporting_titles).then(|| self.question.clone())
    }
}

/// A generated world walks back to any passage found that states what the walk came from,
/// and writes the question as it writes its own, when its facts lead from the chain's start to
/// the answer.
impl WalkBack for World {
    fn steps(
        &self,
        found: &[String],
        object: &str,
        from_end: usize,
        walked: &[String],
    ) -> Vec<(String, Option<String>)> {
        found
            .iter()
            .filter(|title| !walked.contains(title))
            .filter_map(|title| {
                let relation = self.relation_naming(title, object, from_end > 0)?;
                Some((title.clone(), Some(relation.to_string())))
            })
            .collect()
    }

    fn question(&self, titles: &[String], relations: &[String], answer: &str) -> Option<String> {
        let (start, relations) = (titles.first()?, relations.iter().map(String::as_str).collect::<Vec<_>>());
        (self.follow(start, &relations)? == answer).then(|| World::compose_question(start, &relations))?
    }
}

/// How many solver demonstrations show a skill in their prompt, as the solver will see skills
/// in self-play; the rest show none.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillShare {
    /// The share shown a skill that fits (induced from another question of the same chain of
    /// relations), which the demonstration follows.
    pub relevant: f64,
    /// The share shown a skill of another chain, which the demonstration ignores.
    pub irrelevant: f64,
}

impl SkillShare {
    /// What is wrong with the shares, if anything.
    pub fn problem(&self) -> Option<&'static str> {
        let valid = |x: f64| (0.0..=1.0).contains(&x);
        let ok = valid(self.relevant) && valid(self.irrelevant) && self.relevant + self.irrelevant <= 1.0;
        (!ok).then_some("two shares between 0 and 1 whose sum is at most 1")
    }
}

/// The skill block of each question's solver demonstration, in `questions`' order: a skill
/// induced by rules (`memory::induce`) from another question with the same relations, one from
/// a question with other relations, or none, in the proportions of `share`. The choice is a
/// fixed low-discrepancy sequence over positions, so the same questions get the same blocks.
/// A skill is made as self-play would make it: from a failure that stopped after one search
/// (answering with the first hop's entity) against the question's whole chain.
pub fn demonstration_skills(questions: &[&Question], share: &SkillShare) -> Vec<String> {
    let chain = |q: &Question| q.supporting_relations.join("/");
    let skill_of = |q: &Question| {
        let searches = chain_searches(q);
        let record = FailureRecord {
            id: q.id.clone(),
            question: q.question.clone(),
            target: q.golden_answers.first().cloned().unwrap_or_default(),
            predicted: q.supporting_titles.get(1).cloned(),
            skill_ids: Vec::new(),
            digest: String::new(),
            searches: searches.iter().take(1).cloned().collect(),
            solved_searches: searches,
        };
        let text = induce(&[&record], Induction::Rules)?;
        Some(Skill { id: format!("demo-{}", q.id), text, meta: SkillMeta::default() })
    };
    let n = questions.len();
    (0..n)
        .map(|i| {
            // The golden ratio's multiples modulo 1 spread any share evenly over positions.
            let u = ((i + 1) as f64 * 0.618_033_988_749_895).fract();
            let same = u < share.relevant;
            if !same && u >= share.relevant + share.irrelevant {
                return String::new();
            }
            let other = (1..n)
                .map(|d| questions[(i + d) % n])
                .find(|q| (chain(q) == chain(questions[i])) == same && !q.supporting_relations.is_empty());
            other.and_then(skill_of).map_or_else(String::new, |skill| prompt_block(&[&skill]))
        })
        .collect()
}

/// What a solver demonstration's thoughts say before each search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SolverThoughts {
    /// The whole chain at the first search ("I need the birthplace of Orla, then the country
    /// of it."), then the fact each search read and the next hop ("The birthplace of Orla is
    /// Mibri. Next, the country of Mibri."). The plans that `solve.guidance: plan` writes
    /// are in this form.
    #[default]
    Plan,
    /// The question that remains before each search, the entity found last in place of the
    /// hops it resolved ("Now: In which country is the city where Orla was born?", then "Now:
    /// In which country is Mibri?"): every step reads a question one hop shorter than the
    /// last, so a question deeper than any demonstration is a chain of steps each seen in
    /// them (least-to-most decomposition). Questions the world's grammar does not write (a
    /// dataset's own) keep the plan.
    Remaining,
}

/// How a [`SolverThoughts::Remaining`] thought opens.
pub const REMAINING: &str = "Now:";

/// How a demonstration's thought goes on to the next hop ("Next, the country of Dunmere."),
/// which guidance writes where a solver closes its thought instead.
pub const NEXT_HOP: &str = "Next, the";

/// The first thought of a solver's demonstration: the whole chain from `start` at once ("I
/// need the birthplace of Orla, then the country of it."), so that how many searches remain is
/// written where later turns can read it rather than only in the question.
pub fn plan_thought(start: &str, relations: &[impl AsRef<str>]) -> String {
    let mut relations = relations.iter().map(AsRef::as_ref);
    let first = relations.next().unwrap_or_default();
    let then: String = relations.map(|r| format!(", then the {r} of it")).collect();
    format!("I need the {first} of {start}{then}.")
}

/// The question that remains before each hop of `question`'s chain, in the world's grammar
/// (the first is the question itself), or `None` when the grammar does not write the question
/// from its chain.
fn remaining_questions(question: &Question) -> Option<Vec<String>> {
    let (titles, relations) = (&question.supporting_titles, &question.supporting_relations);
    if relations.len() != titles.len() {
        return None;
    }
    let relations: Vec<&str> = relations.iter().map(String::as_str).collect();
    let remaining: Vec<String> =
        (0..titles.len()).map(|hop| World::compose_question(&titles[hop], &relations[hop..])).collect::<Option<_>>()?;
    (remaining.first() == Some(&question.question)).then_some(remaining)
}

/// A fact as the demonstrations' thoughts state it: "The country of Orla is Veltria." when
/// the relation is known, "Orla leads to Veltria." when it is not.
fn fact(subject: &str, relation: Option<&str>, object: &str) -> String {
    match relation {
        Some(relation) => format!("The {relation} of {subject} is {object}."),
        None => format!("{subject} leads to {object}."),
    }
}

/// What writing demonstrations needs from the run.
pub struct Writer<'a> {
    /// The policy (its chat template and tokenizer).
    pub policy: &'a dyn Policy,
    /// The search tool.
    pub search: &'a dyn Search,
    /// Passages per search.
    pub top_k: usize,
}

/// One turn of a written trajectory: the model's text, then what the search tool answered.
struct WrittenTurn {
    text: String,
    information: Option<String>,
}

impl Writer<'_> {
    /// The tokens of a prompt followed by `turns`: the model's text trained on, the
    /// `<information>` blocks and the prompt not.
    async fn sequence(&self, prompt: &str, turns: &[WrittenTurn]) -> Result<Option<TrainSequence>, String> {
        let mut tokens = Vec::new();
        let mut mask = Vec::new();
        let mut push = async |text: &str, trained: u8| -> Result<bool, String> {
            match self.policy.tokenize(text).await.map_err(|e| e.to_string())? {
                Some(ids) => {
                    mask.extend(std::iter::repeat_n(trained, ids.len()));
                    tokens.extend(ids);
                    Ok(true)
                }
                None => Ok(false),
            }
        };
        if !push(prompt, 0).await? {
            return Err(format!("policy `{}` gives no token ids: it cannot be trained in process", self.policy.name()));
        }
        for turn in turns {
            push(&turn.text, 1).await?;
            if let Some(information) = &turn.information {
                push(information, 0).await?;
            }
        }
        Ok(Some(TrainSequence::new(tokens, mask)))
    }

    /// The `<information>` block of `query` and the titles of its passages, best first.
    async fn search(&self, query: &str) -> Result<(String, Vec<String>), String> {
        let hits = self.search.search(&[query.to_string()], self.top_k).await.map_err(|e| e.to_string())?;
        let hits = hits.into_iter().next().unwrap_or_default();
        let titles = hits.iter().map(|h| h.doc.title.clone()).collect();
        Ok((information_block(&format_results(std::slice::from_ref(&hits))), titles))
    }

    /// The solver's demonstration of `question` with the skill block `skills` in its prompt
    /// (empty: none), or `None` when a search misses its hop.
    ///
    /// Each hop thinks first, then searches the entity with the relation ("Orla country", as the
    /// small solver prompt's example does). The first thought lays out the whole chain ("I need
    /// the birthplace of X, then the country of it."), so that how many searches remain is
    /// written where later turns can read it rather than only in the question; later thoughts
    /// state what the hop before found and what comes next; the last states the fact read, and
    /// the turn answers. Without `supporting_relations` (a dataset that names only titles) the
    /// searches name the titles alone.
    pub async fn solver(
        &self,
        template: &PromptTemplate,
        question: &Question,
        skills: &str,
        thoughts: SolverThoughts,
    ) -> Result<Option<Demonstration>, String> {
        let Some(answer) = question.golden_answers.first() else { return Ok(None) };
        let titles = &question.supporting_titles;
        if titles.is_empty() {
            return Ok(None);
        }
        let remaining = match thoughts {
            SolverThoughts::Remaining => remaining_questions(question),
            SolverThoughts::Plan => None,
        };
        let relation = |hop: usize| question.supporting_relations.get(hop);
        let fact_at = |hop: usize, object: &str| fact(&titles[hop], relation(hop).map(String::as_str), object);
        let prompt = self.policy.render_chat(
            &template
                .render(&BTreeMap::from([("question", question.question.clone()), ("skills", skills.to_string())])),
        );
        let mut turns = Vec::new();
        let relations = &question.supporting_relations;
        let queries = chain_searches(question);
        for ((hop, title), query) in titles.iter().enumerate().zip(queries) {
            let need = match (&remaining, relation(hop)) {
                (Some(remaining), _) => format!("{REMAINING} {}", remaining[hop]),
                (None, Some(_)) if hop == 0 => plan_thought(title, relations),
                (None, Some(relation)) => format!("{NEXT_HOP} {relation} of {title}."),
                (None, None) => format!("I need to read about {title}."),
            };
            // The remaining question names what the last search found.
            let found = if hop == 0 || remaining.is_some() { String::new() } else { fact_at(hop - 1, title) + " " };
            let (information, hits) = self.search(&query).await?;
            if !hits.contains(title) {
                return Ok(None);
            }
            turns.push(WrittenTurn {
                text: format!("<think>{found}{need}</think>\n<search>{query}</search>"),
                information: Some(information),
            });
        }
        let read = fact_at(titles.len() - 1, answer);
        turns
            .push(WrittenTurn { text: format!("<think>{read}</think>\n<answer>{answer}</answer>"), information: None });
        Ok(self.sequence(&prompt, &turns).await?.map(|sequence| Demonstration {
            role: "solver",
            hops: question.hops.unwrap_or(0),
            sequence,
        }))
    }

    /// The proposer's demonstration for the target `answer` at `hops` hops, walked back by
    /// `walk`, or `None` when no walk reaches `hops` passages with a question that passes
    /// `rules`. The walk is depth first over the passages each search finds, best first: the
    /// first chain whose question passes is written (a world's questions differ in length, and
    /// SSP's ten words turn many short ones away).
    ///
    /// With `facts`, each search after the first opens with a thought that states the fact the
    /// search before it read ("The birthplace of Orla Veltri is Mibri."), and the question's turn
    /// with the last one: the chain's relations are written down, one at a time, where composing
    /// the question can read them, instead of only in the passages.
    pub async fn proposer(
        &self,
        template: &PromptTemplate,
        rules: &ValidityRules,
        answer: &str,
        hops: usize,
        walk: &dyn WalkBack,
        facts: bool,
    ) -> Result<Option<Demonstration>, String> {
        let mut searched = Searched::default();
        // A partial walk: the answer, then each passage reached; the relation of each step.
        let mut stack: Vec<(Vec<String>, Vec<Option<String>>)> = vec![(vec![answer.to_string()], Vec::new())];
        while let Some((walked, relations)) = stack.pop() {
            if relations.len() == hops {
                if let Some(demo) = self.walked(template, rules, &walked, relations, walk, facts, &mut searched).await?
                {
                    return Ok(Some(demo));
                }
                continue;
            }
            let query = walked.last().expect("the answer at least");
            let (_, found) = searched.get(self, query).await?;
            let next = walk.steps(&found, query, relations.len(), &walked);
            for (title, relation) in next.into_iter().rev() {
                let (mut walked, mut relations) = (walked.clone(), relations.clone());
                walked.push(title);
                relations.push(relation);
                stack.push((walked, relations));
            }
        }
        Ok(None)
    }

    /// The demonstration of a finished walk (`walked`: the answer, then the passages reached;
    /// `relations[k]`: how `walked[k + 1]` states `walked[k]`), or `None` when its question
    /// breaks `rules`.
    #[allow(clippy::too_many_arguments)]
    async fn walked(
        &self,
        template: &PromptTemplate,
        rules: &ValidityRules,
        walked: &[String],
        relations: Vec<Option<String>>,
        walk: &dyn WalkBack,
        facts: bool,
        searched: &mut Searched,
    ) -> Result<Option<Demonstration>, String> {
        let (answer, reached) = walked.split_first().expect("the answer at least");
        let hops = reached.len();
        // What the k-th search read: the passage it reached and how that passage states what
        // was searched, in the solver's words for a fact.
        let read: Vec<String> = (0..hops).map(|k| fact(&walked[k + 1], relations[k].as_deref(), &walked[k])).collect();
        let titles: Vec<String> = reached.iter().rev().cloned().collect();
        // A chain whose relations are unknown (a dataset that names only titles) keeps none.
        let relations: Vec<String> = relations.into_iter().rev().collect::<Option<_>>().unwrap_or_default();
        let Some(text) = walk.question(&titles, &relations, answer) else { return Ok(None) };
        let chain = Question {
            id: String::new(),
            question: text,
            golden_answers: vec![answer.clone()],
            hops: u8::try_from(hops).ok(),
            supporting_titles: titles,
            supporting_relations: relations,
        };
        // Each step searched what the step before reached: the answer, then sₙ, … s₂.
        let mut queries: Vec<String> = walked[..hops].to_vec();
        let confirmations =
            chain_searches(&chain).into_iter().take(rules.searches_needed(hops as u64).saturating_sub(hops));
        for (hop, query) in confirmations.enumerate() {
            if !searched.get(self, &query).await?.1.contains(&chain.supporting_titles[hop]) {
                return Ok(None);
            }
            queries.push(query);
        }
        // Turn j states what search j − 1 read; a confirming search reads no new link.
        let thought = |turn: usize| match turn.checked_sub(1).and_then(|k| read.get(k)) {
            Some(fact) if facts => format!("<think>{fact}</think>\n"),
            _ => String::new(),
        };
        let mut turns = Vec::new();
        let mut materials = String::new();
        for (turn, query) in queries.iter().enumerate() {
            let (information, _) = searched.get(self, query).await?;
            materials.push_str(&information);
            turns.push(WrittenTurn {
                text: format!("{}<search>{query}</search>", thought(turn)),
                information: Some(information),
            });
        }
        let last = thought(queries.len());
        let queries: Vec<&str> = queries.iter().map(String::as_str).collect();
        if rules.check(Some(&chain.question), answer, hops as u64, &queries, &materials).is_err() {
            return Ok(None);
        }
        turns.push(WrittenTurn { text: format!("{last}<question>{}</question>", chain.question), information: None });
        let prompt = self
            .policy
            .render_chat(&template.render(&BTreeMap::from([("answer", answer.clone()), ("hops", hops.to_string())])));
        Ok(self.sequence(&prompt, &turns).await?.map(|sequence| Demonstration {
            role: "proposer",
            hops: chain.hops.unwrap_or(0),
            sequence,
        }))
    }
}

/// The searches a walk made, each run once.
#[derive(Default)]
struct Searched(std::collections::HashMap<String, (String, Vec<String>)>);

impl Searched {
    /// The `<information>` block of `query` and its passages' titles.
    async fn get(&mut self, writer: &Writer<'_>, query: &str) -> Result<(String, Vec<String>), String> {
        if let Some(hit) = self.0.get(query) {
            return Ok(hit.clone());
        }
        let hit = writer.search(query).await?;
        self.0.insert(query.to_string(), hit.clone());
        Ok(hit)
    }
}

/// A user's demonstrations: rows with `prompt_ids`, `token_ids` and `loss_mask` (the
/// `rollouts` layout; `role` optional) in a JSONL or Parquet file.
pub fn read_user_demonstrations(path: &Path) -> Result<Vec<Demonstration>, String> {
    let is_parquet = path.extension().is_some_and(|e| e == "parquet");
    let rows: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)> = if is_parquet {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut rows = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| format!("{}: {e}", path.display()))?;
            let table = path.display().to_string();
            let read = Reader::new(&table, &batch);
            let columns = (|| {
                Ok::<_, sesa_engine::StageError>((
                    read.u32s("prompt_ids")?,
                    read.u32s("token_ids")?,
                    read.u32s("loss_mask")?,
                ))
            })()
            .map_err(|e| {
                format!("{e} (demonstrations need the rollouts table's `prompt_ids`, `token_ids` and `loss_mask`)")
            })?;
            rows.extend(columns.0.into_iter().zip(columns.1).zip(columns.2).map(|((p, t), m)| (p, t, m)));
        }
        rows
    } else {
        #[derive(Deserialize)]
        struct Row {
            prompt_ids: Vec<u32>,
            token_ids: Vec<u32>,
            loss_mask: Vec<u32>,
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        text.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| {
                let row: Row = serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
                Ok((row.prompt_ids, row.token_ids, row.loss_mask))
            })
            .collect::<Result<_, String>>()?
    };
    rows.into_iter()
        .enumerate()
        .map(|(i, (prompt, response, mask))| {
            if prompt.is_empty() || response.len() != mask.len() {
                return Err(format!(
                    "{}: row {}: needs a non-empty `prompt_ids` and one `loss_mask` value per `token_ids` value",
                    path.display(),
                    i + 1
                ));
            }
            let tokens: Vec<u32> = prompt.iter().chain(&response).copied().collect();
            let mask = std::iter::repeat_n(0, prompt.len()).chain(mask.iter().map(|&m| u8::from(m != 0))).collect();
            Ok(Demonstration { role: "user", hops: 0, sequence: TrainSequence::new(tokens, mask) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::agent::{PROPOSER_PROMPT, SOLVER_PROMPT};
    use crate::data::metrics::contains_answer;
    use crate::data::world::{World, WorldConfig};
    use crate::search::Bm25Index;
    use sesa_models::policy::testing::smollm2_candle;

    fn template(name: &str, kind: crate::agent::PromptKind) -> PromptTemplate {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/prompts").join(name);
        PromptTemplate::load_kind(&path, kind).unwrap()
    }

    /// The demonstrations of a small world's questions, tokenized by SmolLM2.
    #[tokio::test]
    async fn demonstrations_follow_the_loop_layout_and_drop_missed_hops() {
        let dir = tempfile::tempdir().unwrap();
        let world = World::generate(WorldConfig { seed: 5, entities: 150, questions: 40 });
        world.write(dir.path()).unwrap();
        Bm25Index::build(&dir.path().join("corpus.jsonl"), &dir.path().join("index"), |_| {}).unwrap();
        let index = std::sync::Arc::new(Bm25Index::open(&dir.path().join("index")).unwrap());
        let policy = tokio::task::spawn_blocking(smollm2_candle).await.unwrap();
        let writer = Writer { policy: &policy, search: &index, top_k: 3 };
        let questions = crate::data::datasets::load_questions(&dir.path().join("questions.jsonl")).unwrap();
        let (solver, proposer) =
            (template("solver_small.yaml", SOLVER_PROMPT), template("proposer_small.yaml", PROPOSER_PROMPT));
        let rules = ValidityRules { min_words: 4, min_searches: 1, ..ValidityRules::default() };
        let (mut solved, mut proposed) = (0, 0);
        let trained = |demo: &Demonstration| {
            let ids: Vec<u32> = demo
                .sequence
                .tokens
                .iter()
                .zip(&demo.sequence.mask)
                .filter(|(_, m)| **m == 1)
                .map(|(t, _)| *t)
                .collect();
            policy.decode(&ids).unwrap()
        };
        for question in &questions {
            if let Some(demo) = writer.solver(&solver, question, "", SolverThoughts::Plan).await.unwrap() {
                solved += 1;
                let text = policy.decode(&demo.sequence.tokens).unwrap();
                let trained = trained(&demo);
                let answer = &question.golden_answers[0];
                // Trained: the thoughts, the searches and the answer; read only: the prompt and
                // the results.
                let (titles, relations) = (&question.supporting_titles, &question.supporting_relations);
                let mut expected = String::new();
                for hop in 0..titles.len() {
                    let (title, relation) = (&titles[hop], &relations[hop]);
                    let thought = match hop {
                        0 => {
                            let then: String = relations[1..].iter().map(|r| format!(", then the {r} of it")).collect();
                            format!("I need the {relation} of {title}{then}.")
                        }
                        _ => format!(
                            "The {} of {} is {title}. {NEXT_HOP} {relation} of {title}.",
                            relations[hop - 1],
                            titles[hop - 1]
                        ),
                    };
                    expected += &format!("<think>{thought}</think>\n<search>{title} {relation}</search>");
                }
                let (title, relation) = (titles.last().unwrap(), relations.last().unwrap());
                expected +=
                    &format!("<think>The {relation} of {title} is {answer}.</think>\n<answer>{answer}</answer>");
                assert_eq!(trained, expected);
                assert_eq!(text.matches("<information>").count(), question.supporting_titles.len());
                assert!(text.contains(&question.question));
                assert_eq!(demo.sequence.mask[0], 0);
            }
            let (answer, hops) = (&question.golden_answers[0], question.supporting_titles.len());
            if let Some(demo) = writer.proposer(&proposer, &rules, answer, hops, question, false).await.unwrap() {
                proposed += 1;
                // The walk back starts from the answer and ends with the question.
                let trained = trained(&demo);
                assert!(trained.starts_with(&format!("<search>{}</search>", question.golden_answers[0])), "{trained}");
                assert!(trained.ends_with(&format!("<question>{}</question>", question.question)), "{trained}");
                assert_eq!(trained.matches("<search>").count(), question.supporting_titles.len());
            }
        }
        // With the remaining question in each thought: the same searches, each after the
        // question that is left, which is the one before with the hop just resolved replaced
        // by the entity it found.
        let mut reduced = 0;
        for question in questions.iter().filter(|q| q.supporting_titles.len() >= 2) {
            let Some(demo) = writer.solver(&solver, question, "", SolverThoughts::Remaining).await.unwrap() else {
                continue;
            };
            let (titles, relations, answer) =
                (&question.supporting_titles, &question.supporting_relations, &question.golden_answers[0]);
            let thoughts: Vec<String> = trained(&demo)
                .split("<think>")
                .skip(1)
                .map(|s| s.split("</think>").next().unwrap().to_string())
                .collect();
            assert_eq!(thoughts.len(), titles.len() + 1);
            assert_eq!(thoughts[0], format!("{REMAINING} {}", question.question));
            let opened = format!("{REMAINING} ");
            for hop in 1..titles.len() {
                let left = thoughts[hop].strip_prefix(&opened).unwrap();
                let (before, after) = left.split_once(titles[hop].as_str()).unwrap();
                let previous = thoughts[hop - 1].strip_prefix(&opened).unwrap();
                assert!(previous.starts_with(before) && previous.ends_with(after), "{previous} → {left}");
                // What the entity replaced is the resolved hop's phrase around its subject.
                let resolved = &previous[before.len()..previous.len() - after.len()];
                assert!(resolved.contains(titles[hop - 1].as_str()) && resolved != titles[hop - 1], "{resolved}");
            }
            let last = titles.len() - 1;
            assert_eq!(thoughts[titles.len()], format!("The {} of {} is {answer}.", relations[last], titles[last]));
            let plain = writer.solver(&solver, question, "", SolverThoughts::Plan).await.unwrap().unwrap();
            let searches = |demo: &Demonstration| trained(demo).matches("<search>").count();
            assert_eq!(searches(&demo), searches(&plain));
            reduced += 1;
        }
        assert!(reduced > 0, "no multi-hop demonstration with remaining questions");
        // With SSP's two searches, a one-hop walk confirms its hop with a second search.
        let two = ValidityRules { min_searches: 2, ..rules.clone() };
        let one_hop = questions.iter().filter(|q| q.hops == Some(1));
        let mut confirmed = 0;
        for question in one_hop {
            let answer = &question.golden_answers[0];
            if let Some(demo) = writer.proposer(&proposer, &two, answer, 1, question, false).await.unwrap() {
                let (title, relation) = (&question.supporting_titles[0], &question.supporting_relations[0]);
                let trained = trained(&demo);
                let walk =
                    format!("<search>{}</search><search>{title} {relation}</search>", question.golden_answers[0]);
                assert!(trained.starts_with(&walk), "{trained}");
                confirmed += 1;
            }
        }
        assert!(confirmed > 0, "a one-hop proposer demonstration under two searches");
        assert!(solved > questions.len() / 2, "{solved} of {} solver demonstrations", questions.len());
        assert!(proposed > 0 && proposed < questions.len(), "{proposed} proposer demonstrations");
        // Through the world, the walk goes wherever the searches lead, and its question is the
        // chain it walked: the passage found last starts it, and the world's facts lead from
        // there to the target.
        let titles: Vec<String> = world.passages().map(|(title, _)| title.to_string()).collect();
        let mut walked = 0;
        for question in &questions {
            let (answer, hops) = (&question.golden_answers[0], question.supporting_titles.len());
            let Some(demo) = writer.proposer(&proposer, &rules, answer, hops, &world, false).await.unwrap() else {
                continue;
            };
            walked += 1;
            assert_eq!(demo.hops as usize, hops);
            let noted = writer.proposer(&proposer, &rules, answer, hops, &world, true).await.unwrap().unwrap();
            let noted = trained(&noted);
            let trained = trained(&demo);
            let searches: Vec<&str> =
                trained.split("<search>").skip(1).map(|s| s.split("</search>").next().unwrap()).collect();
            assert_eq!(searches.len(), hops, "{trained}");
            assert_eq!(searches[0], answer);
            let written = trained.rsplit("<question>").next().unwrap().strip_suffix("</question>").unwrap();
            let last = searches.last().unwrap();
            let start = titles
                .iter()
                .find(|t| written.contains(t.as_str()) && world.relation_naming(t, last, hops > 1).is_some())
                .unwrap_or_else(|| panic!("no passage naming {last} starts {written:?}"));
            let mut chain: Vec<&str> = vec![start];
            chain.extend(searches.iter().rev());
            let relations: Vec<&str> = chain
                .windows(2)
                .enumerate()
                .map(|(k, p)| world.relation_naming(p[0], p[1], k + 2 < chain.len()).unwrap())
                .collect();
            assert_eq!(World::compose_question(start, &relations).as_deref(), Some(written));
            assert_eq!(world.follow(start, &relations).as_deref(), Some(answer.as_str()), "{written}");
            // With facts, the same walk states each link it read, last hop first, before the
            // next search and before the question.
            let facts: Vec<String> = (0..hops)
                .map(|k| format!("The {} of {} is {}.", relations[hops - 1 - k], chain[hops - 1 - k], chain[hops - k]))
                .collect();
            let thoughts: Vec<&str> =
                noted.split("<think>").skip(1).map(|s| s.split("</think>\n").next().unwrap()).collect();
            assert_eq!(thoughts, facts, "{noted}");
            assert!(noted.starts_with("<search>"), "{noted}");
            let mut bare = noted.clone();
            for fact in &facts {
                bare = bare.replacen(&format!("<think>{fact}</think>\n"), "", 1);
            }
            assert_eq!(bare, trained);
        }
        assert!(walked > proposed, "{walked} walks through the world against {proposed} along the questions' chains");
        // A skill block goes into the prompt, untrained; the trajectory is the same.
        let refs: Vec<&Question> = questions.iter().collect();
        let blocks = demonstration_skills(&refs, &SkillShare { relevant: 1.0, irrelevant: 0.0 });
        let mut compared = 0;
        for (question, block) in questions.iter().zip(&blocks).filter(|(_, b)| !b.is_empty()) {
            let Some(plain) = writer.solver(&solver, question, "", SolverThoughts::Plan).await.unwrap() else {
                continue;
            };
            let skilled = writer
                .solver(&solver, question, block, SolverThoughts::Plan)
                .await
                .unwrap()
                .expect("the same searches hit");
            assert_eq!(trained(&skilled), trained(&plain));
            assert!(policy.decode(&skilled.sequence.tokens).unwrap().contains(block.trim_end()));
            compared += 1;
        }
        assert!(compared > 0, "no demonstration with a skill block was written");
        // A question whose chain names a passage the index does not have is dropped.
        let mut broken = questions[0].clone();
        broken.supporting_titles[0] = "Nowhere Atlantis".into();
        assert_eq!(writer.solver(&solver, &broken, "", SolverThoughts::Plan).await.unwrap(), None);
        // A dataset that names only titles: the searches name the titles alone.
        let written = questions.iter().find(|q| q.hops == Some(2)).unwrap();
        let mut titles_only = written.clone();
        titles_only.supporting_relations.clear();
        let demo = writer
            .solver(&solver, &titles_only, "", SolverThoughts::Remaining)
            .await
            .unwrap()
            .expect("a written demonstration");
        let text = policy.decode(&demo.sequence.tokens).unwrap();
        let [first, second] = [&written.supporting_titles[0], &written.supporting_titles[1]];
        assert!(text.contains(&format!("<think>I need to read about {first}.</think>\n<search>{first}</search>")));
        assert!(text.contains(&format!("<think>{first} leads to {second}. I need to read about {second}.</think>")));
    }

    #[test]
    fn skill_aware_demonstrations_show_a_fitting_skill_another_or_none_the_same_every_time() {
        let dir = tempfile::tempdir().unwrap();
        World::generate(WorldConfig { seed: 5, entities: 400, questions: 300 }).write(dir.path()).unwrap();
        let questions = crate::data::datasets::load_questions(&dir.path().join("questions.jsonl")).unwrap();
        let refs: Vec<&Question> = questions.iter().collect();
        let share = SkillShare { relevant: 0.4, irrelevant: 0.2 };
        let blocks = demonstration_skills(&refs, &share);
        assert_eq!(blocks, demonstration_skills(&refs, &share), "deterministic");
        let (mut fitting, mut other) = (0, 0);
        for (question, block) in questions.iter().zip(&blocks) {
            if block.is_empty() {
                continue;
            }
            // A fitting skill's trigger is this question's own pattern.
            let own = demonstration_skills(&[question, question], &SkillShare { relevant: 1.0, irrelevant: 0.0 });
            let pattern = own[0].split("Use when: ").nth(1).unwrap().split(" Query:").next().unwrap();
            if block.contains(pattern) {
                fitting += 1
            } else {
                other += 1
            }
            assert!(!contains_answer(block, &question.golden_answers[0]), "{block}");
            assert!(!contains_answer(block, &question.supporting_titles[0]), "{block}");
        }
        let n = questions.len() as f64;
        assert!((fitting as f64 - 0.4 * n).abs() < 0.05 * n, "{fitting} fitting of {n}");
        assert!((other as f64 - 0.2 * n).abs() < 0.05 * n, "{other} of another chain of {n}");
        assert!(SkillShare { relevant: 0.7, irrelevant: 0.4 }.problem().is_some());
    }

    #[test]
    fn user_demonstrations_are_read_from_jsonl_with_their_line_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demos.jsonl");
        std::fs::write(&path, "{\"prompt_ids\": [1, 2], \"token_ids\": [3, 4, 5], \"loss_mask\": [1, 0, 1]}\n")
            .unwrap();
        let demos = read_user_demonstrations(&path).unwrap();
        assert_eq!(demos[0].sequence, TrainSequence::new(vec![1, 2, 3, 4, 5], vec![0, 0, 1, 0, 1]));
        std::fs::write(&path, "{\"prompt_ids\": [1], \"token_ids\": [3, 4], \"loss_mask\": [1]}\n").unwrap();
        assert!(read_user_demonstrations(&path).unwrap_err().contains("row 1"));
        std::fs::write(&path, "{\"prompt_ids\": [1]}\n").unwrap();
        assert!(read_user_demonstrations(&path).unwrap_err().contains(":1:"));
    }
}
