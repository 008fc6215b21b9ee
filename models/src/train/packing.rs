//! How sequences are laid out as the rows of a micro-batch, and which rows they share.
//!
//! The rollouts of a GRPO group all start with the same prompt (system message, skills,
//! question), and a small policy sampling at temperature 0.8 often makes the same first search
//! too, so several of them also share their first turn and the passages it retrieved. Run once
//! per rollout, these common beginnings are most of a solver step's rows on the CPU. Instead,
//! a micro-batch's sequences are laid out as a prefix tree: every run of tokens that several
//! sequences have in common is packed once (when that saves at least [`MIN_SAVED`] rows), as a
//! segment of its own, and each segment attends to the segments on its path from the root before its own
//! rows. Causal attention makes this exact: a row never sees what follows it, so a shared row's
//! activations are those every sequence through it would compute, and its gradient is the sum
//! of what each of them sends back. A shared row may be scored: each sequence scored there gets
//! its own log-probability entry (the same number), and their derivatives add up.

use std::ops::Range;

/// A common run that saves fewer rows is not worth a segment of its own (one more small
/// product per head): it is packed once per sequence.
pub const MIN_SAVED: usize = 16;

/// A run of rows that attends causally to itself after attending to every row of its prefix:
/// the segments on its path from the root of the prefix tree (none for a root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First row.
    pub start: usize,
    /// Rows.
    pub len: usize,
    /// The runs of rows it attends to first, from the root down.
    pub prefix: Vec<Range<usize>>,
}

impl Segment {
    /// Keys each of its rows may see at most: the prefix's and its own.
    pub fn width(&self) -> usize {
        self.prefix_len() + self.len
    }

    /// Rows in its prefix.
    pub fn prefix_len(&self) -> usize {
        self.prefix.iter().map(Range::len).sum()
    }

    /// The rows of its prefix, in the order its attention reads them.
    pub fn prefix_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.prefix.iter().flat_map(Range::clone)
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

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The rows of a micro-batch: the prefix tree of its sequences.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Token of each row.
    pub tokens: Vec<u32>,
    /// Position of each row within the sequences that hold it.
    pub positions: Vec<usize>,
    /// The tree's runs of rows, each after its ancestors.
    pub segments: Vec<Segment>,
    /// Per sequence, the row holding each of its tokens.
    rows_of: Vec<Vec<usize>>,
}

impl Layout {
    /// The prefix tree of `sequences` (each at least one token long).
    pub fn new(sequences: &[&[u32]]) -> Layout {
        let mut layout = Layout {
            tokens: Vec::new(),
            positions: Vec::new(),
            segments: Vec::new(),
            rows_of: sequences.iter().map(|s| vec![usize::MAX; s.len()]).collect(),
        };
        let all: Vec<usize> = (0..sequences.len()).filter(|&s| !sequences[s].is_empty()).collect();
        if !all.is_empty() {
            layout.grow(sequences, &all, 0, &mut Vec::new());
        }
        layout
    }

    /// Rows in the micro-batch.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// The row holding token `position` of sequence `sequence`.
    pub fn row(&self, sequence: usize, position: usize) -> usize {
        self.rows_of[sequence][position]
    }

    /// Lays out the tokens from `from` on of `set`, sequences that agree on every token before
    /// `from` (the rows of `path`).
    fn grow(&mut self, sequences: &[&[u32]], set: &[usize], from: usize, path: &mut Vec<Range<usize>>) {
        let first = sequences[set[0]];
        if set.len() == 1 {
            self.push(sequences, set, from..first.len(), path);
            return;
        }
        // A shared run stops before each sequence's last token, so that every sequence keeps a
        // row of its own below it and the recursion ends.
        let mut shared = set.iter().map(|&s| sequences[s].len() - 1).min().unwrap_or(0);
        for &s in &set[1..] {
            shared = shared.min(from + common_prefix(&first[from..], &sequences[s][from..]));
        }
        let next = if (shared - from) * (set.len() - 1) >= MIN_SAVED {
            let node = self.push(sequences, set, from..shared, path);
            path.push(node);
            shared
        } else {
            from
        };
        // Those that go on alike after the shared run stay together; one that ends right
        // after it goes alone. There are at least two parts: the run stopped where the set
        // differs or where a sequence ends.
        let mut parts: Vec<(Option<u32>, Vec<usize>)> = Vec::new();
        for &s in set {
            let key = (shared + 1 < sequences[s].len()).then(|| sequences[s][shared]);
            match parts.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
                Some((_, part)) => part.push(s),
                None => parts.push((key, vec![s])),
            }
        }
        for (_, part) in parts {
            self.grow(sequences, &part, next, path);
        }
        if next > from {
            path.pop();
        }
    }

    /// Packs tokens `range` of `set`'s first sequence as a segment under `path`.
    fn push(
        &mut self,
        sequences: &[&[u32]],
        set: &[usize],
        range: Range<usize>,
        path: &[Range<usize>],
    ) -> Range<usize> {
        let start = self.tokens.len();
        self.tokens.extend_from_slice(&sequences[set[0]][range.clone()]);
        self.positions.extend(range.clone());
        for &s in set {
            for (offset, position) in range.clone().enumerate() {
                self.rows_of[s][position] = start + offset;
            }
        }
        self.segments.push(Segment { start, len: range.len(), prefix: path.to_vec() });
        start..start + range.len()
    }
}

/// Splits sequences (in order) into micro-batches of at most `budget` rows, counting shared
/// rows once. A longer sequence is a micro-batch of its own.
pub fn micro_batches(sequences: &[&[u32]], budget: usize) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    for i in 0..sequences.len() {
        if i > start && Layout::new(&sequences[start..=i]).rows() > budget {
            batches.push(start..i);
            start = i;
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

    /// Twenty tokens of system message, then ten of the question.
    fn prompt(question: u32) -> Vec<u32> {
        let mut tokens: Vec<u32> = (0..20).collect();
        tokens.extend([100 + question; 10]);
        tokens
    }

    fn rollout(question: u32, turns: &[&[u32]]) -> Vec<u32> {
        let mut tokens = prompt(question);
        turns.iter().for_each(|turn| tokens.extend(*turn));
        tokens
    }

    /// Every sequence reads, through the segment of its last row (its prefix, then its own
    /// rows up to that one), exactly its own tokens at their positions.
    fn assert_each_sequence_reads_itself(layout: &Layout, sequences: &[&[u32]]) {
        for (s, tokens) in sequences.iter().enumerate() {
            let last = layout.row(s, tokens.len() - 1);
            let segment = layout.segments.iter().find(|g| (g.start..g.start + g.len).contains(&last)).unwrap();
            let seen: Vec<usize> = segment.prefix_rows().chain(segment.start..=last).collect();
            assert_eq!(seen, (0..tokens.len()).map(|p| layout.row(s, p)).collect::<Vec<_>>(), "sequence {s}");
            assert_eq!(seen.iter().map(|&r| layout.tokens[r]).collect::<Vec<_>>(), tokens.to_vec(), "sequence {s}");
            assert_eq!(
                seen.iter().map(|&r| layout.positions[r]).collect::<Vec<_>>(),
                (0..tokens.len()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_group_shares_its_prompt_and_the_first_turn_its_rollouts_have_in_common() {
        let first_turn: Vec<u32> = (200..220).collect();
        let sequences = [
            rollout(1, &[&first_turn, &[1, 2, 3]]),
            rollout(1, &[&first_turn, &[4, 5]]),
            rollout(1, &[&[6, 6, 6]]),
            rollout(2, &[&[7, 8]]),
        ];
        let input: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
        let layout = Layout::new(&input);
        assert_each_sequence_reads_itself(&layout, &input);
        // The system message once (20 rows), the first question once (10), the shared turn
        // once (20), then each sequence's own rows: 3, 2, 3, and the second question's 12.
        assert_eq!(layout.rows(), 20 + 10 + 20 + 3 + 2 + 3 + 12);
        let starts: Vec<(usize, usize, usize)> =
            layout.segments.iter().map(|g| (g.start, g.len, g.prefix_len())).collect();
        assert_eq!(
            starts,
            vec![(0, 20, 0), (20, 10, 20), (30, 20, 30), (50, 3, 50), (53, 2, 50), (55, 3, 30), (58, 12, 20)]
        );
        // A shared row is every sharer's row.
        assert_eq!(layout.row(0, 45), layout.row(1, 45));
        assert_ne!(layout.row(0, 50), layout.row(1, 50));
    }

    #[test]
    fn short_common_runs_are_packed_once_per_sequence_and_a_sequence_may_end_inside_another() {
        // Two sequences sharing 15 tokens save 15 rows: below MIN_SAVED, so nothing is shared.
        let a: Vec<u32> = (0..20).collect();
        let mut b: Vec<u32> = (0..15).collect();
        b.extend([99; 5]);
        let layout = Layout::new(&[&a, &b]);
        assert_eq!((layout.rows(), layout.segments.len()), (40, 2));
        // A sequence that is the start of another keeps its last row; the rest is shared.
        let long: Vec<u32> = (0..40).collect();
        let input: Vec<&[u32]> = vec![&long[..30], &long, &long[..30]];
        let layout = Layout::new(&input);
        assert_each_sequence_reads_itself(&layout, &input);
        assert_eq!(layout.rows(), 29 + 1 + 11 + 1);
        assert!(Layout::new(&[]).segments.is_empty());
    }

    #[test]
    fn micro_batches_count_shared_rows_once_and_bound_the_rows() {
        let sequences =
            [rollout(1, &[&[7, 8, 9]]), rollout(1, &[&[7, 8, 2]]), rollout(1, &[&[5]]), rollout(2, &[&[5]])];
        let input: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
        // The first three: their prompt (30 rows) once, then 3 + 3 + 1; the fourth shares the
        // system message with them (20 rows), the first question's ten rows become a segment
        // under it, and the fourth adds 11 rows of its own.
        assert_eq!(Layout::new(&input[..3]).rows(), 37);
        assert_eq!(Layout::new(&input).rows(), 48);
        assert_eq!(micro_batches(&input, 48), vec![0..4]);
        assert_eq!(micro_batches(&input, 47), vec![0..3, 3..4]);
        assert_eq!(micro_batches(&input, 36), vec![0..2, 2..3, 3..4]);
        // Nothing shared: lengths alone; a longer sequence is a micro-batch of its own.
        let plain: Vec<Vec<u32>> = [3, 4, 5, 20, 1].iter().map(|&n| (0..n as u32).collect()).collect();
        let input: Vec<&[u32]> = plain.iter().map(Vec::as_slice).collect();
        assert_eq!(micro_batches(&input, 8), vec![0..2, 2..3, 3..4, 4..5]);
    }
}
