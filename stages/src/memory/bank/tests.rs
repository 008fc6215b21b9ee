use super::*;

fn config() -> BankConfig {
    BankConfig {
        capacity: 3,
        dedup_by: DedupBy::Embedding,
        dedup_threshold: 0.8,
        evict_min_retrievals: 3,
        usage: UsageRule::Rollouts,
    }
}

fn text(description: &str) -> SkillText {
    SkillText { description: description.into(), trigger: "t".into(), avoid: Vec::new(), query_template: "q".into() }
}

/// A unit vector in the plane spanned by axes 0 and 1 at `degrees` from axis 0.
fn at(degrees: f32) -> Vec<f32> {
    let r = degrees.to_radians();
    vec![r.cos(), r.sin(), 0.0]
}

fn seed() -> SkillMeta {
    SkillMeta { seed: true, ..SkillMeta::default() }
}

fn ids(bank: &SkillBank) -> Vec<&str> {
    bank.skills().iter().map(|s| s.id.as_str()).collect()
}

#[test]
fn top_k_is_exact_best_first_with_ties_to_the_older_skill() {
    let mut bank = SkillBank::new(BankConfig { capacity: 10, dedup_threshold: 1.0, ..config() });
    for (id, degrees) in [("a", 60.0), ("b", 10.0), ("c", 10.0), ("d", 90.0)] {
        bank.admit(id.into(), text(id), SkillMeta::default(), at(degrees));
    }
    let found: Vec<(&str, String)> =
        bank.top_k(&at(0.0), 3).into_iter().map(|(s, c)| (s.id.as_str(), format!("{c:.3}"))).collect();
    assert_eq!(found, vec![("b", "0.985".into()), ("c", "0.985".into()), ("a", "0.500".into())]);
    assert_eq!(bank.top_k(&at(0.0), 10).len(), 4);
    assert!(SkillBank::new(config()).top_k(&at(0.0), 3).is_empty());
}

#[test]
fn a_candidate_above_the_threshold_is_a_duplicate_with_its_nearest_skill() {
    let mut bank = SkillBank::new(config());
    bank.admit("a".into(), text("a"), SkillMeta::default(), at(0.0));
    // cos 30° = 0.866 > 0.8: rejected. cos 40° = 0.766 ≤ 0.8: admitted.
    let events = bank.admit("b".into(), text("b"), SkillMeta::default(), at(30.0));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, SkillEventKind::RejectedDuplicate);
    assert_eq!(events[0].nearest.as_deref(), Some("a"));
    assert_eq!(format!("{:.3}", events[0].similarity.unwrap()), "0.866");
    assert_eq!(events[0].reason, "cosine 0.866 to `a` is above the dedup threshold 0.8");
    let events = bank.admit("c".into(), text("c"), SkillMeta::default(), at(40.0));
    assert_eq!(events[0].kind, SkillEventKind::Added);
    assert_eq!(ids(&bank), ["a", "c"]);
}

/// Two rule-induced skills of patterns that differ in relation words only, at the cosine MiniLM
/// gives them, and one pattern's skill induced again from a success that phrased a search
/// otherwise.
#[test]
fn by_trigger_a_duplicate_has_the_same_trigger() {
    let mut bank = SkillBank::new(BankConfig { dedup_by: DedupBy::Trigger, ..config() });
    let skill = |trigger: &str, template: &str| SkillText {
        description: format!("Search one hop at a time: {template}"),
        trigger: trigger.into(),
        avoid: Vec::new(),
        query_template: template.into(),
    };
    let employer = skill("Where is the employer of the spouse of <entity> headquartered?", "<entity> spouse employer");
    let author = skill("Where was the author of <entity> born?", "<entity> author birthplace");
    bank.admit("a".into(), employer.clone(), SkillMeta::default(), at(0.0));
    let events = bank.admit("b".into(), author.clone(), SkillMeta::default(), at(25.0));
    assert_eq!(events[0].kind, SkillEventKind::Added, "cosine 0.906, yet another pattern");
    let again = SkillText { query_template: "<entity> husband employer".into(), ..employer.clone() };
    let events = bank.admit("c".into(), again, SkillMeta::default(), at(60.0));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, SkillEventKind::RejectedDuplicate);
    assert_eq!((events[0].nearest.as_deref(), events[0].similarity), (Some("a"), None));
    assert_eq!(events[0].reason, "`a` has the same trigger");
    let other_trigger = SkillText { trigger: "Who employs the spouse of <entity>?".into(), ..employer };
    assert_eq!(bank.admit("d".into(), other_trigger, SkillMeta::default(), at(0.0))[0].kind, SkillEventKind::Added);
    assert_eq!(ids(&bank), ["a", "b", "d"]);
}

#[test]
fn at_capacity_the_lowest_utility_non_seed_skill_makes_room() {
    let mut bank = SkillBank::new(config());
    // A seed that would be evicted first if it were not a seed.
    bank.admit("seed".into(), text("seed"), SkillMeta { harms: 10, retrievals: 10, ..seed() }, at(0.0));
    bank.admit("good".into(), text("good"), SkillMeta { helps: 5, ..SkillMeta::default() }, at(45.0));
    bank.admit("bad".into(), text("bad"), SkillMeta { harms: 1, ..SkillMeta::default() }, at(90.0));
    let events = bank.admit("new".into(), text("new"), SkillMeta::default(), at(135.0));
    let kinds: Vec<_> = events.iter().map(|e| (e.kind, e.skill_id.as_str())).collect();
    assert_eq!(kinds, [(SkillEventKind::Evicted, "bad"), (SkillEventKind::Added, "new")]);
    assert_eq!(events[0].reason, "lowest utility (-1) at capacity, to admit `new`");
    assert_eq!(ids(&bank), ["seed", "good", "new"]);
}

#[test]
fn a_bank_full_of_seeds_rejects_new_skills() {
    let mut bank = SkillBank::new(BankConfig { capacity: 1, ..config() });
    bank.admit("seed".into(), text("seed"), seed(), at(0.0));
    let events = bank.admit("new".into(), text("new"), SkillMeta::default(), at(90.0));
    assert_eq!(events[0].kind, SkillEventKind::Rejected);
    assert_eq!(events[0].reason, "the bank is at capacity (1) with seed skills only");
    assert_eq!(ids(&bank), ["seed"]);
}

#[test]
fn usage_rules_credit_retrievals_helps_and_harms() {
    let question = |id: &str, skill_ids: [&str; 2], successes, without| QuestionUsage {
        question_id: id.into(),
        skill_ids: skill_ids.map(String::from).to_vec(),
        successes,
        rollouts: 3,
        without,
    };
    // q1: 1 of 3 with its skills, 0 of 2 without; q2: 1 of 3 with, 2 of 2 without; q3 was
    // never answered without them.
    let usage = [
        question("q1", ["a", "b"], 1, Some((0, 2))),
        question("q2", ["a", "gone"], 1, Some((2, 2))),
        question("q3", ["b", "gone"], 3, None),
    ];
    let counts = |rule| {
        let mut bank = SkillBank::new(BankConfig { usage: rule, capacity: 10, ..config() });
        bank.admit("a".into(), text("a"), SkillMeta::default(), at(0.0));
        bank.admit("b".into(), text("b"), SkillMeta::default(), at(90.0));
        bank.record_usage(&usage);
        bank.skills().iter().map(|s| (s.meta.retrievals, s.meta.helps, s.meta.harms)).collect::<Vec<_>>()
    };
    assert_eq!(counts(UsageRule::Rollouts), [(2, 2, 4), (2, 4, 2)]);
    assert_eq!(counts(UsageRule::Majority), [(2, 0, 2), (2, 1, 1)]);
    // The difference the skills made: q1 helped, q2 harmed, q3 has no contrast.
    assert_eq!(counts(UsageRule::Counterfactual), [(2, 1, 1), (2, 1, 0)]);
}

#[test]
fn only_counterfactual_usage_is_judged_on_reused_and_substitute_questions() {
    let judged = |rule: UsageRule| -> Vec<bool> {
        ["proposed", "reused", "substitute", "dummy"].into_iter().map(|source| rule.judges(source)).collect()
    };
    assert_eq!(judged(UsageRule::Rollouts), [true, false, false, false]);
    assert_eq!(judged(UsageRule::Majority), [true, false, false, false]);
    assert_eq!(judged(UsageRule::Counterfactual), [true, true, true, false]);
}

#[test]
fn harmful_non_seed_skills_are_evicted_after_enough_retrievals() {
    let mut bank = SkillBank::new(BankConfig { capacity: 10, dedup_threshold: 1.0, ..config() });
    let meta = |retrievals, helps, harms, seed| SkillMeta { retrievals, helps, harms, seed, ..SkillMeta::default() };
    bank.admit("harmful".into(), text("h"), meta(3, 1, 2, false), at(0.0));
    bank.admit("young".into(), text("y"), meta(2, 0, 2, false), at(10.0));
    bank.admit("even".into(), text("e"), meta(5, 2, 2, false), at(20.0));
    bank.admit("seed".into(), text("s"), meta(9, 0, 9, true), at(30.0));
    let events = bank.evict_harmful();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].skill_id, "harmful");
    assert_eq!(events[0].reason, "helps − harms = 1 − 2 < 0 after 3 retrievals");
    assert_eq!(ids(&bank), ["young", "even", "seed"]);
}

#[test]
fn each_commit_of_changes_is_one_version() {
    let mut bank = SkillBank::new(config());
    assert_eq!(bank.commit(), None);
    bank.admit("a".into(), text("a"), SkillMeta::default(), at(0.0));
    bank.admit("b".into(), text("b"), SkillMeta::default(), at(90.0));
    assert_eq!(bank.skills()[1].meta.version_added, 1);
    assert_eq!(bank.commit(), Some(1));
    assert_eq!(bank.commit(), None);
    bank.admit("dup".into(), text("dup"), SkillMeta::default(), at(1.0));
    assert_eq!(bank.commit(), None, "a rejected candidate changes nothing");
    bank.record_usage(&[QuestionUsage {
        question_id: "q".into(),
        skill_ids: vec!["a".into()],
        successes: 0,
        rollouts: 1,
        without: None,
    }]);
    assert_eq!(bank.commit(), Some(2));
    assert_eq!(bank.version(), 2);
}

#[test]
fn an_id_already_in_the_bank_is_rejected() {
    let mut bank = SkillBank::new(config());
    bank.admit("a".into(), text("a"), SkillMeta::default(), at(0.0));
    let events = bank.admit("a".into(), text("other"), SkillMeta::default(), at(90.0));
    assert_eq!(events[0].kind, SkillEventKind::Rejected);
    assert_eq!(bank.len(), 1);
}
