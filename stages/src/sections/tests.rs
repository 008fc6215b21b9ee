//! Every tagged choice of the SESA sections names the setting a problem is in.

use super::Backend;
use super::EmbedderConfig;
use crate::sections::ModelSection;
use crate::selfplay::ProposerReward;
use sesa_models::train::Method;

fn error<T: serde::de::DeserializeOwned + std::fmt::Debug>(yaml: &str) -> String {
    serde_yaml::from_str::<T>(yaml).unwrap_err().to_string()
}

fn assert_starts(error: String, start: &str) {
    assert!(error.starts_with(start), "{error:?} does not start with {start:?}");
}

#[test]
fn a_problem_inside_a_choice_names_its_setting() {
    assert_starts(error::<ModelSection>("{backend: candle, model: m, dtype: f8}"), "dtype: unknown variant `f8`");
    assert_starts(error::<Backend>("{kind: bm25, index: [1]}"), "index: invalid type: sequence");
    assert_starts(error::<ProposerReward>("{shape: frontier, lambda: x}"), "lambda: invalid type: string \"x\"");
    assert_starts(error::<Method>("{kind: lora, rank: -1, alpha: 1}"), "rank: invalid value: integer `-1`");
    assert_starts(error::<EmbedderConfig>("{kind: hashed_words, dimension: big}"), "dimension: invalid type");
}

#[test]
fn the_tag_must_name_a_choice_and_a_choice_without_settings_takes_none() {
    assert_starts(error::<Backend>("{kind: bm26}"), "kind: unknown variant `bm26`, expected `bm25` or `retriever`");
    assert_starts(
        error::<Backend>("{kind: [bm25]}"),
        "kind: unknown variant `[\"bm25\"]`, expected `bm25` or `retriever`",
    );
    assert_starts(error::<Backend>("{index: i}"), "missing field `kind`");
    assert_starts(error::<Method>("{kind: full, rank: 2}"), "unknown field `rank`: `full` takes no settings");
    assert_starts(error::<Method>("{kind: lora, rank: 2, alpha: 1, rnak: 3}"), "unknown field `rnak`, expected one of");
    assert_starts(error::<Method>("{kind: lora, rank: 2}"), "missing field `alpha`");
    assert_eq!(serde_yaml::from_str::<Method>("{kind: full}").unwrap(), Method::Full);
    let lora = serde_yaml::from_str::<Method>("{kind: lora, rank: 4, alpha: 8}").unwrap();
    assert!(matches!(&lora, Method::Lora(lora) if lora.rank == 4 && lora.targets.len() == 7), "{lora:?}");
    // Written as it is read: the tag beside the settings.
    assert_eq!(serde_yaml::from_str::<Method>(&serde_yaml::to_string(&lora).unwrap()).unwrap(), lora);
}
