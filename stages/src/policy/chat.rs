//! Chat templates, for backends that take raw text (the model's own template is used where the
//! backend knows it).

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

/// How messages become prompt text.
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
