//! The Search-R1 / SSP tag protocol: what one generated turn asks for.
//!
//! A turn ends at a stop string (`</search>`, `</answer>`), at end of sequence or at its token
//! budget. Its text is untrusted model output: every malformed case is a [`FormatError`],
//! recorded in the trajectory, never a crash.

use std::fmt;

/// Who is generating: the proposer writes a question, the solver an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Poses a question for a target answer.
    Proposer,
    /// Answers a question.
    Solver,
}

impl Role {
    /// The tag that ends an episode for this role.
    pub fn final_tag(self) -> &'static str {
        match self {
            Role::Proposer => "question",
            Role::Solver => "answer",
        }
    }

    /// Stop strings for generation: the end of a search and of the final tag.
    pub fn stop_strings(self) -> Vec<String> {
        vec!["</search>".to_string(), format!("</{}>", self.final_tag())]
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Proposer => "proposer",
            Role::Solver => "solver",
        })
    }
}

/// Why a turn's text could not be acted on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FormatError {
    /// Neither a search nor the final tag (e.g. a prose answer).
    NoAction,
    /// `<search></search>` with nothing inside.
    EmptyQuery,
    /// A protocol tag inside a search query.
    TagInQuery,
    /// An opening tag that was never closed.
    Unclosed(String),
    /// A search query longer than the limit.
    RunawayQuery,
    /// The final tag with nothing inside.
    EmptyFinal,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::NoAction => write!(f, "no search and no final tag"),
            FormatError::EmptyQuery => write!(f, "empty search query"),
            FormatError::TagInQuery => write!(f, "a protocol tag inside a search query"),
            FormatError::Unclosed(tag) => write!(f, "unclosed <{tag}>"),
            FormatError::RunawayQuery => write!(f, "search query over {MAX_QUERY_CHARS} characters"),
            FormatError::EmptyFinal => write!(f, "empty final tag"),
        }
    }
}

/// What a turn asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnAction {
    /// Run this search and continue.
    Search(String),
    /// The episode's result: an answer (solver) or a question (proposer).
    Final(String),
    /// Malformed output; the episode ends.
    Malformed(FormatError),
}

/// Longer search queries are runaway generation, not queries.
pub const MAX_QUERY_CHARS: usize = 512;
const PROTOCOL_TAGS: &[&str] = &["search", "answer", "question", "information", "think"];

/// Reads one generated turn. `text` is the turn's text including the stop string if one was
/// hit. The final tag wins over a search in the same turn only if it comes after it.
pub fn parse_turn(role: Role, text: &str) -> TurnAction {
    let final_tag = role.final_tag();
    let final_open = format!("<{final_tag}>");
    let final_close = format!("</{final_tag}>");
    let last_search = text.rfind("<search>");
    let final_at = match role {
        // The solver's answer is the last one; the proposer's question the first (SSP).
        Role::Solver => text.rfind(&final_open),
        Role::Proposer => text.find(&final_open),
    };
    match (final_at, last_search) {
        (Some(at), search) if search.is_none_or(|s| s < at) => {
            let after = &text[at + final_open.len()..];
            match after.find(&final_close) {
                Some(end) if after[..end].trim().is_empty() => TurnAction::Malformed(FormatError::EmptyFinal),
                Some(end) => TurnAction::Final(after[..end].trim().to_string()),
                None => TurnAction::Malformed(FormatError::Unclosed(final_tag.to_string())),
            }
        }
        (_, Some(at)) => {
            let after = &text[at + "<search>".len()..];
            let Some(end) = after.find("</search>") else {
                return TurnAction::Malformed(FormatError::Unclosed("search".into()));
            };
            let query = after[..end].trim();
            if query.is_empty() {
                TurnAction::Malformed(FormatError::EmptyQuery)
            } else if query.chars().count() > MAX_QUERY_CHARS {
                TurnAction::Malformed(FormatError::RunawayQuery)
            } else if PROTOCOL_TAGS
                .iter()
                .any(|t| query.contains(&format!("<{t}>")) || query.contains(&format!("</{t}>")))
            {
                TurnAction::Malformed(FormatError::TagInQuery)
            } else {
                TurnAction::Search(query.to_string())
            }
        }
        _ => TurnAction::Malformed(FormatError::NoAction),
    }
}

/// The text appended after a search: SSP's result prefix and suffix around the formatted docs.
pub fn information_block(formatted_results: &str) -> String {
    format!("\n<information>\n{formatted_results}</information>\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solver(text: &str) -> TurnAction {
        parse_turn(Role::Solver, text)
    }

    #[test]
    fn searches_and_answers_are_read() {
        assert_eq!(
            solver("<think>hmm</think><search> capital of Veltria </search>"),
            TurnAction::Search("capital of Veltria".into())
        );
        assert_eq!(solver("<think>ok</think><answer> Orla </answer>"), TurnAction::Final("Orla".into()));
        assert_eq!(solver("<answer>a</answer> then <answer>b</answer>"), TurnAction::Final("b".into()));
        assert_eq!(parse_turn(Role::Proposer, "<search>x</search>"), TurnAction::Search("x".into()));
        assert_eq!(
            parse_turn(Role::Proposer, "<question> Q1? </question><question>Q2?</question>"),
            TurnAction::Final("Q1?".into())
        );
        // A search after an answer in the same turn: the search is what the model asked last.
        assert_eq!(solver("<answer>a</answer><search>more</search>"), TurnAction::Search("more".into()));
    }

    #[test]
    fn adversarial_turns_are_format_errors() {
        let cases = [
            ("The answer is Orla.", FormatError::NoAction),
            ("", FormatError::NoAction),
            ("<search>   </search>", FormatError::EmptyQuery),
            ("<search>where <think>x</think></search>", FormatError::TagInQuery),
            ("<search>never closed", FormatError::Unclosed("search".into())),
            ("<answer>never closed", FormatError::Unclosed("answer".into())),
            ("<answer>  </answer>", FormatError::EmptyFinal),
        ];
        for (text, expected) in cases {
            assert_eq!(solver(text), TurnAction::Malformed(expected), "{text:?}");
        }
        let runaway = format!("<search>{}</search>", "word ".repeat(200));
        assert_eq!(solver(&runaway), TurnAction::Malformed(FormatError::RunawayQuery));
        // Proposer: an answer tag is not its final tag.
        assert_eq!(parse_turn(Role::Proposer, "<answer>x</answer>"), TurnAction::Malformed(FormatError::NoAction));
    }

    #[test]
    fn the_information_block_is_ssp_s() {
        assert_eq!(
            information_block("Doc 1 (Title: \"A\")\na"),
            "\n<information>\nDoc 1 (Title: \"A\")\na</information>\n\n"
        );
    }
}
