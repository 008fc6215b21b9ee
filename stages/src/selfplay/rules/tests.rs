use super::*;

fn failure(id: &str) -> FailureRecord {
    FailureRecord {
        id: id.into(),
        question: "q".into(),
        target: "t".into(),
        predicted: None,
        skill_ids: Vec::new(),
        digest: String::new(),
        searches: Vec::new(),
        solved_searches: Vec::new(),
    }
}

#[test]
fn frontier_reward_has_exact_values() {
    let shape = ProposerReward::Frontier(FrontierReward { lambda: 0.5, low: 0.0, high: 1.0 });
    let values: Vec<f64> = [0.0, 0.2, 0.5, 0.8, 1.0].iter().map(|&p| shape.reward(p)).collect();
    assert_eq!(values, [-0.5, 4.0 * 0.2 * (1.0 - 0.2), 1.0, 4.0 * 0.8 * (1.0 - 0.8), -0.5]);
    let shifted = ProposerReward::Frontier(FrontierReward { lambda: 1.0, low: 0.1, high: 0.9 });
    assert_eq!(shifted.reward(0.4), 4.0 * 0.5 * 0.5);
}

#[test]
fn adversarial_and_intermediate_rewards_have_exact_values() {
    let adversarial: Vec<f64> = [0.0, 0.2, 1.0].iter().map(|&p| ProposerReward::Adversarial.reward(p)).collect();
    assert_eq!(adversarial, [1.0, 0.8, 0.0]);
    let shape = ProposerReward::Intermediate(IntermediateReward { left: 0.0, right: 1.0 });
    let intermediate: Vec<f64> = [0.0, 0.5, 1.0].iter().map(|&p| shape.reward(p)).collect();
    assert_eq!(intermediate, [0.0, 1.0, 0.0]);
}

#[test]
fn solver_reward_is_em_then_judge_with_the_anti_spam_rule() {
    let golds = vec!["Paris".to_string()];
    assert_eq!(solver_reward("", None, &golds, Some(true)), 0.0);
    assert_eq!(solver_reward("<answer>the Paris</answer>", Some("the Paris"), &golds, None), 1.0);
    assert_eq!(solver_reward("<answer>Lyon</answer>", Some("Lyon"), &golds, None), 0.0);
    assert_eq!(solver_reward("<answer>City of Paris</answer>", Some("City of Paris"), &golds, Some(true)), 1.0);
    let spam = "<answer>x</answer>".repeat(11) + "<answer>Paris</answer>";
    assert_eq!(solver_reward(&spam, Some("Paris"), &golds, None), 0.25);
    let ten = "<answer>x</answer>".repeat(9) + "<answer>Paris</answer>";
    assert_eq!(solver_reward(&ten, Some("Paris"), &golds, None), 1.0);
}

#[test]
fn only_searches_past_the_hop_count_cost_reward() {
    assert_eq!(excess_search_factor(0.1, 2, Some(2)), 1.0, "as many searches as hops");
    assert_eq!(excess_search_factor(0.1, 1, Some(3)), 1.0, "fewer searches cost nothing");
    assert!((excess_search_factor(0.1, 3, Some(1)) - 0.81).abs() < 1e-12, "two past the need");
    assert_eq!(excess_search_factor(0.1, 9, None), 1.0, "no hop count, no cost");
    assert_eq!(excess_search_factor(0.0, 9, Some(1)), 1.0, "the default changes nothing");
}

#[test]
fn missteps_are_searches_past_the_hop_count_and_answers_before_it() {
    use LastTurn::{Answered, Searched, Undecided};
    assert_eq!(missteps(2, Answered, Some(2)), [0u32; 0], "two searches, then the answer");
    assert_eq!(missteps(4, Answered, Some(1)), [1, 2, 3], "every search after the first");
    assert_eq!(missteps(1, Answered, Some(3)), [1], "the answer after one of three searches");
    assert_eq!(missteps(0, Answered, Some(1)), [0], "an answer without searching");
    assert_eq!(missteps(1, Undecided, Some(3)), [0u32; 0], "a format error decided nothing");
    assert_eq!(missteps(3, Undecided, Some(2)), [2], "the third search, though no answer came");
    assert_eq!(missteps(2, Searched, Some(2)), [2], "a third search the turn limit left unrun");
    assert_eq!(missteps(1, Searched, Some(3)), [0u32; 0], "a second search of three, unrun");
    assert_eq!(missteps(5, Answered, None), [0u32; 0], "no hop count, nothing to judge by");
}

#[test]
fn validity_rules_name_the_reason() {
    let rules = ValidityRules::default();
    let long = "Which city was the birthplace of the person who founded the company that built it?";
    let check = |q: Option<&str>, target: &str, searches: &[&str], materials: &str| {
        rules.check(q, target, 2, searches, materials).map_err(|e| e.to_string())
    };
    assert_eq!(check(Some(long), "Orla", &["a", "b"], "m"), Ok(long.to_string()));
    assert_eq!(
        check(Some(&format!(" <answer>{long}</answer")), "Orla", &["a", "b"], "m"),
        Ok(long.to_string()),
        "stray answer tags are stripped"
    );
    assert_eq!(check(None, "Orla", &["a", "b"], "m"), Err("no <question> in the proposer's output".into()));
    assert_eq!(check(Some("Too short?"), "Orla", &["a", "b"], "m"), Err("2 words, fewer than 10".into()));
    assert_eq!(check(Some("Short"), "Orla", &["a", "b"], "m"), Err("5 characters, outside 10..=1000".into()));
    assert_eq!(
        check(Some(&format!("{long} Is it orla?")), "Orla", &["a", "b"], "m"),
        Err("the question contains the answer".into())
    );
    assert_eq!(check(Some(long), "Orla", &["a", "b"], " \n"), Err("no retrieved materials".into()));
    assert_eq!(check(Some(long), "Orla", &["a", "a"], "m"), Err("repeated search queries".into()));
    assert_eq!(check(Some(long), "Orla", &["a"], "m"), Err("1 searches, fewer than 2".into()));
}

/// SSP's bounds hold at their edges: ten words and two distinct searches pass, one fewer fails.
#[test]
fn validity_rules_hold_at_their_edges() {
    let rules = ValidityRules::default();
    let ten = "Which city was the birthplace of the founder of Zelprabel?";
    let nine = "Which city was the birthplace of the founder Zelprabel?";
    assert!(rules.check(Some(ten), "Orla", 2, &["a", "b"], "m").is_ok());
    assert_eq!(rules.check(Some(nine), "Orla", 2, &["a", "b"], "m"), Err("9 words, fewer than 10".into()));
    assert_eq!(rules.check(Some(ten), "Orla", 2, &["a", "a", "b"], "m"), Err("repeated search queries".into()));
    let long = "x".repeat(1001);
    let words = format!("{long} a b c d e f g h i");
    assert_eq!(
        rules.check(Some(&words), "Orla", 2, &["a", "b"], "m"),
        Err("1019 characters, outside 10..=1000".into())
    );
}

/// With `searches_per_hop`, a proposal asked for four hops needs four distinct searches; one
/// asked for fewer hops than `min_searches` still needs `min_searches`.
#[test]
fn searches_per_hop_asks_one_distinct_search_per_hop_asked() {
    let ten = "Which city was the birthplace of the founder of Zelprabel?";
    let per_hop = ValidityRules { searches_per_hop: true, ..ValidityRules::default() };
    assert_eq!(per_hop.check(Some(ten), "Orla", 4, &["a", "b", "c"], "m"), Err("3 searches, fewer than 4".into()));
    assert!(per_hop.check(Some(ten), "Orla", 4, &["a", "b", "c", "d"], "m").is_ok());
    assert!(per_hop.check(Some(ten), "Orla", 1, &["a", "b"], "m").is_ok());
    assert_eq!(per_hop.check(Some(ten), "Orla", 1, &["a"], "m"), Err("1 searches, fewer than 2".into()));
    assert!(ValidityRules::default().check(Some(ten), "Orla", 4, &["a", "b"], "m").is_ok(), "SSP's rule: two");
}

#[test]
fn the_queue_never_exceeds_capacity_and_counts_drops() {
    let mut queue = FailureQueue::new(3);
    for i in 0..5 {
        queue.push(failure(&format!("f{i}")));
        assert!(queue.len() <= 3);
    }
    let ids: Vec<&str> = queue.records().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["f2", "f3", "f4"]);
    assert_eq!(queue.dropped(), 2);
    queue.remove(&["f3".to_string()]);
    assert_eq!(queue.len(), 2);
}

#[test]
fn verifier_and_judge_replies_are_read_like_ssp_minus_its_traps() {
    assert_eq!(verifier_answer("The materials say so. Answer: Orla\nmore"), "Orla");
    assert_eq!(verifier_answer("answer：Orla"), "Orla");
    assert_eq!(verifier_answer("Orla"), "Orla");
    // The last stated answer, not the first mention of the word.
    assert_eq!(verifier_answer("The answer is in the materials. ANSWER: Orla"), "Orla");
    // The solver's format, which a policy warm-started on solver demonstrations writes.
    assert_eq!(verifier_answer("The founder of Vexa is Orla. <answer>Brill</answer>"), "Brill");
    // Reasoning that names an entity on the way states no answer: there is none to accept.
    assert_eq!(verifier_answer("The founder of Vexa is Orla. Next, Orla was born in"), "");
    assert_eq!(verifier_answer("Ünïcode answer: Ørla"), "Ørla");
    assert!(judge_says_correct("Correct"));
    assert!(!judge_says_correct("Incorrect"));
    assert!(!judge_says_correct("Wrong"));
}

#[test]
fn a_shape_rejects_the_parameters_of_another() {
    let error = serde_yaml::from_str::<ProposerReward>("{shape: adversarial, lambda: 0.5}").unwrap_err().to_string();
    assert!(error.contains("unknown field `lambda`"), "{error}");
    assert_eq!(serde_yaml::from_str::<ProposerReward>("{shape: adversarial}").unwrap(), ProposerReward::Adversarial);
}
