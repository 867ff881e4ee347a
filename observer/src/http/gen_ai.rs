//! LLM APIs: which call a request is, and what its body and answer say
//! about the model, the tokens and the generated content, read as JSON
//! (any spacing, escapes, key order; split anywhere). Only names, counts
//! and times are kept.

use super::{
    body::{Body, Events},
    gaps::Gaps,
    json::Scalar,
};

/// (provider, operation) of the LLM API at `path`, per the GenAI semantic
/// conventions' names, and the model the path names (Gemini's
/// `models/{model}:…`, Azure's deployment). A gateway's prefix
/// (`/openai/v1/…`, `/api/v1/…`) does not matter.
pub fn api(path: &str) -> Option<((&'static str, &'static str), Option<String>)> {
    if let Some(call) = gemini(path) {
        return Some(call);
    }
    // Set up once: a substring search set up for every request's path was
    // most of this function's cost.
    static DEPLOYMENTS: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"/openai/deployments/"));
    let deployment = DEPLOYMENTS
        .find(path.as_bytes())
        .map(|i| &path[i + DEPLOYMENTS.needle().len()..]);
    if let Some(rest) = deployment {
        let (deployment, op) = rest.split_once('/')?;
        let op = match op {
            "chat/completions" => "chat",
            "completions" => "text_completion",
            "embeddings" => "embeddings",
            "responses" => "chat",
            _ => return None,
        };
        return Some((("azure.ai.openai", op), Some(deployment.to_owned())));
    }
    // OpenAI's own paths sit under a version (or a gateway's prefix), or at
    // a base URL's root.
    // No allocation: this runs for every request the host makes or serves.
    let openai = |suffix: &str| {
        path.strip_suffix(suffix)
            .is_some_and(|p| p.is_empty() || p.ends_with("/v1") || p.ends_with("/openai"))
    };
    let kind = if path.ends_with("/chat/completions") {
        ("openai", "chat")
    } else if openai("/completions") {
        ("openai", "text_completion")
    } else if openai("/responses") {
        ("openai", "chat")
    } else if openai("/embeddings") {
        ("openai", "embeddings")
    } else if path.ends_with("/v1/messages") {
        ("anthropic", "chat")
    } else if path.ends_with("/api/chat") {
        ("ollama", "chat")
    } else if path.ends_with("/api/generate") {
        ("ollama", "text_completion")
    } else if path.ends_with("/api/embed") || path.ends_with("/api/embeddings") {
        ("ollama", "embeddings")
    } else {
        return None;
    };
    Some((kind, None))
}

/// The call a request to `path` starts, if it is an LLM API's: its
/// (provider, operation) and what the path tells (the model; Gemini's
/// `:streamGenerateContent` streams whatever the body says).
pub fn call_for(path: &str) -> Option<((&'static str, &'static str), Call)> {
    let (kind, model) = api(path)?;
    let mut c = Call::new(model);
    if path.ends_with(":streamGenerateContent") {
        c.stream = Some(true);
    }
    Some((kind, c))
}

/// Gemini: `…/models/{model}:generateContent` (or `:streamGenerateContent`).
fn gemini(path: &str) -> Option<((&'static str, &'static str), Option<String>)> {
    let (before, method) = path.rsplit_once(':')?;
    let op = match method {
        "generateContent" | "streamGenerateContent" => "chat",
        "embedContent" | "batchEmbedContents" => "embeddings",
        _ => return None,
    };
    let model = before.rsplit_once("/models/")?.1;
    Some((("gcp.gemini", op), Some(model.to_owned())))
}

/// Output paths whose non-empty string is generated content (`*`: any
/// array element), by API: OpenAI chat (streamed and not, reasoning and
/// tool-call arguments), Completions, the Responses API's answer, Anthropic
/// Messages (text, thinking, tool input), Ollama, Gemini.
const CONTENT_PATHS: [&str; 19] = [
    "choices.*.delta.content",
    "choices.*.delta.reasoning_content",
    "choices.*.delta.reasoning",
    "choices.*.delta.tool_calls.*.function.arguments",
    "choices.*.message.content",
    "choices.*.message.reasoning_content",
    "choices.*.message.tool_calls.*.function.arguments",
    "choices.*.text",
    "output.*.content.*.text",
    "delta.text",
    "delta.thinking",
    "delta.partial_json",
    "content.*.text",
    "content.*.thinking",
    "message.content",
    "message.thinking",
    "response",
    "thinking",
    "candidates.*.content.parts.*.text",
];

/// Responses API events whose `delta` is generated content.
const CONTENT_DELTA_TYPES: [&str; 5] = [
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
];

/// Where usage sits: at the top (`usage.x`), or in the Responses API's
/// `response` and Anthropic's `message` objects of their stream events.
fn usage_key(path: &str) -> Option<&str> {
    let p = path
        .strip_prefix("response.")
        .or_else(|| path.strip_prefix("message."))
        .unwrap_or(path);
    p.strip_prefix("usage.")
        .or_else(|| p.strip_prefix("usageMetadata."))
        .or_else(|| (path == p).then_some(p))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Usage {
    Input,
    Output,
    CachedInput,
    ReasoningOutput,
}

fn usage_of(key: &str) -> Option<Usage> {
    Some(match key {
        "prompt_tokens" | "input_tokens" | "prompt_eval_count" | "promptTokenCount" => Usage::Input,
        "completion_tokens" | "output_tokens" | "eval_count" | "candidatesTokenCount" => {
            Usage::Output
        }
        "prompt_tokens_details.cached_tokens"
        | "input_tokens_details.cached_tokens"
        | "cache_read_input_tokens"
        | "cachedContentTokenCount" => Usage::CachedInput,
        "completion_tokens_details.reasoning_tokens"
        | "output_tokens_details.reasoning_tokens"
        | "thoughtsTokenCount" => Usage::ReasoningOutput,
        _ => return None,
    })
}

const FINISH_PATHS: [&str; 5] = [
    "choices.*.finish_reason",
    "stop_reason",
    "delta.stop_reason",
    "done_reason",
    "candidates.*.finishReason",
];

const MODEL_PATHS: [&str; 4] = ["model", "message.model", "response.model", "modelVersion"];

/// What a call's request and answer said, read as they came.
#[derive(Clone, Debug, Default)]
pub struct Call {
    pub request_model: Option<String>,
    pub response_model: Option<String>,
    pub stream: Option<bool>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cached_input_tokens: Option<u64>,
    pub reasoning_output_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    /// Events that carried generated content, and when the first and the
    /// last were delivered (CLOCK_MONOTONIC ns; 0: none).
    pub content_events: u32,
    pub first_content_ns: u64,
    pub last_content_ns: u64,
    pub gaps: Gaps,
    /// Events (or documents) whose JSON could not be read.
    pub unreadable_events: u32,
    request: Option<Box<Body>>,
    response: Option<Box<Body>>,
    event: EventSeen,
}

impl PartialEq for Call {
    fn eq(&self, o: &Self) -> bool {
        (
            &self.request_model,
            &self.response_model,
            self.stream,
            self.input_tokens,
            self.output_tokens,
            self.cached_input_tokens,
            self.reasoning_output_tokens,
            &self.finish_reason,
            self.first_content_ns,
        ) == (
            &o.request_model,
            &o.response_model,
            o.stream,
            o.input_tokens,
            o.output_tokens,
            o.cached_input_tokens,
            o.reasoning_output_tokens,
            &o.finish_reason,
            o.first_content_ns,
        )
    }
}
impl Eq for Call {}

/// What the answer's event being read showed so far.
#[derive(Clone, Debug, Default)]
struct EventSeen {
    content: bool,
    /// A non-empty top-level `delta` string (content if the type says so).
    delta: bool,
    content_type: bool,
}

/// The request body's reader: its model and whether it asks for a stream.
struct RequestFields<'a>(&'a mut Call);

impl Events for RequestFields<'_> {
    fn value(&mut self, path: &str, v: Scalar<'_>) {
        match (path, v) {
            ("model", Scalar::Str { text, len }) if len > 0 => {
                // The body's model is the one asked for (over a path's).
                self.0.request_model = Some(text.to_owned());
            }
            ("stream", Scalar::Bool(b)) => self.0.stream = Some(b),
            _ => {}
        }
    }
    fn event(&mut self, _t: u64) {}
}

/// The answer's reader.
struct AnswerFields<'a>(&'a mut Call);

impl Events for AnswerFields<'_> {
    fn value(&mut self, path: &str, v: Scalar<'_>) {
        let c = &mut *self.0;
        match v {
            Scalar::Str { text, len } => {
                if len == 0 {
                    return;
                }
                if CONTENT_PATHS.contains(&path) {
                    c.event.content = true;
                } else if path == "delta" {
                    c.event.delta = true;
                } else if path == "type" {
                    c.event.content_type = CONTENT_DELTA_TYPES.contains(&text);
                } else if FINISH_PATHS.contains(&path) {
                    c.finish_reason = Some(text.to_owned());
                } else if c.response_model.is_none() && MODEL_PATHS.contains(&path) {
                    c.response_model = Some(text.to_owned());
                }
            }
            Scalar::Int(n) => {
                let Some(kind) = usage_key(path).and_then(usage_of) else {
                    return;
                };
                // The last count a server sent is its total (some repeat
                // or grow it event by event).
                *match kind {
                    Usage::Input => &mut c.input_tokens,
                    Usage::Output => &mut c.output_tokens,
                    Usage::CachedInput => &mut c.cached_input_tokens,
                    Usage::ReasoningOutput => &mut c.reasoning_output_tokens,
                } = Some(n);
            }
            _ => {}
        }
    }

    fn event(&mut self, t: u64) {
        let c = &mut *self.0;
        let e = std::mem::take(&mut c.event);
        if !(e.content || (e.delta && e.content_type)) {
            return;
        }
        if c.first_content_ns == 0 {
            c.first_content_ns = t;
        } else {
            c.gaps.add(t.saturating_sub(c.last_content_ns));
        }
        c.last_content_ns = t;
        c.content_events += 1;
    }
}

impl Call {
    /// A call to an API whose path named `model` (Gemini, Azure).
    pub fn new(path_model: Option<String>) -> Self {
        Self {
            request_model: path_model,
            ..Self::default()
        }
    }

    /// The request's body starts (`chunked`: HTTP/1.1 chunked framing).
    pub fn start_request(&mut self, chunked: bool) {
        self.request = Some(Box::new(Body::new(false, chunked)));
    }

    /// The answer's body starts: `sse` for `text/event-stream`.
    pub fn start_response(&mut self, sse: bool, chunked: bool) {
        self.response = Some(Box::new(Body::new(sse, chunked)));
    }

    /// Bytes of the request body (`gap`: bytes before them were not copied).
    pub fn request_bytes(&mut self, b: &[u8], gap: bool) {
        let Some(mut body) = self.request.take() else {
            return;
        };
        if gap {
            body.gap();
        }
        body.feed(b, 0, &mut RequestFields(self));
        self.request = Some(body);
    }

    /// Bytes of the answer's body, read (or written) at `t`.
    pub fn response_bytes(&mut self, b: &[u8], gap: bool, t: u64) {
        let Some(mut body) = self.response.take() else {
            return;
        };
        if gap {
            body.gap();
        }
        body.feed(b, t, &mut AnswerFields(self));
        self.response = Some(body);
    }

    /// The answer ended at `t`: an event still open is delivered, and the
    /// count of unreadable ones is final.
    pub fn finish(&mut self, t: u64) {
        for (body, answer) in [(self.request.take(), false), (self.response.take(), true)] {
            let Some(mut body) = body else { continue };
            if answer {
                body.finish(t, &mut AnswerFields(self));
            }
            self.unreadable_events += body.unreadable;
        }
    }

    /// Time per output token after the first (the first token's own time is
    /// the time to first token): from the first content event to the last,
    /// over the output tokens the server counted less one.
    pub fn time_per_output_token_ns(&self) -> Option<u64> {
        let tokens = self.output_tokens?.checked_sub(1).filter(|&n| n > 0)?;
        let span = self.last_content_ns.checked_sub(self.first_content_ns)?;
        (self.first_content_ns != 0 && span > 0).then(|| span / tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apis() {
        let op = |p: &str| api(p).map(|(k, _)| k);
        assert_eq!(op("/v1/chat/completions"), Some(("openai", "chat")));
        assert_eq!(op("/openai/v1/chat/completions"), Some(("openai", "chat")));
        assert_eq!(op("/api/v1/chat/completions"), Some(("openai", "chat")));
        assert_eq!(op("/v1/responses"), Some(("openai", "chat")));
        assert_eq!(op("/responses"), Some(("openai", "chat")));
        assert_eq!(op("/v1/completions"), Some(("openai", "text_completion")));
        assert_eq!(op("/v1/messages"), Some(("anthropic", "chat")));
        assert_eq!(op("/gw/anthropic/v1/messages"), Some(("anthropic", "chat")));
        assert_eq!(op("/api/generate"), Some(("ollama", "text_completion")));
        assert_eq!(op("/v1/models"), None);
        assert_eq!(op("/users/messages"), None);
        assert_eq!(op("/account/responses"), None);
        assert_eq!(
            api("/openai/deployments/gpt-4o-prod/chat/completions"),
            Some((("azure.ai.openai", "chat"), Some("gpt-4o-prod".into())))
        );
        assert_eq!(
            api("/v1beta/models/gemini-2.0-flash:streamGenerateContent"),
            Some((("gcp.gemini", "chat"), Some("gemini-2.0-flash".into())))
        );
    }

    fn sse(events: &[&str]) -> String {
        events.iter().map(|e| format!("data: {e}\n\n")).collect()
    }

    /// An answer fed in two reads split at `at`, the second at t=2.
    fn answer(body: &str, is_sse: bool, at: usize) -> Call {
        let mut c = Call::default();
        c.start_response(is_sse, false);
        c.response_bytes(&body.as_bytes()[..at], false, 1);
        c.response_bytes(&body.as_bytes()[at..], false, 2);
        c.finish(3);
        c
    }

    /// Every split of `body` gives the same call, its first content at
    /// t=1 or 2 as its event's end falls.
    fn every_split(body: &str, is_sse: bool, check: impl Fn(&Call)) {
        for at in 0..=body.len() {
            let c = answer(body, is_sse, at);
            check(&c);
            assert_eq!(c.unreadable_events, 0, "split at {at}: {c:#?}");
        }
    }

    #[test]
    fn openai_chat_as_python_spaces_it() {
        let body = sse(&[
            r#"{"id": "c1", "model": "m-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}"#,
            r#"{"id": "c1", "model": "m-2", "choices": [{"index": 0, "delta": {"content": "tok0 "}}]}"#,
            r#"{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}"#,
            r#"{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens_details": {"reasoning_tokens": 6}}}"#,
            "[DONE]",
        ]);
        every_split(&body, true, |c| {
            assert_eq!(c.response_model.as_deref(), Some("m-2"));
            assert_eq!(c.content_events, 1);
            assert_ne!(c.first_content_ns, 0);
            assert_eq!(
                (
                    c.input_tokens,
                    c.output_tokens,
                    c.cached_input_tokens,
                    c.reasoning_output_tokens
                ),
                (Some(9), Some(20), Some(4), Some(6))
            );
            assert_eq!(c.finish_reason.as_deref(), Some("stop"));
        });
    }

    #[test]
    fn first_content_by_shape() {
        let cases: [(&str, bool, &[&str]); 9] = [
            // Reasoning before the answer: the first token is reasoning's.
            ("reasoning", true, &[
                r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
                r#"{"choices":[{"delta":{"reasoning_content":"Hmm"}}]}"#,
            ]),
            ("tool call", true, &[
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}"#,
            ]),
            ("completions", true, &[r#"{"choices":[{"text":""}]}"#, r#"{"choices":[{"text":"Hi"}]}"#]),
            ("responses", true, &[
                r#"{"type":"response.created","response":{"model":"gpt-x","status":"in_progress"}}"#,
                r#"{"delta":"Hi","type":"response.output_text.delta"}"#,
            ]),
            ("anthropic", true, &[
                r#"{"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":25,"output_tokens":1}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let"}}"#,
            ]),
            ("anthropic tool", true, &[
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"x"}}"#,
            ]),
            ("gemini", true, &[r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"}}],"modelVersion":"gemini-2.0"}"#]),
            ("ollama chat", false, &[
                "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":false}\n",
                "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n",
            ]),
            ("ollama generate", false, &[
                "{\"model\":\"llama3\",\"response\":\"\",\"done\":false}\n",
                "{\"model\":\"llama3\",\"response\":\"Hi\",\"done\":false}\n",
            ]),
        ];
        for (what, is_sse, events) in cases {
            let body = if is_sse { sse(events) } else { events.concat() };
            let mut c = Call::default();
            c.start_response(is_sse, false);
            for (k, e) in body
                .split_inclusive(if is_sse { "\n\n" } else { "\n" })
                .enumerate()
            {
                c.response_bytes(e.as_bytes(), false, 10 + k as u64);
            }
            c.finish(99);
            let last = 10 + events.len() as u64 - 1;
            assert_eq!(c.first_content_ns, last, "{what}: {c:#?}");
            assert_eq!(c.unreadable_events, 0, "{what}");
        }
    }

    #[test]
    fn usage_of_every_provider() {
        /// (what, server-sent events, events, [input, output, cached, reasoning])
        type Case<'a> = (&'a str, bool, &'a [&'a str], [Option<u64>; 4]);
        let cases: [Case<'_>; 5] = [
            ("responses", true, &[r#"{"type":"response.completed","response":{"model":"gpt-x","usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":2},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":18}}}"#], [Some(11), Some(7), Some(2), Some(3)]),
            ("anthropic", true, &[
                r#"{"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
            ], [Some(25), Some(15), Some(5), None]),
            ("ollama", false, &["{\"model\":\"llama3\",\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":26,\"eval_count\":290}\n"], [Some(26), Some(290), None, None]),
            ("gemini", true, &[r#"{"candidates":[{"content":{"parts":[{"text":"."}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":12,"cachedContentTokenCount":3,"thoughtsTokenCount":4}}"#], [Some(8), Some(12), Some(3), Some(4)]),
            ("plain chat", false, &["{\n  \"model\": \"m\",\n  \"choices\": [\n    {\"message\": {\"role\": \"assistant\", \"content\": \"Hi\"}, \"finish_reason\": \"stop\"}\n  ],\n  \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1}\n}"], [Some(5), Some(1), None, None]),
        ];
        for (what, is_sse, events, want) in cases {
            let body = if is_sse { sse(events) } else { events.concat() };
            every_split(&body, is_sse, |c| {
                assert_eq!(
                    [
                        c.input_tokens,
                        c.output_tokens,
                        c.cached_input_tokens,
                        c.reasoning_output_tokens
                    ],
                    want,
                    "{what}"
                );
                assert!(c.finish_reason.is_some() || what == "responses", "{what}");
            });
        }
    }

    #[test]
    fn geminis_json_array_element_by_element() {
        let chunk = |i: u32| {
            format!(
                "{{\"candidates\": [{{\"content\": {{\"parts\": [{{\"text\": \"w{i}\"}}]}}}}], \"usageMetadata\": {{\"promptTokenCount\": 8, \"candidatesTokenCount\": {}}}, \"modelVersion\": \"g-1\"}}",
                i + 1
            )
        };
        let mut c = Call::default();
        c.start_response(false, true);
        let parts = [
            format!("[{}", chunk(0)),
            format!(",\r\n{}", chunk(1)),
            "]".into(),
        ];
        for (k, p) in parts.iter().enumerate() {
            let framed = format!("{:x}\r\n{p}\r\n", p.len());
            c.response_bytes(framed.as_bytes(), false, 10 + k as u64);
        }
        c.response_bytes(b"0\r\n\r\n", false, 20);
        c.finish(20);
        assert_eq!((c.first_content_ns, c.last_content_ns), (10, 11));
        assert_eq!((c.input_tokens, c.output_tokens), (Some(8), Some(2)));
        assert_eq!(c.response_model.as_deref(), Some("g-1"));
        assert_eq!(c.unreadable_events, 0);
    }

    #[test]
    fn gaps_and_time_per_token() {
        let mut c = Call::default();
        c.start_response(true, false);
        for (k, t) in [100u64, 130, 160, 220].into_iter().enumerate() {
            let e =
                format!("data: {{\"choices\": [{{\"delta\": {{\"content\": \"w{k}\"}}}}]}}\n\n");
            c.response_bytes(e.as_bytes(), false, t);
        }
        c.response_bytes(
            b"data: {\"usage\": {\"completion_tokens\": 4}}\n\n",
            false,
            230,
        );
        c.finish(240);
        assert_eq!(
            (c.first_content_ns, c.last_content_ns, c.content_events),
            (100, 220, 4)
        );
        assert_eq!(
            (c.gaps.count, c.gaps.max_ns, c.gaps.mean_ns()),
            (3, 60, Some(40))
        );
        assert_eq!(c.time_per_output_token_ns(), Some(40));
    }

    #[test]
    fn request_fields() {
        let mut c = Call::new(Some("path-model".into()));
        c.start_request(false);
        c.request_bytes(
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"say \\\"model\\\": x\"}], \"mod",
            false,
        );
        c.request_bytes(b"el\": \"gpt\\u002d4o\", \"stream\": true}", false);
        assert_eq!(c.request_model.as_deref(), Some("gpt-4o"));
        assert_eq!(c.stream, Some(true));
        let mut c = Call::new(Some("gemini-x".into()));
        c.start_request(false);
        c.request_bytes(b"{\"contents\": []}", false);
        assert_eq!(c.request_model.as_deref(), Some("gemini-x"));
    }
}
