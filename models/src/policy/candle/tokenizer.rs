//! The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), rebuilt as a `tokenizers`
//! byte-level BPE. The recipe is the one mistral.rs applies to `gpt2`-type GGUF vocabularies,
//! so both in-process backends cut text into the same ids (tested); candle's own converter
//! adds a prefix space to every segment, which would not.

use candle_core::quantized::gguf_file;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::llama::ModelError;

/// GPT-2's pre-tokenizer split (contractions, letters, single digits, punctuation, spaces).
const SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer, and the ids that end a turn (end-of-sequence, and `<|endoftext|>` if the
/// vocabulary has it).
pub(crate) fn from_gguf(content: &gguf_file::Content) -> Result<(Tokenizer, Vec<u32>), ModelError> {
    let get =
        |key: &str| content.metadata.get(key).ok_or_else(|| ModelError(format!("GGUF metadata `{key}` is missing")));
    let model = get("tokenizer.ggml.model")?.to_string()?;
    if model != "gpt2" {
        return Err(ModelError(format!("tokenizer type `{model}` is not supported (only gpt2 byte-level BPE)")));
    }
    let strings = |key: &str| -> Result<Vec<String>, ModelError> {
        get(key)?.to_vec()?.iter().map(|v| Ok(v.to_string()?.clone())).collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| ModelError(format!("malformed merge `{merge}`")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
        Some(value) => value.to_vec()?.iter().map(|v| v.to_i32()).collect::<Result<_, _>>()?,
        None => vec![1; tokens.len()],
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| ModelError(format!("building the BPE tokenizer: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let split = Split::new(SplitPattern::Regex(SPLIT.into()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| ModelError(format!("tokenizer split pattern: {e}")))?;
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()])));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    tokenizer.with_post_processor(Some(ByteLevel::new(false, false, false)));
    // Every token that is not a normal one (control, user-defined, …) is matched whole.
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, kind)| **kind != 1)
        .map(|(token, _)| AddedToken::from(token.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&special);
    let id = |key: &str| content.metadata.get(key).and_then(|v| v.to_u32().ok());
    let mut stops: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
    stops.extend(tokens.iter().position(|t| t == "<|endoftext|>").map(|i| i as u32));
    stops.dedup();
    if stops.is_empty() {
        return Err(ModelError("GGUF metadata names no end-of-sequence token".into()));
    }
    Ok((tokenizer, stops))
}
