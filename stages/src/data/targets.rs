//! The proposer's target answers from question sets (`sesa data targets`): what the `propose`
//! stage reads, one `{"answer", "hops"}` per line.
//!
//! SSP trains its proposer on a list of answers, each with the number of searches its question
//! should need, and no questions. Here the answers come from any FlashRAG or verl question set:
//! the first gold answer of each question, each answer once, in a seeded shuffled order (the
//! `propose` stage takes them in file order, wrapping around). A question set that records its
//! hop counts (a generated world does) keeps them; otherwise each answer draws one uniformly
//! from a range, as SSP's randomised hop counts suggest.

use std::collections::HashSet;
use std::ops::RangeInclusive;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::datasets::Question;
use super::metrics::normalize_answer;

/// One line of a targets file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerTarget {
    /// The answer the proposer must write a question for.
    pub answer: String,
    /// Searches the question should need.
    pub hops: u8,
}

/// How answers become targets.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    /// The hop counts drawn for questions that do not record theirs.
    pub hops: RangeInclusive<u8>,
    /// The seed of the order and of the drawn hop counts.
    pub seed: u64,
    /// At most this many targets.
    pub limit: Option<usize>,
}

/// What came out of the question sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Targets {
    /// The targets, in their shuffled order.
    pub targets: Vec<AnswerTarget>,
    /// Questions whose answer was already taken (compared as exact match compares).
    pub duplicates: usize,
    /// Questions without a usable gold answer.
    pub unanswered: usize,
}

/// Parses a hop range: `3` or `1-4`, within 1 to 10.
pub fn parse_hops(text: &str) -> Result<RangeInclusive<u8>, String> {
    let bad = || format!("`{text}`: expected a hop count or a range such as `1-4`, between 1 and 10");
    let (low, high) = match text.split_once('-') {
        Some((low, high)) => (low.trim(), high.trim()),
        None => (text.trim(), text.trim()),
    };
    let low: u8 = low.parse().map_err(|_| bad())?;
    let high: u8 = high.parse().map_err(|_| bad())?;
    if low == 0 || high > 10 || low > high {
        return Err(bad());
    }
    Ok(low..=high)
}

/// The targets of `questions`: each distinct first gold answer once, shuffled, with hop counts.
pub fn targets_from(questions: &[Question], options: &TargetOptions) -> Targets {
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    let mut seen = HashSet::new();
    let (mut duplicates, mut unanswered) = (0, 0);
    let mut targets = Vec::new();
    for question in questions {
        let Some(answer) = question.golden_answers.iter().map(|a| a.trim()).find(|a| !a.is_empty()) else {
            unanswered += 1;
            continue;
        };
        if !seen.insert(normalize_answer(answer)) {
            duplicates += 1;
            continue;
        }
        // Drawn for every answer, recorded or not, so that one question's hop count does not
        // shift the draws of all that follow.
        let drawn = rng.random_range(options.hops.clone());
        targets.push(AnswerTarget { answer: answer.to_string(), hops: question.hops.unwrap_or(drawn) });
    }
    targets.shuffle(&mut rng);
    if let Some(limit) = options.limit {
        targets.truncate(limit);
    }
    Targets { targets, duplicates, unanswered }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(answer: &str, hops: Option<u8>) -> Question {
        Question {
            id: answer.into(),
            question: format!("what is {answer}?"),
            golden_answers: vec![answer.into(), "other".into()],
            hops,
            supporting_titles: Vec::new(),
            supporting_relations: Vec::new(),
        }
    }

    #[test]
    fn each_answer_is_a_target_once_with_its_recorded_or_a_drawn_hop_count() {
        let questions = vec![
            question("Paris", None),
            question("the Paris", None),
            question("Lyon", Some(3)),
            question("  ", None),
            question("Nice", None),
        ];
        let options = TargetOptions { hops: 2..=2, seed: 7, limit: None };
        let out = targets_from(&questions, &options);
        assert_eq!((out.duplicates, out.unanswered), (1, 0));
        let mut got: Vec<(String, u8)> = out.targets.iter().map(|t| (t.answer.clone(), t.hops)).collect();
        got.sort();
        // A blank first answer falls back to the next gold answer.
        assert_eq!(got, vec![("Lyon".into(), 3), ("Nice".into(), 2), ("Paris".into(), 2), ("other".into(), 2)]);
        assert_eq!(targets_from(&questions, &options), out, "the same seed gives the same file");
        let limited = targets_from(&questions, &TargetOptions { limit: Some(2), ..options });
        assert_eq!(limited.targets, out.targets[..2]);
    }

    #[test]
    fn hop_ranges_parse_within_bounds() {
        assert_eq!(parse_hops("1-4"), Ok(1..=4));
        assert_eq!(parse_hops("3"), Ok(3..=3));
        for bad in ["0", "4-1", "1-11", "two", ""] {
            assert!(parse_hops(bad).is_err(), "{bad}");
        }
    }
}
