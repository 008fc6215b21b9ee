//! The generator's guarantees: determinism, unique names, answerable questions.

use std::collections::{HashMap, HashSet};

use super::{GENERATOR_VERSION, STAMP_FILE, World, WorldConfig, WorldStamp};

fn world(seed: u64) -> World {
    World::generate(WorldConfig { seed, entities: 400, questions: 300 })
}

#[test]
fn the_same_seed_gives_the_same_world() {
    let (a, b, c) = (world(1), world(1), world(2));
    let passages = |w: &World| w.passages().map(|(t, p)| format!("{t}|{p}")).collect::<Vec<_>>();
    assert_eq!(passages(&a), passages(&b));
    assert_eq!(a.questions(), b.questions());
    assert_ne!(passages(&a), passages(&c));
}

#[test]
fn titles_are_unique() {
    let w = world(3);
    let titles: Vec<&str> = w.passages().map(|(t, _)| t).collect();
    assert_eq!(titles.iter().collect::<HashSet<_>>().len(), titles.len());
    assert_eq!(titles.len(), 400);
}

#[test]
fn every_question_is_answerable_from_its_supporting_passages_in_order() {
    let w = world(4);
    let passages: HashMap<&str, String> = w.passages().collect();
    let mut hops_seen = HashSet::new();
    assert_eq!(w.questions().len(), 300);
    for q in w.questions() {
        hops_seen.insert(q.hops);
        assert_eq!(q.supporting_titles.len(), q.hops as usize, "{q:?}");
        assert_eq!(q.supporting_relations.len(), q.hops as usize, "{q:?}");
        // The question names the relation of its last hop ("In which country is …?").
        let last_relation = q.supporting_relations.last().unwrap().split(' ').next_back().unwrap();
        let last_relation = match last_relation {
            "birthplace" => "born",
            "headquarters" => "headquartered",
            "author" => "wrote",
            "founder" => "founded",
            "spouse" => "married",
            "employer" => "work for",
            other => other,
        };
        assert!(q.question.contains(last_relation), "{q:?}");
        assert_eq!(q.golden_answers.len(), 1);
        let answer = &q.golden_answers[0];
        assert!(q.question.contains(&q.supporting_titles[0]), "the chain starts at a named entity: {q:?}");
        for pair in q.supporting_titles.windows(2) {
            assert!(passages[pair[0].as_str()].contains(&pair[1]), "{} leads to {}: {q:?}", pair[0], pair[1]);
        }
        let last = &passages[q.supporting_titles.last().unwrap().as_str()];
        assert!(last.contains(answer.as_str()), "the last passage states the answer: {q:?}");
        assert!(!q.supporting_titles.contains(answer), "the answer is not on the chain: {q:?}");
        assert!(!q.question.contains(answer.as_str()), "the answer is not in the question: {q:?}");
    }
    assert_eq!(hops_seen, HashSet::from([1, 2, 3, 4]));
    let questions: HashSet<&str> = w.questions().iter().map(|q| q.question.as_str()).collect();
    assert_eq!(questions.len(), 300, "questions are distinct");
}

#[test]
fn a_sample_world_reads_like_an_encyclopedia() {
    let w = World::generate(WorldConfig { seed: 9, entities: 20, questions: 4 });
    let sample: Vec<String> = w.passages().skip(8).take(2).map(|(t, p)| format!("{t}: {p}")).collect();
    let questions: Vec<String> =
        w.questions().iter().map(|q| format!("[{} hops] {} -> {}", q.hops, q.question, q.golden_answers[0])).collect();
    insta::assert_snapshot!(format!("{}\n{}", sample.join("\n"), questions.join("\n")), @"
    Wenax Fenod: Wenax Fenod is an architect. Wenax Fenod was born in the city of Praenfen. Wenax Fenod was born in 1890.
    Zelzel Luquoish: Zelzel Luquoish is a historian. Zelzel Luquoish was born in the city of Thuvagar. Zelzel Luquoish was born in 1878. Zelzel Luquoish is married to Odlu Strisa.
    [1 hops] Who founded Dunnymerquo Shipping Company? -> Bribel Zeldunris
    [1 hops] In which country is Colcaebel? -> Colgarsaia
    [1 hops] In which year was Bribel Zeldunris born? -> 1853
    [4 hops] In which country is the city where the founder of the employer of Odlu Strisa was born? -> Micaeodia
    ");
}

#[test]
fn files_are_written_in_the_search_r1_and_flashrag_formats() {
    let dir = tempfile::tempdir().unwrap();
    let files = world(5).write(dir.path()).unwrap();
    assert_eq!((files.passages, files.questions), (400, 300));
    let corpus: Vec<_> = crate::search::CorpusReader::open(&dir.path().join("corpus.jsonl")).unwrap().collect();
    assert_eq!(corpus.len(), 400);
    assert!(corpus.iter().all(Result::is_ok));
    let questions = crate::data::datasets::load_questions(&dir.path().join("questions.jsonl")).unwrap();
    assert_eq!(questions.len(), 300);
    assert!(questions.iter().all(|q| q.hops.is_some() && !q.supporting_titles.is_empty()));
    let targets = std::fs::read_to_string(dir.path().join("targets.jsonl")).unwrap();
    assert_eq!(targets.lines().count(), files.targets);
    assert!(targets.lines().all(|l| l.contains("\"answer\"") && l.contains("\"hops\"")));
}

#[test]
fn a_world_generated_with_other_parameters_is_regenerated_not_reused() {
    use crate::sections::WorldSection;
    let dir = tempfile::tempdir().unwrap();
    let section = |entities| WorldSection { dir: dir.path().join("world"), seed: 1, entities, questions: 20 };
    let passages = || std::fs::read_to_string(dir.path().join("world/corpus.jsonl")).unwrap().lines().count();
    section(100).ensure().unwrap();
    let small = passages();
    let stamp = WorldStamp::read(&dir.path().join("world")).unwrap();
    assert_eq!((stamp.generator, stamp.config.entities, stamp.config.seed), (GENERATOR_VERSION, 100, 1));
    section(300).ensure().unwrap();
    assert!(passages() > small, "the spec's size, not the stale world's");
    assert_eq!(WorldStamp::read(&dir.path().join("world")).unwrap().config.entities, 300);
    // A file of the world's directory gives the world back; one elsewhere, none.
    let held = World::holding(&dir.path().join("world/targets.jsonl")).unwrap();
    assert_eq!(held.passages().count(), passages());
    assert!(World::holding(&dir.path().join("targets.jsonl")).is_none());
    let wanted =
        WorldStamp { generator: GENERATOR_VERSION, config: WorldConfig { seed: 2, entities: 300, questions: 20 } };
    assert_eq!(stamp.differences(&wanted), ["seed 1 (the spec asks for 2)", "entities 100 (the spec asks for 300)"]);
    // A world written before worlds were stamped is regenerated too.
    std::fs::remove_file(dir.path().join("world").join(STAMP_FILE)).unwrap();
    std::fs::write(dir.path().join("world/corpus.jsonl"), "").unwrap();
    section(300).ensure().unwrap();
    assert!(passages() > small);
}

#[test]
fn a_question_is_composed_from_its_chain_and_its_facts_lead_to_the_answer() {
    let w = world(6);
    for q in w.questions() {
        let relations: Vec<&str> = q.supporting_relations.iter().map(String::as_str).collect();
        let start = &q.supporting_titles[0];
        assert_eq!(World::compose_question(start, &relations).as_ref(), Some(&q.question));
        assert_eq!(World::read_question(&q.question), Some((start.clone(), relations.clone())), "read back");
        assert_eq!(w.follow(start, &relations).as_ref(), Some(&q.golden_answers[0]));
        assert_eq!(w.answer_to(&q.question), Some((q.golden_answers[0].clone(), relations.len() as u64)));
        // Each passage on the chain states the next one (an entity: an inner relation), the
        // last the answer; by the hop's relation, or another that leads there too (a mother
        // who is also the spouse).
        let mut next: Vec<&String> = q.supporting_titles.iter().skip(1).collect();
        next.push(&q.golden_answers[0]);
        for (hop, (title, object)) in q.supporting_titles.iter().zip(next).enumerate() {
            let inner = hop + 1 < q.supporting_titles.len();
            let named = w.relation_naming(title, object, inner).unwrap_or_else(|| panic!("{q:?}"));
            assert_eq!(w.follow(title, &[named]).as_ref(), Some(object), "{q:?}");
            if named != relations[hop] {
                assert_eq!(w.follow(title, &[relations[hop]]).as_ref(), Some(object), "{q:?}");
            }
        }
    }
    let passages: HashMap<&str, String> = w.passages().collect();
    let q = w
        .questions()
        .iter()
        .find(|q| q.hops == 2 && !passages[q.supporting_titles[0].as_str()].contains(&q.golden_answers[0]))
        .unwrap();
    let (start, answer) = (&q.supporting_titles[0], &q.golden_answers[0]);
    // Not stated by the chain's start; a year is never an inner hop; unknown names.
    assert_eq!(w.relation_naming(start, answer, false), None);
    assert_eq!(w.relation_naming("No Such Entity", answer, false), None);
    assert_eq!(World::compose_question(start, &["birth year", "country"]), None);
    assert_eq!(World::compose_question(start, &["favourite colour"]), None);
    assert_eq!(w.follow(start, &["founding year"]), None);
    // What a proposer's question asks: one hop short asks for the chain's next entity; a start
    // the world lacks, or wording outside its grammar, asks nothing it can tell.
    let relations: Vec<&str> = q.supporting_relations.iter().map(String::as_str).collect();
    let short = World::compose_question(start, &relations[..1]).unwrap();
    assert_eq!(w.answer_to(&short), Some((q.supporting_titles[1].clone(), 1)));
    assert_eq!(w.answer_to(&World::compose_question("Nobody Anywhere", &relations).unwrap()), None);
    assert_eq!(w.answer_to(&format!("Tell me: {}", q.question)), None);
    // Text outside the grammar is not read, however close.
    assert_eq!(World::read_question("In which country is ?"), None);
    assert_eq!(World::read_question("In which country was Orla born?"), None);
    assert_eq!(World::read_question("Where is the city where Orla was born?"), None);
    assert_eq!(
        World::read_question("Who is the mother of the employer of Orla Veny married to?"),
        Some(("Orla Veny".to_string(), vec!["employer", "mother", "spouse"])),
        "the reading from the shortest name"
    );
    assert_eq!(
        World::read_question("Who founded the employer of the spouse of The Glass Meridian?"),
        Some(("The Glass Meridian".to_string(), vec!["spouse", "employer", "founder"]))
    );
}
