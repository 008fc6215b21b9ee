//! Reading a spec's internally tagged choices (`backend: candle` or `kind: bm25` beside the
//! chosen variant's settings) so that a problem inside the settings names the setting.
//!
//! serde's derive reads the whole map into a buffer before it picks the variant, and errors
//! from that buffer carry no path: `search: backend: invalid type: string "x", expected usize`,
//! where a user needs `search: backend: k: ...`. [`deserialize_tagged!`] writes the enum's
//! `Deserialize` instead: the tag is taken out first, then the variant's settings (a struct of
//! their own) are read with their paths kept. The enum keeps its `#[serde(tag = ...)]`
//! attributes for its JSON Schema (and `Serialize`, where it has one).

use serde::de::{DeserializeOwned, Error};
use serde::{Deserialize, Deserializer};

/// A map whose tag has been taken out: the variant it names, and the rest, its settings.
pub struct Tagged {
    variant: String,
    settings: serde_yaml::Mapping,
}

impl Tagged {
    /// Reads a map and takes out `tag`, which must name one of `variants`.
    pub fn read<'de, D: Deserializer<'de>>(
        deserializer: D,
        tag: &'static str,
        variants: &'static [&'static str],
    ) -> Result<Tagged, D::Error> {
        let mut settings = serde_yaml::Mapping::deserialize(deserializer)?;
        let value = settings.remove(tag).ok_or_else(|| D::Error::missing_field(tag))?;
        // serde's own wording for an unknown variant (`expected `a` or `b``), after the key.
        let unknown = |found: &str| {
            D::Error::custom(format!("{tag}: {}", serde::de::value::Error::unknown_variant(found, variants)))
        };
        let variant = match value {
            serde_yaml::Value::String(variant) if variants.contains(&variant.as_str()) => variant,
            serde_yaml::Value::String(variant) => return Err(unknown(&variant)),
            other => return Err(unknown(&serde_json::to_string(&other).unwrap_or_default())),
        };
        Ok(Tagged { variant, settings })
    }

    /// The variant's name, one of those [`Tagged::read`] was given.
    pub fn variant(&self) -> &str {
        &self.variant
    }

    /// The settings as `T`; a problem names its setting's path (`dtype: unknown variant ...`).
    pub fn settings<T: DeserializeOwned, E: Error>(self) -> Result<T, E> {
        // Through JSON's value, which reads a map of one key as an enum's variant as serde's
        // derive does (YAML's value wants a YAML tag there).
        let settings = serde_json::to_value(self.settings).map_err(E::custom)?;
        serde_path_to_error::deserialize(settings).map_err(|error| {
            let path = error.path().to_string();
            let message = error.into_inner().to_string();
            // An unknown key's message names it already.
            if path == "." || message.starts_with(&format!("unknown field `{path}`")) {
                E::custom(message)
            } else {
                E::custom(format!("{path}: {message}"))
            }
        })
    }

    /// For a variant without settings: none may be given.
    pub fn no_settings<E: Error>(self) -> Result<(), E> {
        match self.settings.keys().next() {
            None => Ok(()),
            Some(key) => Err(E::custom(format!(
                "unknown field `{}`: `{}` takes no settings",
                serde_yaml::to_string(key).unwrap_or_default().trim_end(),
                self.variant
            ))),
        }
    }
}

/// `Deserialize` for an internally tagged enum through [`Tagged`]: the enum's type, its tag
/// key, and each variant's name in specs with its constructor, `Variant(settings)` for a
/// newtype variant of settings, `Variant` for a unit variant.
///
/// ```ignore
/// sesa_engine::deserialize_tagged!(Method, "kind", { "full" => Full, "lora" => Lora(settings) });
/// ```
#[macro_export]
macro_rules! deserialize_tagged {
    ($type:ident, $tag:literal, { $($name:literal => $variant:ident $(($settings:ident))?),+ $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let tagged = $crate::tagged::Tagged::read(deserializer, $tag, &[$($name),+])?;
                match tagged.variant() {
                    $($name => $crate::deserialize_tagged!(@variant tagged, $type, $variant $(, $settings)?),)+
                    _ => unreachable!("Tagged::read keeps only the variants it is given"),
                }
            }
        }
    };
    (@variant $tagged:ident, $type:ident, $variant:ident) => {
        $tagged.no_settings().map(|()| $type::$variant)
    };
    (@variant $tagged:ident, $type:ident, $variant:ident, $settings:ident) => {
        $tagged.settings().map($type::$variant)
    };
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Settings {
        rank: u32,
    }

    #[derive(Debug, PartialEq)]
    enum Choice {
        Plain,
        Tuned(Settings),
    }
    crate::deserialize_tagged!(Choice, "kind", { "plain" => Plain, "tuned" => Tuned(settings) });

    fn error(yaml: &str) -> String {
        serde_yaml::from_str::<Choice>(yaml).unwrap_err().to_string()
    }

    #[test]
    fn a_choice_is_read_by_its_tag_and_a_problem_names_its_setting() {
        assert_eq!(serde_yaml::from_str::<Choice>("{kind: plain}").unwrap(), Choice::Plain);
        assert_eq!(
            serde_yaml::from_str::<Choice>("{kind: tuned, rank: 4}").unwrap(),
            Choice::Tuned(Settings { rank: 4 })
        );
        assert!(error("{kind: tuned, rank: -1}").starts_with("rank: invalid value: integer `-1`"));
        assert!(error("{kind: tight}").starts_with("kind: unknown variant `tight`, expected `plain` or `tuned`"));
        assert!(error("{rank: 4}").starts_with("missing field `kind`"));
        assert!(error("{kind: plain, rank: 4}").starts_with("unknown field `rank`: `plain` takes no settings"));
    }
}
