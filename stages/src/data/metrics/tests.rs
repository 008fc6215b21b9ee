//! Exact values from the Python reference, and properties over random strings.

use rand::{Rng, SeedableRng};

use super::*;

fn golds(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn normalisation_matches_the_python_reference() {
    // Values computed with SQuAD's normalize_answer.
    assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
    assert_eq!(normalize_answer("An apple a day"), "apple day");
    assert_eq!(normalize_answer("theater"), "theater");
    assert_eq!(normalize_answer("U.S.A."), "usa");
    assert_eq!(normalize_answer("rock-and-roll"), "rockandroll");
    assert_eq!(normalize_answer("«the» end"), "« » end");
    assert_eq!(normalize_answer("snake_case the_end"), "snakecase theend");
    assert_eq!(normalize_answer("  "), "");
}

#[test]
fn exact_match_and_f1_take_the_best_gold() {
    assert_eq!(exact_match("the Paris", &golds(&["London", "paris"])), 1.0);
    assert_eq!(exact_match("Paris, France", &golds(&["Paris"])), 0.0);
    assert_eq!(f1_score("Paris, France", &golds(&["Paris"])), 2.0 / 3.0);
    assert_eq!(f1_score("new york city", &golds(&["York", "New York City"])), 1.0);
    assert_eq!(f1_score("a b", &golds(&["c"])), 0.0);
    assert_eq!(f1_score("", &golds(&["c"])), 0.0);
    assert_eq!(f1_score("x", &[]), 0.0);
}

#[test]
fn the_last_answer_is_extracted() {
    assert_eq!(extract_answer("<answer>a</answer> then <answer> b </answer>"), Some("b".into()));
    assert_eq!(extract_answer("<answer>multi\nline</answer>"), Some("multi\nline".into()));
    assert_eq!(extract_answer("<answer>unclosed"), None);
    assert_eq!(extract_answer("<answer>ok</answer><answer>unclosed"), Some("ok".into()));
    assert_eq!(extract_answer("no tags"), None);
}

fn random_text(rng: &mut impl Rng) -> String {
    const PIECES: &[&str] =
        &["the", "a", "an", "Paris", " ", "  ", ",", ".", "é", "Ω", "_", "-", "THE", "x", "\t", "42", "«", "漢"];
    (0..rng.random_range(0..12)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect()
}

#[test]
fn properties_hold_on_random_strings() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..5_000 {
        let text = random_text(&mut rng);
        let normal = normalize_answer(&text);
        assert_eq!(normalize_answer(&normal), normal, "normalisation is idempotent: {text:?}");
        assert!(!normal.starts_with(' ') && !normal.ends_with(' ') && !normal.contains("  "));
        assert!(normal.split(' ').all(|w| !matches!(w, "a" | "an" | "the")), "{text:?} -> {normal:?}");
        let other = random_text(&mut rng);
        let both = golds(&[&other, &text]);
        assert_eq!(exact_match(&text, &both), 1.0, "a text matches itself");
        let f1 = f1_score(&text, &golds(&[&other]));
        assert!((0.0..=1.0).contains(&f1));
        assert!(exact_match(&text, &golds(&[&other])) <= f1.max(if normal.is_empty() { 1.0 } else { 0.0 }) + 1e-12);
        assert_eq!(extract_answer(&format!("{other}<answer>{text}</answer>")), Some(text.trim().to_string()));
    }
}

#[test]
fn an_answer_is_contained_only_as_whole_words() {
    assert!(contains_answer("Fenmermerod is located in the country of Thudrovaia.", "Thudrovaia"));
    assert!(contains_answer("It was founded by Vaquo Vaod in 1802", "the Vaquo Vaod"));
    assert!(!contains_answer("Thudrovaians live there", "Thudrovaia"), "a word's prefix is not the word");
    assert!(!contains_answer("US", "USA"));
    assert!(!contains_answer("anything at all", "the"), "an answer that normalises to nothing matches nothing");
}
