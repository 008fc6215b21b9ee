//! How sequences are laid out as the rows of a micro-batch, and which of them share a prompt.
//!
//! The rollouts of a GRPO group all start with the same prompt (system message, skills,
//! question). Run once per rollout, that prompt is most of a solver step's work on the CPU.
//! Instead, consecutive sequences that begin with the same tokens form a *sharing group*: the
//! common prefix is packed once, as rows of its own, and each sequence packs only its
//! continuation, whose rows attend to the prefix's rows before their own. Causal attention makes
//! this exact: a prefix row never sees what follows it, so its activations are those every
//! sequence would compute, and its gradient is the sum of what each continuation sends back.
//!
//! A prefix never holds a row whose prediction is scored: it stops one token before the first
//! scored position of every sequence in its group, so each sequence's scored rows, and the
//! logits computed from them, are its own.

use std::ops::Range;

/// Shorter common prefixes are not worth splitting a sequence's attention in two.
pub const MIN_SHARED: usize = 16;

/// A run of rows that attends causally to itself after attending to every row of its prefix
/// (`prefix_len` 0: a sequence or a prefix of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First row.
    pub start: usize,
    /// Rows.
    pub len: usize,
    /// First row of the shared prefix it attends to.
    pub prefix_start: usize,
    /// Rows of that prefix.
    pub prefix_len: usize,
}

impl Segment {
    /// Keys each of its rows may see at most: the prefix's and its own.
    pub fn width(&self) -> usize {
        self.prefix_len + self.len
    }
}

/// Where each (segment, head) block of attention probabilities (`len × width`) starts, and
/// the total at the end.
pub(crate) fn prob_offsets(segments: &[Segment], heads: usize) -> Vec<usize> {
    let mut offsets = vec![0];
    for segment in segments {
        for _ in 0..heads {
            offsets.push(offsets.last().copied().unwrap_or(0) + segment.len * segment.width());
        }
    }
    offsets
}

/// Tokens a sequence may share: those before the row that predicts its first scored token.
fn shareable(tokens: &[u32], first_scored: Option<usize>) -> usize {
    first_scored.unwrap_or(tokens.len()).saturating_sub(1)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The sharing groups of `sequences` (their tokens and first scored positions), in order:
/// each a range of consecutive sequences and the prefix length they share (0 for a sequence
/// alone). A group is set by its first two sequences' common prefix; a later sequence joins
/// while it shares all of it, so the prompts of two questions that share only a system message
/// stay apart.
pub fn sharing_groups(sequences: &[(&[u32], Option<usize>)]) -> Vec<(Range<usize>, usize)> {
    let mut groups = Vec::new();
    let mut i = 0;
    while i < sequences.len() {
        let (first, first_scored) = sequences[i];
        let limit = shareable(first, first_scored);
        let pair = |j: usize| {
            let (tokens, scored) = sequences[j];
            common_prefix(first, tokens).min(limit).min(shareable(tokens, scored))
        };
        let shared = if i + 1 < sequences.len() { pair(i + 1) } else { 0 };
        if shared < MIN_SHARED {
            groups.push((i..i + 1, 0));
            i += 1;
            continue;
        }
        let mut end = i + 2;
        while end < sequences.len() && pair(end) >= shared {
            end += 1;
        }
        groups.push((i..end, shared));
        i = end;
    }
    groups
}

/// Splits sequences (in order) into micro-batches of at most `budget` rows, counting a shared
/// prefix once: a sequence whose group continues from the previous one costs only its own
/// rows. A longer sequence is a micro-batch of its own.
pub fn micro_batches(sequences: &[(&[u32], Option<usize>)], budget: usize) -> Vec<Range<usize>> {
    let mut joins = vec![0; sequences.len()];
    for (range, shared) in sharing_groups(sequences) {
        joins[range.start + 1..range.end].iter_mut().for_each(|j| *j = shared);
    }
    let mut batches = Vec::new();
    let mut start = 0;
    let mut rows = 0;
    for (i, &(tokens, _)) in sequences.iter().enumerate() {
        let joined = i > start;
        let cost = if joined { tokens.len() - joins[i] } else { tokens.len() };
        if joined && rows + cost > budget {
            batches.push(start..i);
            start = i;
            rows = tokens.len();
        } else {
            rows += cost;
        }
    }
    if start < sequences.len() {
        batches.push(start..sequences.len());
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(question: u32) -> Vec<u32> {
        let mut tokens: Vec<u32> = (0..20).collect();
        tokens.extend([100 + question; 10]);
        tokens
    }

    fn rollout(question: u32, answer: &[u32]) -> Vec<u32> {
        let mut tokens = prompt(question);
        tokens.extend(answer);
        tokens
    }

    #[test]
    fn rollouts_of_one_question_share_their_prompt_less_its_last_token_and_two_questions_stay_apart() {
        let sequences = [
            rollout(1, &[7, 8, 9]),
            rollout(1, &[7, 8, 2]),
            rollout(1, &[5]),
            rollout(2, &[7, 8, 9]),
            rollout(2, &[7, 8]),
            rollout(3, &[1]),
        ];
        // The responses are scored from the prompt's end (30 tokens) on.
        let input: Vec<(&[u32], Option<usize>)> = sequences.iter().map(|s| (s.as_slice(), Some(30))).collect();
        assert_eq!(sharing_groups(&input), vec![(0..3, 29), (3..5, 29), (5..6, 0)]);
        // Scored tokens inside the prompt bound what is shared.
        let mut early = input.clone();
        early[1].1 = Some(25);
        assert_eq!(sharing_groups(&early)[0], (0..3, 24));
        // A prefix below MIN_SHARED is not shared.
        early[1].1 = Some(MIN_SHARED);
        assert_eq!(sharing_groups(&early)[0], (0..1, 0));
        assert_eq!(sharing_groups(&[]), vec![]);
    }

    #[test]
    fn micro_batches_count_a_shared_prefix_once_and_bound_the_rows() {
        let sequences = [rollout(1, &[7, 8, 9]), rollout(1, &[7, 8, 2]), rollout(1, &[5]), rollout(2, &[5])];
        let input: Vec<(&[u32], Option<usize>)> = sequences.iter().map(|s| (s.as_slice(), Some(30))).collect();
        // 33 + 4 + 2 rows hold the first three; the fourth shares nothing with them.
        assert_eq!(micro_batches(&input, 39), vec![0..3, 3..4]);
        assert_eq!(micro_batches(&input, 38), vec![0..2, 2..3, 3..4]);
        // Unshared sequences: lengths alone.
        let plain: Vec<Vec<u32>> = [3, 4, 5, 20, 1].iter().map(|&n| (0..n as u32).collect()).collect();
        let input: Vec<(&[u32], Option<usize>)> = plain.iter().map(|s| (s.as_slice(), Some(1))).collect();
        assert_eq!(micro_batches(&input, 8), vec![0..2, 2..3, 3..4, 4..5]);
    }
}
