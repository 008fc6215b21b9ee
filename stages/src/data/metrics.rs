//! Answer metrics exactly as SSP (and Search-R1, FlashRAG) compute them: SQuAD normalisation,
//! exact match against any gold answer, token F1, and extraction of the last `<answer>`.

/// Python's `string.punctuation`.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Lowercase, remove ASCII punctuation, replace the whole words `a`, `an`, `the` with a space,
/// collapse whitespace: `white_space_fix(remove_articles(remove_punc(lower(s))))`.
pub fn normalize_answer(text: &str) -> String {
    let lowered: String = text.to_lowercase().chars().filter(|c| !PUNCTUATION.contains(*c)).collect();
    // Python's `\b(a|an|the)\b` in Unicode mode: a run of word characters equal to an article.
    let mut without_articles = String::with_capacity(lowered.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in lowered.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut without_articles);
            without_articles.push(c);
        }
    }
    flush(&mut word, &mut without_articles);
    without_articles.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `text` holds `answer` as whole words, both normalised as [`normalize_answer`] does.
pub fn contains_answer(text: &str, answer: &str) -> bool {
    let answer = normalize_answer(answer);
    !answer.is_empty() && format!(" {} ", normalize_answer(text)).contains(&format!(" {answer} "))
}

/// 1.0 when the normalised prediction equals the normalised form of any gold answer.
pub fn exact_match(prediction: &str, golds: &[String]) -> f64 {
    let prediction = normalize_answer(prediction);
    if golds.iter().any(|gold| normalize_answer(gold) == prediction) { 1.0 } else { 0.0 }
}

/// Token-multiset F1 between the normalised prediction and each gold; the best one.
pub fn f1_score(prediction: &str, golds: &[String]) -> f64 {
    let prediction = normalize_answer(prediction);
    let predicted: Vec<&str> = prediction.split_whitespace().collect();
    golds
        .iter()
        .map(|gold| {
            let gold = normalize_answer(gold);
            let gold_tokens: Vec<&str> = gold.split_whitespace().collect();
            let mut remaining = gold_tokens.clone();
            let mut same = 0usize;
            for token in &predicted {
                if let Some(position) = remaining.iter().position(|g| g == token) {
                    remaining.swap_remove(position);
                    same += 1;
                }
            }
            if same == 0 {
                return 0.0;
            }
            let precision = same as f64 / predicted.len() as f64;
            let recall = same as f64 / gold_tokens.len() as f64;
            2.0 * precision * recall / (precision + recall)
        })
        .fold(0.0, f64::max)
}

/// The content of the last `<answer>…</answer>` (across lines), trimmed; `None` if there is
/// none.
pub fn extract_answer(response: &str) -> Option<String> {
    let mut last = None;
    let mut rest = response;
    while let Some(open) = rest.find("<answer>") {
        let after = &rest[open + "<answer>".len()..];
        let Some(close) = after.find("</answer>") else {
            break;
        };
        last = Some(after[..close].trim().to_string());
        rest = &after[close + "</answer>".len()..];
    }
    last
}

#[cfg(test)]
mod tests;
