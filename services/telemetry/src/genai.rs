//! Attribute names of the OpenTelemetry GenAI semantic conventions (gen-ai spans, v1.37+) that
//! ferrite's request spans carry, and ferrite's own where the conventions have none.

pub const OPERATION_NAME: &str = "gen_ai.operation.name";
pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const RESPONSE_ID: &str = "gen_ai.response.id";
pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const REQUEST_TOP_K: &str = "gen_ai.request.top_k";
pub const REQUEST_SEED: &str = "gen_ai.request.seed";
/// Set only when a request asks for more than one choice (OpenAI's `n`).
pub const REQUEST_CHOICE_COUNT: &str = "gen_ai.request.choice.count";
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// Seconds from the request's arrival to its first token. The conventions define this as the
/// metric `gen_ai.server.time_to_first_token`; the span carries the same name and unit.
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
pub const ERROR_TYPE: &str = "error.type";
pub const SERVER_ADDRESS: &str = "server.address";

/// `gen_ai.provider.name` for ferrite's spans.
pub const PROVIDER: &str = "ferrite";
/// `gen_ai.operation.name` of a chat completion.
pub const OP_CHAT: &str = "chat";
/// `gen_ai.operation.name` of a plain-text completion.
pub const OP_TEXT_COMPLETION: &str = "text_completion";

/// A string-array attribute value (`gen_ai.response.finish_reasons` has one reason per choice).
pub fn string_array(items: &[&'static str]) -> opentelemetry::Value {
    let items = items.iter().map(|s| opentelemetry::StringValue::from(*s));
    opentelemetry::Value::Array(opentelemetry::Array::String(items.collect()))
}
