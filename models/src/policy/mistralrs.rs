//! The in-process policy: mistral.rs serving a local GGUF model on the CPU (or CUDA with the
//! `cuda` feature).
//!
//! mistral.rs 0.8.1 has traps this backend works around:
//! - It returns neither the sampled token ids nor natural-log probabilities, and has no
//!   per-request seed. A logits processor per request therefore does the sampling itself with
//!   its own seeded RNG, records `(id, ln p)`, and leaves the engine only that one token.
//! - Stop strings fire one token late and the returned text is trimmed; the text and ids are
//!   rebuilt here from the recorded ids, cut right after the stop string.
//! - Concurrent requests with different prompts on one engine corrupt each other on CPU. Each
//!   model instance serves one request at a time; several instances serve a batch in parallel.
//! - The default dtype on CPU is F16; the loader is asked for F32 explicitly.
//! - The prefix cache changes logits slightly depending on earlier requests; it is off, so a
//!   seed reproduces a trajectory exactly.

//!
//! The engine is behind the `mistralrs` cargo feature (the CPU quickstart does not need it, and
//! it is about a third of a cold build); its config is always known, so specs that name it
//! validate in any build.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(feature = "mistralrs")]
mod policy;
#[cfg(all(test, feature = "mistralrs"))]
mod tests;

#[cfg(feature = "mistralrs")]
pub use self::policy::MistralRsPolicy;

/// A local model served in process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MistralRsConfig {
    /// A GGUF file, or the name of a model `sesa model fetch` knows (e.g. `smollm2-135m-instruct`).
    pub model: String,
    /// Model instances; each serves one request at a time (see the module docs for why).
    #[serde(default = "default_instances")]
    pub instances: usize,
}

fn default_instances() -> usize {
    2
}
