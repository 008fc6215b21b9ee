use super::*;
use crate::data::world::{World, WorldConfig};

fn record(
    id: &str,
    question: &str,
    target: &str,
    predicted: Option<&str>,
    searches: &[&str],
    solved: &[&str],
) -> FailureRecord {
    FailureRecord {
        id: id.into(),
        question: question.into(),
        target: target.into(),
        predicted: predicted.map(str::to_string),
        skill_ids: vec![],
        digest: String::new(),
        searches: searches.iter().map(|s| s.to_string()).collect(),
        solved_searches: solved.iter().map(|s| s.to_string()).collect(),
    }
}

const CHAIN: &[&str] = &["Vexa Labs founder", "Orin Kassel birthplace", "Tanmore country"];

#[test]
fn a_three_hop_group_gives_its_pattern_its_chain_and_where_the_failures_stopped() {
    let question = "In which country is the city where the founder of Vexa Labs was born?";
    let early = record("f1-0-0", question, "Quorvia", Some("Orin Kassel"), &["Vexa Labs founder"], CHAIN);
    let wrong = record("f1-0-1", question, "Quorvia", None, &["Vexa Labs founder", "Orin Kassel employer"], CHAIN);
    let skill = induce(&[&early, &wrong], Induction::Rules).expect("a skill");
    assert_eq!(skill.trigger, "In which country is the city where the founder of <entity> was born?");
    assert_eq!(skill.query_template, "<entity> founder → <result 1> birthplace → <result 2> country");
    assert_eq!(
        skill.description,
        "Search one hop at a time, 3 searches: \"<entity> founder\", then \"<result 1> birthplace\", then \
         \"<result 2> country\"; answer with what the last one finds."
    );
    assert_eq!(
        skill.avoid,
        vec![
            "Stopping after 1 search: this question needs 3.".to_string(),
            "Stopping after 2 searches: this question needs 3.".to_string(),
            "Answering with <result 1>, an intermediate entity, instead of searching on from it.".to_string(),
        ]
    );
    let only_wrong = induce(&[&wrong], Induction::Rules).unwrap();
    assert!(
        only_wrong
            .avoid
            .contains(&"Searching \"<result 1> employer\" where \"<result 1> birthplace\" was needed.".into()),
        "{:?}",
        only_wrong.avoid
    );
    assert!(only_wrong.avoid.contains(&"Ending without an answer: answer with what the last search found.".into()));
}

#[test]
fn an_induced_skill_reads_as_its_chain_for_questions_of_its_own_pattern() {
    let question = "In which country is the city where the founder of Vexa Labs was born?";
    let early = record("f1-0-0", question, "Quorvia", Some("Orin Kassel"), &["Vexa Labs founder"], CHAIN);
    let skill = induce(&[&early], Induction::Rules).expect("a skill");
    let chain = |skill: &SkillText, question: &str| ChainReader::new(&[skill]).read(question);
    let other = "In which country is the city where the founder of Mimi Observatory was born?";
    let read = chain(&skill, other).expect("the same pattern");
    assert_eq!(read.start, "Mimi Observatory");
    assert_eq!(read.relations, ["founder", "birthplace", "country"]);
    // Another template, even one nested in this one, is not this skill's chain.
    assert_eq!(chain(&skill, "In which city was the founder of Mimi Observatory born?"), None);
    assert_eq!(chain(&skill, "In which country is Mimi Observatory?"), None);
    // Two entities: no single start.
    let two = SkillText { trigger: "Did <entity 1> marry <entity 2>?".into(), ..skill.clone() };
    assert_eq!(chain(&two, "Did Orla Veny marry Tam Kassel?"), None);
    // Searches not written one hop at a time ("founder of <entity>", a step that skips a
    // result) are not a chain.
    for template in ["founder of <entity> → <result 1> birthplace", "<entity> founder → <result 2> country", "<entity>"]
    {
        let odd = SkillText { query_template: template.into(), ..skill.clone() };
        assert_eq!(chain(&odd, other), None, "{template}");
    }
    // An episodic skill's trigger is a whole question, never a pattern.
    let solved = record("f1-0-1", question, "Quorvia", None, &[], CHAIN);
    let episodic = induce(&[&solved], Induction::Episodic).unwrap();
    assert_eq!(chain(&episodic, other), None);
}

#[test]
fn skills_of_shallower_questions_compose_the_chain_of_a_deeper_one() {
    let skill = |trigger: &str, template: &str| SkillText {
        description: "Search one hop at a time.".into(),
        trigger: trigger.into(),
        avoid: vec![],
        query_template: template.into(),
    };
    let bank = [
        skill("In which city was <entity> born?", "<entity> birthplace"),
        skill("In which city was the mother of <entity> born?", "<entity> mother → <result 1> birthplace"),
        // The two wrappers inside it come apart once "the mother of" is known.
        skill(
            "In which city was the spouse of the mother of <entity> born?",
            "<entity> mother → <result 1> spouse → <result 2> birthplace",
        ),
        skill("In which country is <entity>?", "<entity> country"),
        skill("In which country is the city where <entity> was born?", "<entity> birthplace → <result 1> country"),
        skill("Who founded <entity>?", "<entity> founder"),
    ];
    let bank: Vec<&SkillText> = bank.iter().collect();
    // Four hops, deeper than every skill, read as the world's grammar reads it.
    let question = "In which country is the city where the spouse of the mother of Orla Veny was born?";
    let reader = ChainReader::new(&bank);
    let composed = reader.read(question).expect("a chain from known parts");
    let (start, relations) = World::read_question(question).unwrap();
    assert_eq!(composed.start, start);
    assert_eq!(composed.relations, relations);
    assert_eq!(composed.relations, ["mother", "spouse", "birthplace", "country"]);
    // Its template (the one that needs the fewest wrappers: the country of the city where X was
    // born) and the teachers of its wrappers (the spouse's came apart from a three-hop skill).
    assert_eq!(composed.skills, [0, 1, 2, 4]);
    assert!(!composed.skills.contains(&5), "the founder skill plays no part");
    // A wrapper no skill teaches ("the founder of") leaves no single name at the centre.
    assert_eq!(reader.read("In which country is the city where the founder of Orla Veny was born?"), None);
    assert_eq!(reader.read("Which river flows through Orla Veny?"), None);
    // A name that opens with an article is the question's name all the same.
    let titled = reader.read("In which city was the mother of The Hollow Winter born?").expect("a title");
    assert_eq!((titled.start.as_str(), titled.relations.len()), ("The Hollow Winter", 2));
}

#[test]
fn a_failure_that_answered_with_a_query_does_not_mask_the_relation() {
    // Seen in a run: the answer "Anjaline Battaglia birthplace" masked "birthplace" everywhere.
    let question = "In which city was Wenor Axprapra born?";
    let failure = record(
        "f2-0-0",
        question,
        "Enrislu",
        Some("Anjaline Battaglia birthplace"),
        &["Wenor Axprapra birthplace", "Axfen Lurismer birthplace"],
        &["Wenor Axprapra birthplace"],
    );
    let skill = induce(&[&failure], Induction::Rules).unwrap();
    assert_eq!(skill.query_template, "<entity> birthplace");
    assert_eq!(skill.trigger, "In which city was <entity> born?");
}

#[test]
fn quoted_titles_and_joined_names_are_masked_whole() {
    let question = "Which came to market first, \"Hey Pa! There's a Goat on the Roof\" or \"Poleconomy\"";
    let group = record(
        "f2-1-0",
        question,
        "Hey Pa! There's a Goat on the Roof",
        Some("Poleconomy"),
        &["Poleconomy release"],
        &["Hey Pa! There's a Goat on the Roof release year", "Poleconomy release year"],
    );
    let skill = induce(&[&group], Induction::Rules).expect("a skill");
    assert_eq!(skill.trigger, "Which came to market first, <entity 1> or <entity 2>");
    assert_eq!(skill.query_template, "<entity 1> release year → <entity 2> release year");
    assert_eq!(
        skill.avoid,
        vec![
            "Stopping after 1 search: this question needs 2.".to_string(),
            "Searching \"<entity 2> release\" where \"<entity 1> release year\" was needed.".to_string()
        ],
        "a comparison's answer is one of its entities: answering with one is no pitfall"
    );
    let bank = "Which magazine was started first, Arthur's Magazine or First for Women?";
    let group = record("f2-2-0", bank, "Arthur's Magazine", None, &[], &["Arthur's Magazine", "First for Women"]);
    let skill = induce(&[&group], Induction::Rules).expect("a skill");
    assert_eq!(skill.trigger, "Which magazine was started first, <entity 1> or <entity 2>?");
    assert_eq!(skill.query_template, "<entity 1> → <entity 2>");
}

#[test]
fn no_success_to_contrast_gives_no_skill_and_a_batch_says_why() {
    let question = "Who founded Vexa Labs?";
    let lone = record("f3-0-0", question, "Orin Kassel", None, &["Vexa Labs"], &[]);
    assert_eq!(induce(&[&lone], Induction::Rules), None);
    let other = record("f3-1-0", "Who wrote Tanmore Tales?", "Ada Vel", None, &[], &["Tanmore Tales author"]);
    let out = induce_batch(&[lone, other.clone(), other], 5, Induction::Rules);
    assert_eq!(out.candidates.len(), 1, "one skill per question");
    assert_eq!(out.candidates[0].trigger, "Who wrote <entity>?");
    assert_eq!(out.malformed, vec!["\"f3-0-0\": no successful rollout with a search to learn from".to_string()]);
    assert_eq!(
        induce_batch(&[record("a", "Who wrote X?", "Y", None, &[], &["X author"])], 0, Induction::Rules).candidates,
        vec![]
    );
}

#[test]
fn an_episodic_skill_is_the_successful_rollout_as_it_was_without_the_answer() {
    let question = "In which country is the city where the founder of Vexa Labs was born?";
    let early = record("f1-0-0", question, "Quorvia", Some("Orin Kassel"), &["Vexa Labs founder"], CHAIN);
    let skill = induce(&[&early], Induction::Episodic).expect("an exemplar");
    assert_eq!(skill.trigger, question);
    assert_eq!(skill.query_template, "Vexa Labs founder → Orin Kassel birthplace → Tanmore country");
    assert!(skill.description.starts_with("A similar question was solved by searching \"Vexa Labs founder\", then"));
    assert!(skill.avoid.is_empty());
    let checked = record("f1-0-1", question, "Quorvia", None, &[], &["Vexa Labs founder", "Quorvia capital"]);
    assert_eq!(induce(&[&checked], Induction::Episodic), None, "a search that names the answer is not kept");
}

/// The property the memory relies on: whatever the question, a skill never shows its answer,
/// an entity on its chain or what the failures answered.
fn assert_no_leak(skill: &SkillText, names: &[String], question: &str) {
    let rendered = skill.render();
    for name in names {
        assert!(!contains_answer(&rendered, name), "{name:?} of {question:?} in {rendered:?}");
    }
}

#[test]
fn skills_of_world_questions_hold_no_entity_and_no_answer() {
    let world = World::generate(WorldConfig { seed: 5, entities: 400, questions: 300 });
    let mut made = 0;
    for q in world.questions() {
        let solved: Vec<String> =
            q.supporting_titles.iter().zip(&q.supporting_relations).map(|(t, r)| format!("{t} {r}")).collect();
        let solved: Vec<&str> = solved.iter().map(String::as_str).collect();
        let said = q.supporting_titles.get(1).map(String::as_str);
        let failure = record("f", &q.question, &q.golden_answers[0], said, &solved[..1], &solved);
        let skill = induce(&[&failure], Induction::Rules).unwrap_or_else(|| panic!("no skill for {:?}", q.question));
        let mut names = q.supporting_titles.clone();
        names.extend(q.golden_answers.iter().cloned());
        assert_no_leak(&skill, &names, &q.question);
        assert!(skill.trigger.contains("<entity>"), "{:?}", skill.trigger);
        let capitalised = |w: &str| w.chars().any(char::is_uppercase);
        assert!(!skill.query_template.split_whitespace().any(capitalised), "{:?}", skill.query_template);
        assert_eq!(skill.query_template.matches('→').count(), q.hops as usize - 1, "{:?}", skill.query_template);
        made += 1;
    }
    assert_eq!(made, 300);
}

#[test]
fn skills_of_hotpotqa_questions_hold_no_entity_and_no_answer() {
    let Some(pack) = crate::testing::shared_data("hotpotqa") else { return };
    let text = std::fs::read_to_string(pack.join("questions.jsonl")).unwrap();
    let (mut made, mut refused) = (0, 0);
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let question = row["question"].as_str().unwrap();
        let answers: Vec<String> =
            row["golden_answers"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
        let titles: Vec<String> =
            row["supporting_titles"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().into()).collect();
        // A solver that searched each supporting title; a failure that stopped after the first
        // and answered with it.
        let solved: Vec<&str> = titles.iter().map(String::as_str).collect();
        let failure = record("f", question, &answers[0], Some(&titles[0]), &solved[..1], &solved);
        let Some(skill) = induce(&[&failure], Induction::Rules) else {
            refused += 1;
            continue;
        };
        let mut names: Vec<String> = titles.into_iter().filter(|t| t.chars().any(char::is_uppercase)).collect();
        names.extend(answers.into_iter().filter(|a| !["yes", "no"].contains(&a.as_str())));
        assert_no_leak(&skill, &names, question);
        made += 1;
    }
    assert!(made > 900 && refused < 100, "{made} skills made, {refused} refused as leaks");
}
