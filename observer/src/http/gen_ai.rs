//! LLM APIs: which call a request is, and what its body and answer say
//! about the model, the tokens and the first generated content. Only names,
//! counts and times are kept.

use super::scan::{bool_value, find, int_value, string_value};

/// (provider, operation) of the LLM API at `path`, per the GenAI semantic
/// conventions' names.
pub fn api(path: &str) -> Option<(&'static str, &'static str)> {
    Some(match path {
        "/v1/chat/completions" | "/chat/completions" => ("openai", "chat"),
        "/v1/completions" | "/completions" => ("openai", "text_completion"),
        "/v1/responses" | "/responses" => ("openai", "chat"),
        "/v1/embeddings" | "/embeddings" => ("openai", "embeddings"),
        "/v1/messages" => ("anthropic", "chat"),
        "/api/chat" => ("ollama", "chat"),
        "/api/generate" => ("ollama", "text_completion"),
        "/api/embed" | "/api/embeddings" => ("ollama", "embeddings"),
        _ => return None,
    })
}

/// What a call's request and answer said, gathered piece by piece.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Call {
    pub request_model: Option<String>,
    pub response_model: Option<String>,
    pub stream: Option<bool>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub finish_reason: Option<String>,
}

/// Token counts by API: (input key, output key).
const USAGE_KEYS: [(&str, &str); 3] = [
    ("prompt_tokens", "completion_tokens"),
    ("input_tokens", "output_tokens"),
    ("prompt_eval_count", "eval_count"),
];
const FINISH_KEYS: [&str; 3] = ["finish_reason", "stop_reason", "done_reason"];

impl Call {
    /// A piece of the request body.
    pub fn request_piece(&mut self, piece: &[u8]) {
        if self.request_model.is_none() {
            self.request_model = string_value(piece, "model");
        }
        if self.stream.is_none() {
            self.stream = bool_value(piece, "stream");
        }
    }

    /// A piece of the response body.
    pub fn response_piece(&mut self, piece: &[u8]) {
        if self.response_model.is_none() {
            self.response_model = string_value(piece, "model");
        }
        for (input, output) in USAGE_KEYS {
            if let Some(n) = int_value(piece, input) {
                self.input_tokens = Some(n);
            }
            if let Some(n) = int_value(piece, output) {
                self.output_tokens = Some(n);
            }
        }
        for key in FINISH_KEYS {
            if let Some(r) = string_value(piece, key) {
                self.finish_reason = Some(r);
            }
        }
    }
}

/// Keys whose non-empty string value is generated content, by API.
const CONTENT_KEYS: [&[u8]; 5] = [
    b"\"content\":\"",
    b"\"text\":\"",
    b"\"response\":\"",
    b"\"delta\":\"",
    b"\"partial_json\":\"",
];

/// Whether a piece of an answer carries generated content.
pub fn carries_content(piece: &[u8]) -> bool {
    CONTENT_KEYS.iter().any(|k| {
        let mut rest = piece;
        while let Some(i) = find(rest, k) {
            let after = &rest[i + k.len()..];
            if after.first().is_some_and(|&b| b != b'"') {
                return true;
            }
            rest = after;
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apis() {
        assert_eq!(api("/v1/chat/completions"), Some(("openai", "chat")));
        assert_eq!(api("/v1/messages"), Some(("anthropic", "chat")));
        assert_eq!(api("/api/generate"), Some(("ollama", "text_completion")));
        assert_eq!(api("/v1/models"), None);
    }

    #[test]
    fn a_streamed_chat() {
        let mut c = Call::default();
        c.request_piece(
            br#"{"messages":[{"role":"user","content":"hi"}],"model":"tiny-1","stream":true}"#,
        );
        c.response_piece(br#"data: {"model":"tiny-1-2025","choices":[{"delta":{"role":"assistant","content":""}}]}"#);
        c.response_piece(br#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}"#);
        c.response_piece(br#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":20,"total_tokens":29}}"#);
        assert_eq!(
            c,
            Call {
                request_model: Some("tiny-1".into()),
                response_model: Some("tiny-1-2025".into()),
                stream: Some(true),
                input_tokens: Some(9),
                output_tokens: Some(20),
                finish_reason: Some("stop".into()),
            }
        );
    }

    #[test]
    fn content() {
        assert!(!carries_content(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(carries_content(
            br#"data: {"choices":[{"delta":{"content":"Hel"}}]}"#
        ));
        assert!(carries_content(
            br#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}"#
        ));
        assert!(carries_content(
            br#"{"model":"llama3","response":"The","done":false}"#
        ));
        assert!(!carries_content(br#"data: [DONE]"#));
    }
}
