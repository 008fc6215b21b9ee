//! Chat templates: how messages become the prompt text that starts the assistant's turn.
//!
//! A model says how it wants to be prompted in its own Jinja template (a GGUF's
//! `tokenizer.chat_template`, a Hugging Face directory's `tokenizer_config.json`); a Llama 3 or
//! Gemma model prompted with another family's markers answers badly. In-process backends render
//! the model's template the way `transformers` does (`trim_blocks`, `lstrip_blocks`, Python
//! string methods, `raise_exception`), and fall back to ChatML, with a warning that says why,
//! for a model without a template or with one that cannot render the loop's conversations.

use std::sync::Arc;

use minijinja::{Environment, ErrorKind, context};

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage { role: role.to_string(), content: content.into() }
    }
}

/// A built-in template, for servers that take raw text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChatTemplate {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n`, then `<|im_start|>assistant\n` (SmolLM2, Qwen).
    Chatml,
}

impl ChatTemplate {
    /// Renders `messages` and opens the assistant's turn.
    pub fn render(self, messages: &[ChatMessage]) -> String {
        match self {
            ChatTemplate::Chatml => {
                let mut text = String::new();
                for message in messages {
                    text.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", message.role, message.content));
                }
                text.push_str("<|im_start|>assistant\n");
                text
            }
        }
    }

    /// The end-of-turn marker.
    pub fn end_of_turn(self) -> &'static str {
        match self {
            ChatTemplate::Chatml => "<|im_end|>",
        }
    }
}

/// How a loaded model's prompts are rendered: its own template, or ChatML.
#[derive(Clone)]
pub enum ChatFormat {
    /// The built-in ChatML.
    Chatml,
    /// The model's own Jinja template.
    Model(Arc<ModelTemplate>),
}

impl std::fmt::Debug for ChatFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChatFormat::Chatml => "ChatFormat::Chatml",
            ChatFormat::Model(_) => "ChatFormat::Model",
        })
    }
}

/// A model's Jinja template, compiled, with the special tokens it may print.
pub struct ModelTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The template refuses a system message (Gemma): it goes before the first user message.
    system_in_user: bool,
}

/// The name of the compiled template in its environment.
const TEMPLATE: &str = "chat";

impl ChatFormat {
    /// The model's template `source` when it renders the loop's conversations (a system
    /// message, then alternating user and assistant messages), else ChatML with a warning.
    /// `bos_token` and `eos_token` are the texts of the model's special tokens.
    pub fn from_model(model: &str, source: Option<&str>, bos_token: &str, eos_token: &str) -> ChatFormat {
        let Some(source) = source else {
            tracing::warn!(model, "the model has no chat template: prompting it with ChatML");
            return ChatFormat::Chatml;
        };
        match ChatFormat::compile(source, bos_token, eos_token) {
            Ok(format) => format,
            Err(error) => {
                tracing::warn!(model, %error, "the model's chat template cannot render a conversation: prompting it with ChatML");
                ChatFormat::Chatml
            }
        }
    }

    /// The template `source`, or why it cannot render the loop's conversations.
    pub fn compile(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatFormat, String> {
        ModelTemplate::compile(source, bos_token, eos_token).map(|template| ChatFormat::Model(Arc::new(template)))
    }

    /// Renders `messages` and opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage]) -> String {
        match self {
            ChatFormat::Chatml => ChatTemplate::Chatml.render(messages),
            ChatFormat::Model(template) => template.render(messages).unwrap_or_else(|error| {
                tracing::warn!(%error, "the model's chat template failed on a conversation: rendering it with ChatML");
                ChatTemplate::Chatml.render(messages)
            }),
        }
    }

    /// Whether this is the model's own template.
    pub fn is_model_template(&self) -> bool {
        matches!(self, ChatFormat::Model(_))
    }
}

impl ModelTemplate {
    /// Compiles `source` and checks it on a conversation of the loop's shape.
    fn compile(source: &str, bos_token: &str, eos_token: &str) -> Result<ModelTemplate, String> {
        let mut environment = Environment::new();
        // As transformers compiles chat templates.
        environment.set_trim_blocks(true);
        environment.set_lstrip_blocks(true);
        environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        // A fixed date keeps prompts, and so runs, reproducible (Llama 3.1 prints "today").
        environment.add_function("strftime_now", |_format: String| "26 Jul 2024".to_string());
        // Training-mask markers of some templates (SmolLM3) are not Jinja.
        let source = source.replace("{% generation %}", "").replace("{% endgeneration %}", "");
        environment.add_template_owned(TEMPLATE, source).map_err(|e| e.to_string())?;
        let mut template = ModelTemplate {
            environment,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            system_in_user: false,
        };
        let probe = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", "U1"),
            ChatMessage::new("assistant", "A"),
            ChatMessage::new("user", "U2"),
        ];
        if let Err(error) = template.render(&probe) {
            template.system_in_user = true;
            template.render(&probe).map_err(|_| error.to_string())?;
        }
        Ok(template)
    }

    fn render(&self, messages: &[ChatMessage]) -> Result<String, minijinja::Error> {
        let merged;
        let messages = if self.system_in_user {
            merged = system_into_user(messages);
            &merged
        } else {
            messages
        };
        self.environment.get_template(TEMPLATE)?.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
    }
}

/// A model's chat template as its files hold it, with the texts of its special tokens: what
/// [`ChatFormat`] is compiled from, leniently for a model sesa serves (ChatML when it is
/// missing) or strictly for a template a spec asks for by name.
pub struct TemplateSource {
    /// The Jinja text, when the files have one.
    pub source: Option<String>,
    /// The BOS token's text.
    pub bos_token: String,
    /// The EOS token's text.
    pub eos_token: String,
}

impl TemplateSource {
    /// The template of a Hugging Face `tokenizer_config.json`, with its special tokens.
    pub fn from_tokenizer_config(config: &serde_json::Value) -> TemplateSource {
        // A special token is written as its text or as an added token's `{"content": …}`.
        let token = |key: &str| match &config[key] {
            serde_json::Value::String(text) => text.clone(),
            value => value["content"].as_str().unwrap_or_default().to_string(),
        };
        TemplateSource {
            source: tokenizer_config_template(config),
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
        }
    }

    /// The model's template, or ChatML with a warning that names `model`. Only the mistral.rs
    /// backend asks for it, so the default build would otherwise warn that it is unused.
    #[cfg(feature = "mistralrs")]
    pub fn format_or_chatml(&self, model: &str) -> ChatFormat {
        ChatFormat::from_model(model, self.source.as_deref(), &self.bos_token, &self.eos_token)
    }

    /// The model's template, or why there is none that renders a conversation.
    pub fn format(&self) -> Result<ChatFormat, String> {
        let source = self.source.as_deref().ok_or_else(|| "no `chat_template`".to_string())?;
        ChatFormat::compile(source, &self.bos_token, &self.eos_token)
    }
}

/// A `tokenizer_config.json`'s `chat_template`: a string, or a list of named templates of
/// which the one named `default`.
pub fn tokenizer_config_template(config: &serde_json::Value) -> Option<String> {
    match &config["chat_template"] {
        serde_json::Value::String(template) => Some(template.clone()),
        serde_json::Value::Array(named) => {
            named.iter().find(|t| t["name"] == "default").and_then(|t| t["template"].as_str().map(str::to_string))
        }
        _ => None,
    }
}

/// A leading system message put before the first user message, as Gemma's model card advises
/// for a model without a system role.
fn system_into_user(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let Some((first, rest)) = messages.split_first().filter(|(m, _)| m.role == "system") else {
        return messages.to_vec();
    };
    let mut out: Vec<ChatMessage> = rest.to_vec();
    match out.iter_mut().find(|m| m.role == "user") {
        Some(user) => user.content = format!("{}\n\n{}", first.content, user.content),
        None => out.insert(0, ChatMessage::new("user", first.content.clone())),
    }
    out
}

#[cfg(test)]
mod tests;
