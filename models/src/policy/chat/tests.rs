//! The expected prompts are what Python's Jinja2 renders from the same templates with the
//! settings transformers uses (`trim_blocks`, `lstrip_blocks`).

use super::*;

/// SmolLM2-Instruct's template (ChatML, with a default system message).
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3 Instruct's template.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Gemma Instruct's template: no system role, strict alternation.
const GEMMA: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

/// A template written with Python string methods and block tags on their own lines, as many
/// Hugging Face templates are.
const PYTHONIC: &str = "{%- for message in messages %}
    {%- if message.role.startswith('sys') %}
[SYS]{{ message.content.strip() }}
    {%- else %}
[{{ message.role.upper() }}]{{ message.content }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
[ASSISTANT]
{%- endif %}";

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Search first."),
        ChatMessage::new("user", "Question: Where?"),
        ChatMessage::new("assistant", "<search>where</search>"),
        ChatMessage::new("user", "Question: Who?"),
    ]
}

fn render(source: &str, bos: &str, eos: &str) -> String {
    let format = ChatFormat::from_model("test", Some(source), bos, eos);
    assert!(format.is_model_template(), "the template compiles");
    format.render(&conversation())
}

#[test]
fn smollm2s_template_renders_as_chatml_does() {
    assert_eq!(render(SMOLLM2, "<|im_start|>", "<|im_end|>"), ChatTemplate::Chatml.render(&conversation()));
}

#[test]
fn llama3s_template_puts_the_bos_token_and_its_headers() {
    assert_eq!(
        render(LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSearch first.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nQuestion: Where?<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n<search>where</search><|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nQuestion: Who?<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn gemmas_template_gets_the_system_message_in_the_first_user_turn() {
    assert_eq!(
        render(GEMMA, "<bos>", "<eos>"),
        "<bos><start_of_turn>user\nSearch first.\n\nQuestion: Where?<end_of_turn>\n\
         <start_of_turn>model\n<search>where</search><end_of_turn>\n\
         <start_of_turn>user\nQuestion: Who?<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn python_string_methods_and_block_whitespace_work_as_in_transformers() {
    assert_eq!(
        render(PYTHONIC, "", ""),
        "[SYS]Search first.[USER]Question: Where?[ASSISTANT]<search>where</search>[USER]Question: Who?[ASSISTANT]"
    );
}

#[test]
fn a_model_without_a_usable_template_is_prompted_with_chatml() {
    for source in [None, Some("{% for m in messages %}"), Some("{{ raise_exception('never') }}")] {
        let format = ChatFormat::from_model("test", source, "", "");
        assert!(!format.is_model_template(), "{source:?}");
        assert_eq!(format.render(&conversation()), ChatTemplate::Chatml.render(&conversation()));
    }
}
