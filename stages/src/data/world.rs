//! A generated world: a fictional encyclopedia with multi-hop questions, so that a small model
//! cannot answer from memory and must search.
//!
//! People, cities, countries, organisations and works are linked by functional relations (each
//! subject has at most one object per relation: one birthplace, one mother, one spouse, one
//! founder…). Every entity has one passage stating its facts. A question of `n` hops composes
//! `n` relations from a named entity, so its answer is unique by construction, and it is
//! recoverable by reading the passages of the `n` entities on the chain, in order. Everything
//! derives from the seed.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The generator's version, recorded with every world it writes. Bump it when the same config
/// would generate a different world, so that worlds written before are regenerated.
pub const GENERATOR_VERSION: u32 = 2;

/// The file in a world's directory that records how it was generated. Written last, so a world
/// without it is incomplete.
pub const STAMP_FILE: &str = "world.json";

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldConfig {
    /// The seed.
    pub seed: u64,
    /// Entities (and so passages).
    pub entities: usize,
    /// Questions to generate.
    pub questions: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Person,
    City,
    Country,
    Organisation,
    Work,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relation {
    BornIn,
    BirthYear,
    MotherOf,
    SpouseOf,
    EmployerOf,
    CountryOf,
    FounderOf,
    FoundedYear,
    HeadquartersOf,
    CreatorOf,
    PublishedYear,
}

use Relation::*;

impl Relation {
    const ALL: [Relation; 11] = [
        BornIn,
        BirthYear,
        MotherOf,
        SpouseOf,
        EmployerOf,
        CountryOf,
        FounderOf,
        FoundedYear,
        HeadquartersOf,
        CreatorOf,
        PublishedYear,
    ];

    fn domain(self) -> Kind {
        match self {
            BornIn | BirthYear | MotherOf | SpouseOf | EmployerOf => Kind::Person,
            CountryOf => Kind::City,
            FounderOf | FoundedYear | HeadquartersOf => Kind::Organisation,
            CreatorOf | PublishedYear => Kind::Work,
        }
    }

    /// The kind of the object, or `None` for a year.
    fn range(self) -> Option<Kind> {
        match self {
            BornIn | HeadquartersOf => Some(Kind::City),
            MotherOf | SpouseOf | FounderOf | CreatorOf => Some(Kind::Person),
            EmployerOf => Some(Kind::Organisation),
            CountryOf => Some(Kind::Country),
            BirthYear | FoundedYear | PublishedYear => None,
        }
    }

    /// The question when this relation is the last hop.
    fn question(self, subject: &str) -> String {
        match self {
            BornIn => format!("In which city was {subject} born?"),
            BirthYear => format!("In which year was {subject} born?"),
            MotherOf => format!("Who is the mother of {subject}?"),
            SpouseOf => format!("Who is {subject} married to?"),
            EmployerOf => format!("Which organisation does {subject} work for?"),
            CountryOf => format!("In which country is {subject}?"),
            FounderOf => format!("Who founded {subject}?"),
            FoundedYear => format!("In which year was {subject} founded?"),
            HeadquartersOf => format!("In which city is {subject} headquartered?"),
            CreatorOf => format!("Who wrote {subject}?"),
            PublishedYear => format!("In which year was {subject} published?"),
        }
    }

    /// The relation's name, as a searcher would write it next to the subject ("Orla country").
    fn noun(self) -> &'static str {
        match self {
            BornIn => "birthplace",
            BirthYear => "birth year",
            MotherOf => "mother",
            SpouseOf => "spouse",
            EmployerOf => "employer",
            CountryOf => "country",
            FounderOf => "founder",
            FoundedYear => "founding year",
            HeadquartersOf => "headquarters",
            CreatorOf => "author",
            PublishedYear => "publication year",
        }
    }

    /// The relation whose [`noun`](Relation::noun) is `noun`.
    fn named(noun: &str) -> Option<Relation> {
        Relation::ALL.into_iter().find(|r| r.noun() == noun)
    }

    /// A noun phrase for the object, when this relation is an inner hop.
    fn phrase(self, subject: &str) -> String {
        match self {
            BornIn => format!("the city where {subject} was born"),
            MotherOf => format!("the mother of {subject}"),
            SpouseOf => format!("the spouse of {subject}"),
            EmployerOf => format!("the employer of {subject}"),
            CountryOf => format!("the country of {subject}"),
            FounderOf => format!("the founder of {subject}"),
            HeadquartersOf => format!("the city where {subject} is headquartered"),
            CreatorOf => format!("the author of {subject}"),
            BirthYear | FoundedYear | PublishedYear => unreachable!("years end a chain"),
        }
    }
}

#[derive(Debug, Clone)]
struct Entity {
    kind: Kind,
    name: String,
    /// Object entity index per relation (entity relations), or a year.
    facts: Vec<(Relation, Object)>,
    /// A descriptive noun: "chemist", "river port", "publisher", "novel".
    role: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    Entity(usize),
    Year(u32),
}

impl Entity {
    fn get(&self, relation: Relation) -> Option<Object> {
        self.facts.iter().find(|(r, _)| *r == relation).map(|(_, o)| *o)
    }
}

/// One generated question, FlashRAG-compatible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorldQuestion {
    /// `q{n}`.
    pub id: String,
    /// The question text.
    pub question: String,
    /// The one answer, as a list.
    pub golden_answers: Vec<String>,
    /// Searches needed.
    pub hops: u8,
    /// Titles of the passages on the chain, in reading order.
    pub supporting_titles: Vec<String>,
    /// The relation each hop follows from its passage's entity ("birthplace", "country"), in
    /// the same order: hop `k` reads `supporting_relations[k]` of `supporting_titles[k]`.
    pub supporting_relations: Vec<String>,
}

/// A target answer for the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// The answer the proposer must build a question for.
    pub answer: String,
    /// The hop count to aim for.
    pub hops: u8,
    /// `person`, `city`, `country`, `organisation`, `work` or `year`.
    pub answer_type: String,
}

/// A generated world in memory.
pub struct World {
    config: WorldConfig,
    entities: Vec<Entity>,
    /// Each entity's index by name (names are unique).
    by_name: HashMap<String, usize>,
    questions: Vec<WorldQuestion>,
}

const SYLLABLES: &[&str] = &[
    "ka", "ve", "lor", "mi", "tan", "quo", "ris", "bel", "dun", "sa", "thu", "or", "en", "va", "zel", "ny", "pra",
    "col", "fen", "ish", "gar", "lu", "mer", "od", "stri", "wen", "ax", "bri", "cae", "dro",
];
const PERSON_ROLES: &[&str] =
    &["chemist", "painter", "engineer", "poet", "botanist", "judge", "sailor", "composer", "architect", "historian"];
const CITY_ROLES: &[&str] = &["river port", "market town", "mountain city", "coastal city", "university town"];
const ORG_SUFFIXES: &[(&str, &str)] = &[
    ("Industries", "manufacturer"),
    ("Press", "publisher"),
    ("Institute", "research institute"),
    ("Bank", "bank"),
    ("Shipping Company", "shipping company"),
    ("Observatory", "observatory"),
];
const WORK_ADJECTIVES: &[&str] =
    &["Silent", "Crimson", "Hollow", "Last", "Glass", "Northern", "Forgotten", "Seventh", "Amber", "Distant"];
const WORK_NOUNS: &[&str] =
    &["Harbour", "Orchard", "Lantern", "Meridian", "Archive", "Tide", "Bell", "Garden", "Compass", "Winter"];
const WORK_ROLES: &[&str] = &["novel", "play", "poetry collection", "treatise", "memoir"];

fn word(rng: &mut ChaCha8Rng, syllables: std::ops::Range<usize>) -> String {
    let count = rng.random_range(syllables);
    let mut word: String = (0..count).map(|_| *SYLLABLES.choose(rng).expect("non-empty")).collect();
    word[..1].make_ascii_uppercase();
    word
}

impl World {
    /// Generates a world. Deterministic for a given config.
    pub fn generate(config: WorldConfig) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let n = config.entities.max(20);
        let countries = (n * 3 / 100).clamp(3, 250);
        let cities = (n * 15 / 100).max(5);
        let organisations = (n * 17 / 100).max(3);
        let works = (n * 15 / 100).max(3);
        let people = n - countries - cities - organisations - works;
        let mut names = HashSet::new();
        // Name spaces are large for every kind; after many collisions in a row a number makes
        // the name unique, so generation always ends, even for millions of entities.
        let mut unique = |rng: &mut ChaCha8Rng, make: &dyn Fn(&mut ChaCha8Rng) -> String| {
            for _ in 0..64 {
                let name = make(rng);
                if names.insert(name.clone()) {
                    return name;
                }
            }
            let base = make(rng);
            (2..)
                .map(|n| format!("{base} {n}"))
                .find(|name| names.insert(name.clone()))
                .expect("an unused number exists")
        };
        let mut entities = Vec::with_capacity(n);
        let country_start = entities.len();
        for _ in 0..countries {
            let name = unique(&mut rng, &|r| format!("{}ia", word(r, 2..4)));
            entities.push(Entity { kind: Kind::Country, name, facts: Vec::new(), role: "country" });
        }
        let city_start = entities.len();
        for _ in 0..cities {
            let name = unique(&mut rng, &|r| word(r, 2..5));
            let country = rng.random_range(country_start..city_start);
            let role = *CITY_ROLES.choose(&mut rng).expect("non-empty");
            entities.push(Entity { kind: Kind::City, name, facts: vec![(CountryOf, Object::Entity(country))], role });
        }
        let person_start = entities.len();
        for index in 0..people {
            let name = unique(&mut rng, &|r| format!("{} {}", word(r, 2..3), word(r, 2..4)));
            let city = rng.random_range(city_start..person_start);
            let mut facts = vec![(BornIn, Object::Entity(city))];
            // Mothers come from earlier people, so a chain of mothers always ends.
            let mother = (index > 10 && rng.random_bool(0.6)).then(|| person_start + rng.random_range(0..index));
            let year = match mother.and_then(|m| entities[m].get(BirthYear)) {
                Some(Object::Year(mother_year)) => mother_year + rng.random_range(18..40),
                _ => rng.random_range(1780..1900),
            };
            if let Some(mother) = mother {
                facts.push((MotherOf, Object::Entity(mother)));
            }
            facts.push((BirthYear, Object::Year(year)));
            let role = *PERSON_ROLES.choose(&mut rng).expect("non-empty");
            entities.push(Entity { kind: Kind::Person, name, facts, role });
        }
        let person_end = entities.len();
        // Spouses: disjoint pairs, symmetric.
        let mut unmarried: Vec<usize> = (person_start..person_end).collect();
        for i in (1..unmarried.len()).rev() {
            let j = rng.random_range(0..=i);
            unmarried.swap(i, j);
        }
        for pair in unmarried.chunks(2).take(people / 3) {
            if let [a, b] = *pair {
                entities[a].facts.push((SpouseOf, Object::Entity(b)));
                entities[b].facts.push((SpouseOf, Object::Entity(a)));
            }
        }
        let org_start = entities.len();
        for _ in 0..organisations {
            let (suffix, role) = *ORG_SUFFIXES.choose(&mut rng).expect("non-empty");
            let name = unique(&mut rng, &|r| format!("{} {suffix}", word(r, 2..5)));
            let founder = rng.random_range(person_start..person_end);
            let city = rng.random_range(city_start..person_start);
            let founder_year = match entities[founder].get(BirthYear) {
                Some(Object::Year(year)) => year,
                _ => 1800,
            };
            let facts = vec![
                (FounderOf, Object::Entity(founder)),
                (HeadquartersOf, Object::Entity(city)),
                (FoundedYear, Object::Year(founder_year + rng.random_range(22..60))),
            ];
            entities.push(Entity { kind: Kind::Organisation, name, facts, role });
        }
        let org_end = entities.len();
        for person in &mut entities[person_start..person_end] {
            if rng.random_bool(0.5) {
                let employer = rng.random_range(org_start..org_end);
                person.facts.push((EmployerOf, Object::Entity(employer)));
            }
        }
        for _ in 0..works {
            let name = unique(&mut rng, &|r| {
                let adjective = WORK_ADJECTIVES.choose(r).expect("non-empty");
                let noun = WORK_NOUNS.choose(r).expect("non-empty");
                format!("The {adjective} {noun} of {}", word(r, 2..5))
            });
            let author = rng.random_range(person_start..person_end);
            let born = match entities[author].get(BirthYear) {
                Some(Object::Year(year)) => year,
                _ => 1800,
            };
            let role = *WORK_ROLES.choose(&mut rng).expect("non-empty");
            let facts = vec![
                (CreatorOf, Object::Entity(author)),
                (PublishedYear, Object::Year(born + rng.random_range(20..70))),
            ];
            entities.push(Entity { kind: Kind::Work, name, facts, role });
        }
        let by_name = entities.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        let mut world = World { config, entities, by_name, questions: Vec::new() };
        world.questions = world.make_questions(&mut rng, config.questions);
        world
    }

    fn make_questions(&self, rng: &mut ChaCha8Rng, count: usize) -> Vec<WorldQuestion> {
        let mut questions = Vec::with_capacity(count);
        let mut seen = HashSet::new();
        let mut attempts = 0;
        while questions.len() < count && attempts < count * 50 {
            attempts += 1;
            let hops = rng.random_range(1..=4u8);
            let start = rng.random_range(0..self.entities.len());
            let Some((chain, answer)) = self.walk(rng, start, hops) else {
                continue;
            };
            let relations: Vec<Relation> = chain.iter().map(|(relation, _)| *relation).collect();
            let question = compose(&self.entities[start].name, &relations);
            let inner = &chain[..chain.len() - 1];
            if !seen.insert(question.clone()) {
                continue;
            }
            let mut supporting = vec![self.entities[start].name.clone()];
            supporting.extend(inner.iter().map(|(_, entity)| self.entities[*entity].name.clone()));
            questions.push(WorldQuestion {
                id: format!("q{}", questions.len()),
                question,
                golden_answers: vec![answer],
                hops,
                supporting_titles: supporting,
                supporting_relations: chain.iter().map(|(relation, _)| relation.noun().to_string()).collect(),
            });
        }
        questions
    }

    /// A random chain of `hops` relations from `start`: (relation, object entity) per hop, and
    /// the answer text. Entity objects of the last hop are reported as their index too.
    fn walk(&self, rng: &mut ChaCha8Rng, start: usize, hops: u8) -> Option<(Vec<(Relation, usize)>, String)> {
        let mut chain = Vec::new();
        let mut current = start;
        for hop in 0..hops {
            let last = hop + 1 == hops;
            let options: Vec<(Relation, Object)> = self.entities[current]
                .facts
                .iter()
                .copied()
                .filter(|(relation, _)| last || relation.range().is_some())
                .collect();
            let (relation, object) = *options.choose(rng)?;
            debug_assert_eq!(relation.domain(), self.entities[current].kind);
            match object {
                Object::Entity(next) => {
                    // Returning to an entity already on the chain would make a trivial question.
                    if next == start || chain.iter().any(|(_, e)| *e == next) {
                        return None;
                    }
                    chain.push((relation, next));
                    current = next;
                }
                Object::Year(year) => {
                    chain.push((relation, usize::MAX));
                    return Some((chain, year.to_string()));
                }
            }
        }
        Some((chain, self.entities[current].name.clone()))
    }

    /// The relation by which the passage of `subject` (a title) states `object` (another
    /// entity's name, or a year), as its noun ("birthplace"): the step a walk back from
    /// `object` can take to `subject`. With `inner`, only a relation to an entity, which a
    /// question can go on from.
    pub fn relation_naming(&self, subject: &str, object: &str, inner: bool) -> Option<&'static str> {
        let entity = &self.entities[*self.by_name.get(subject)?];
        let target = match self.by_name.get(object) {
            Some(&index) => Object::Entity(index),
            None => Object::Year(object.parse().ok()?),
        };
        entity
            .facts
            .iter()
            .find(|(relation, o)| *o == target && (!inner || relation.range().is_some()))
            .map(|(relation, _)| relation.noun())
    }

    /// What following `relations` (nouns, in reading order) from the entity `start` reaches:
    /// an entity's name or a year; `None` where an entity lacks the relation.
    pub fn follow(&self, start: &str, relations: &[&str]) -> Option<String> {
        let mut object = Object::Entity(*self.by_name.get(start)?);
        for noun in relations {
            let Object::Entity(current) = object else { return None };
            object = self.entities[current].get(Relation::named(noun)?)?;
        }
        Some(match object {
            Object::Entity(index) => self.entities[index].name.clone(),
            Object::Year(year) => year.to_string(),
        })
    }

    /// The question that starts at the entity `start` and follows `relations` (nouns, in
    /// reading order), written as the world writes its own questions; `None` when a relation
    /// is unknown, or a year-valued one is not the last.
    pub fn compose_question(start: &str, relations: &[&str]) -> Option<String> {
        let relations: Vec<Relation> = relations.iter().map(|noun| Relation::named(noun)).collect::<Option<_>>()?;
        let (_, inner) = relations.split_last()?;
        inner.iter().all(|r| r.range().is_some()).then(|| compose(start, &relations))
    }

    /// The inverse of [`Self::compose_question`]: the entity a question written in the world's
    /// grammar starts at and the relations it follows (nouns, in reading order); `None` for any
    /// other text. Only the grammar is read, not a world: the entity need not exist.
    pub fn read_question(question: &str) -> Option<(String, Vec<&'static str>)> {
        // A template's text around its subject, found by rendering it with a marker.
        fn around(render: impl Fn(&str) -> String, text: &str) -> Option<&str> {
            let template = render("\u{0}");
            let (prefix, suffix) = template.split_once('\u{0}')?;
            text.strip_prefix(prefix)?.strip_suffix(suffix).filter(|subject| !subject.is_empty())
        }
        let read = |last: Relation| {
            let mut subject = around(|s| last.question(s), question)?;
            let mut relations = vec![last];
            while let Some((inner, relation)) = Relation::ALL
                .into_iter()
                .filter(|r| r.range().is_some())
                .find_map(|r| around(|s| r.phrase(s), subject).map(|s| (s, r)))
            {
                relations.push(relation);
                subject = inner;
            }
            relations.reverse();
            let nouns: Vec<&'static str> = relations.iter().map(|r| r.noun()).collect();
            (World::compose_question(subject, &nouns).as_deref() == Some(question))
                .then(|| (subject.to_string(), nouns))
        };
        // The grammar is ambiguous where a name could hold a template's words ("Who is the
        // mother of X married to?" also reads as the mother of "X married to"): the reading
        // that starts at the shortest name wins.
        Relation::ALL.into_iter().filter_map(read).min_by_key(|(start, _)| start.len())
    }

    /// The generated world whose directory holds `file` (its questions or targets),
    /// regenerated from the stamp beside it; `None` for a file of another origin or of another
    /// generator version.
    pub fn holding(file: &Path) -> Option<World> {
        let stamp = WorldStamp::read(file.parent()?)?;
        (stamp.generator == GENERATOR_VERSION).then(|| World::generate(stamp.config))
    }

    /// What `question`, read in the world's grammar, asks for in this world: the answer and the
    /// hop count; `None` when it does not read as the world's questions do or its start is no
    /// entity of this world.
    pub fn answer_to(&self, question: &str) -> Option<(String, u64)> {
        let (start, relations) = World::read_question(question)?;
        Some((self.follow(&start, &relations)?, relations.len() as u64))
    }

    /// The passage of entity `index`: every fact about it, in plain sentences.
    fn passage(&self, index: usize) -> String {
        let entity = &self.entities[index];
        let name = |object: Object| match object {
            Object::Entity(e) => self.entities[e].name.clone(),
            Object::Year(year) => year.to_string(),
        };
        let mut sentences = vec![match entity.kind {
            Kind::Country => format!("{} is a country.", entity.name),
            _ => {
                let article = if entity.role.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
                format!("{} is {article} {}.", entity.name, entity.role)
            }
        }];
        for (relation, object) in &entity.facts {
            let object = name(*object);
            let subject = &entity.name;
            sentences.push(match relation {
                BornIn => format!("{subject} was born in the city of {object}."),
                BirthYear => format!("{subject} was born in {object}."),
                MotherOf => format!("The mother of {subject} is {object}."),
                SpouseOf => format!("{subject} is married to {object}."),
                EmployerOf => format!("{subject} works for {object}."),
                CountryOf => format!("{subject} is located in the country of {object}."),
                FounderOf => format!("{subject} was founded by {object}."),
                FoundedYear => format!("{subject} was founded in {object}."),
                HeadquartersOf => format!("{subject} is headquartered in {object}."),
                CreatorOf => format!("{subject} was written by {object}."),
                PublishedYear => format!("{subject} was published in {object}."),
            });
        }
        sentences.join(" ")
    }

    /// The generated questions.
    pub fn questions(&self) -> &[WorldQuestion] {
        &self.questions
    }

    /// (title, text) of every passage, in id order.
    pub fn passages(&self) -> impl Iterator<Item = (&str, String)> {
        (0..self.entities.len()).map(|i| (self.entities[i].name.as_str(), self.passage(i)))
    }

    /// One target per distinct (answer, hops) of the questions.
    pub fn targets(&self) -> Vec<Target> {
        let kinds: HashMap<&str, Kind> = self.entities.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        for question in &self.questions {
            let answer = question.golden_answers[0].clone();
            if !seen.insert((answer.clone(), question.hops)) {
                continue;
            }
            let answer_type = match kinds.get(answer.as_str()) {
                Some(Kind::Person) => "person",
                Some(Kind::City) => "city",
                Some(Kind::Country) => "country",
                Some(Kind::Organisation) => "organisation",
                Some(Kind::Work) => "work",
                None => "year",
            };
            targets.push(Target { answer, hops: question.hops, answer_type: answer_type.to_string() });
        }
        targets
    }

    /// Writes `corpus.jsonl`, `questions.jsonl` and `targets.jsonl` into `out`.
    pub fn write(&self, out: &Path) -> std::io::Result<WorldFiles> {
        std::fs::create_dir_all(out)?;
        // A world being rewritten carries no stamp until it is complete.
        match std::fs::remove_file(out.join(STAMP_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut corpus = std::io::BufWriter::new(std::fs::File::create(out.join("corpus.jsonl"))?);
        for (index, (title, text)) in self.passages().enumerate() {
            let line = serde_json::json!({ "id": format!("w{index}"), "contents": format!("\"{title}\"\n{text}") });
            writeln!(corpus, "{line}")?;
        }
        corpus.flush()?;
        write_jsonl(&out.join("questions.jsonl"), &self.questions)?;
        let targets = self.targets();
        write_jsonl(&out.join("targets.jsonl"), &targets)?;
        let stamp = WorldStamp { generator: GENERATOR_VERSION, config: self.config };
        std::fs::write(out.join(STAMP_FILE), serde_json::to_string_pretty(&stamp).map_err(std::io::Error::other)?)?;
        Ok(WorldFiles { passages: self.entities.len(), questions: self.questions.len(), targets: targets.len() })
    }
}

/// The question that starts at `start` and follows `relations` (at least one; every one but
/// the last leads to an entity): "In which country is the city where X was born?".
fn compose(start: &str, relations: &[Relation]) -> String {
    let (last, inner) = relations.split_last().expect("a question follows at least one relation");
    let subject = inner.iter().fold(start.to_string(), |subject, relation| relation.phrase(&subject));
    last.question(&subject)
}

/// How a world on disk was generated (its `world.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldStamp {
    /// [`GENERATOR_VERSION`] when it was written.
    pub generator: u32,
    /// Its config.
    #[serde(flatten)]
    pub config: WorldConfig,
}

impl WorldStamp {
    /// The stamp of the world in `dir`: `None` when there is none (no world, an incomplete
    /// one, or one written before worlds were stamped).
    pub fn read(dir: &Path) -> Option<WorldStamp> {
        serde_json::from_slice(&std::fs::read(dir.join(STAMP_FILE)).ok()?).ok()
    }

    /// What differs from `wanted`, in words (empty when they agree).
    pub fn differences(&self, wanted: &WorldStamp) -> Vec<String> {
        let (have, want) = (&self.config, &wanted.config);
        [
            ("generator version", self.generator as u64, wanted.generator as u64),
            ("seed", have.seed, want.seed),
            ("entities", have.entities as u64, want.entities as u64),
            ("questions", have.questions as u64, want.questions as u64),
        ]
        .into_iter()
        .filter(|(_, have, want)| have != want)
        .map(|(what, have, want)| format!("{what} {have} (the spec asks for {want})"))
        .collect()
    }
}

/// What [`World::write`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorldFiles {
    /// Lines of `corpus.jsonl`.
    pub passages: usize,
    /// Lines of `questions.jsonl`.
    pub questions: usize,
    /// Lines of `targets.jsonl`.
    pub targets: usize,
}

fn write_jsonl<T: Serialize>(path: &Path, rows: &[T]) -> std::io::Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for row in rows {
        writeln!(file, "{}", serde_json::to_string(row).map_err(std::io::Error::other)?)?;
    }
    file.flush()
}

#[cfg(test)]
mod tests;
