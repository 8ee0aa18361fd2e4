//! The public `ferrite.v1.Inference` gRPC service.

use std::pin::Pin;
use std::time::Instant;

use ferrite_proto::v1 as api;
use ferrite_structured::Spec;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::stream::GenerateEvent;
use crate::tools::{Function, ToolChoice, Tools};
use crate::validate::{Constraint, Prompt, tokenize};
use crate::{Gateway, GatewayError, GenerateArgs, trace};

/// The gRPC face of a [`Gateway`].
#[derive(Debug, Clone)]
pub struct InferenceService {
    gateway: Gateway,
}

impl InferenceService {
    pub fn new(gateway: Gateway) -> Self {
        Self { gateway }
    }
}

/// Prompt scores per `PromptLogprobs` message at most: a long prompt's scores with 20
/// alternatives each would pass a client's 4 MiB message limit in one (200 bytes a token).
pub const PROMPT_SCORES_PER_MESSAGE: usize = 1024;

/// Choice `index`'s event as the API sends it: one message, or a prompt's scores in several.
fn to_proto(index: usize, ev: GenerateEvent) -> Vec<api::GenerateResponse> {
    use api::generate_response::Event;
    let index = u32::try_from(index).unwrap_or(u32::MAX);
    let message = |event| api::GenerateResponse {
        event: Some(event),
        index,
    };
    let event = match ev {
        // A prompt of one token has no score: one empty message says so.
        GenerateEvent::Prompt { logprobs, .. } if logprobs.is_empty() => {
            Event::PromptLogprobs(api::PromptLogprobs::default())
        }
        GenerateEvent::Prompt { logprobs, .. } => {
            let chunks = logprobs.chunks(PROMPT_SCORES_PER_MESSAGE).map(|c| {
                Event::PromptLogprobs(api::PromptLogprobs {
                    logprobs: c.to_vec(),
                })
            });
            return chunks.map(message).collect();
        }
        // gRPC sends a request's calls whole, with its finish.
        GenerateEvent::Delta {
            text,
            reasoning,
            token_ids,
            logprobs,
            ..
        } => Event::Delta(api::Delta {
            text,
            reasoning,
            token_ids,
            logprobs,
        }),
        GenerateEvent::Finish {
            reason,
            tool_calls,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            reasoning_tokens,
            time_to_first_token_ms,
            ..
        } => Event::Finish(api::Finish {
            reason: reason as i32,
            tool_calls: tool_calls
                .into_iter()
                .map(|c| api::ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            usage: Some(api::Usage {
                prompt_tokens,
                completion_tokens,
                prompt_tokens_details: Some(api::PromptTokensDetails { cached_tokens }),
                completion_tokens_details: Some(api::CompletionTokensDetails { reasoning_tokens }),
            }),
            time_to_first_token_ms,
        }),
    };
    vec![message(event)]
}

/// The interceptor that lets in only calls bearing one of `keys` (`authorization` metadata).
pub fn key_check(
    keys: std::sync::Arc<crate::ApiKeys>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let caller = keys
            .check(auth)
            .map_err(|d| Status::unauthenticated(d.message()))?;
        let mut req = req;
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// How much earlier than the client's `grpc-timeout` the gateway gives up.
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(10);

/// Whose limits a request counts against (the key check put it there; none: everyone's).
fn caller_of<T>(req: &Request<T>) -> crate::auth::Caller {
    (req.extensions().get::<crate::auth::Caller>())
        .copied()
        .unwrap_or_default()
}

/// The deadline the client set with `grpc-timeout`, if any.
fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let raw = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => std::time::Duration::from_secs(n * 3600),
        "M" => std::time::Duration::from_secs(n * 60),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    // tonic's server enforces the same timeout from the moment the headers arrived (answering
    // CANCELLED); firing a little earlier makes the client see DEADLINE_EXCEEDED.
    Some(Instant::now() + d.saturating_sub(DEADLINE_MARGIN))
}

/// An `Embed` request's inputs as prompts: 1 to [`crate::openai::MAX_PROMPTS`], none empty.
fn embed_inputs(inputs: Vec<api::EmbedInput>) -> Result<Vec<Prompt>, GatewayError> {
    use api::embed_input::Input;
    let bad = |m: String| Err(GatewayError::InvalidArgument(m));
    let max = crate::openai::MAX_PROMPTS;
    if inputs.is_empty() || inputs.len() > max {
        return bad(format!("1 to {max} inputs, not {}", inputs.len()));
    }
    let prompts: Vec<Prompt> = inputs
        .into_iter()
        .map(|i| match i.input {
            Some(Input::Text(t)) => Prompt::Text(t),
            Some(Input::TokenIds(ids)) => Prompt::TokenIds(ids.ids),
            None => Prompt::Text(String::new()),
        })
        .collect();
    match crate::embeddings::first_empty(&prompts) {
        Some(i) => bad(format!("input {i} is empty")),
        None => Ok(prompts),
    }
}

/// A request's tools, as `ferrite.v1` names them.
pub fn tools_of(
    tools: Vec<api::Tool>,
    choice: &str,
    parallel: Option<bool>,
) -> Result<Option<Tools>, GatewayError> {
    let bad = |field, message| GatewayError::InvalidField { field, message };
    let functions = tools
        .into_iter()
        .map(|t| {
            let parameters = match t.parameters.trim() {
                "" => None,
                text => Some(
                    serde_json::from_str(text)
                        .map_err(|e| format!("the parameters of `{}` are not JSON: {e}", t.name))?,
                ),
            };
            let description = Some(t.description).filter(|d| !d.is_empty());
            Function::new(&t.name, description, parameters)
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(|m| bad("tools", m))?;
    let choice = match choice {
        "" | "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "required" => ToolChoice::Required,
        name => ToolChoice::Named(name.to_owned()),
    };
    Tools::new(functions, choice, parallel.unwrap_or(true)).map_err(|m| bad("tool_choice", m))
}

/// A request's constraint, as `ferrite.v1` names it.
pub fn constraint_of(c: api::generate_request::Constraint) -> Result<Constraint, GatewayError> {
    use api::generate_request::Constraint as C;
    let (spec, field) = match c {
        C::JsonSchema(text) => {
            let schema = serde_json::from_str(&text).map_err(|e| GatewayError::InvalidField {
                field: "json_schema",
                message: format!("not JSON: {e}"),
            })?;
            let spec = Spec::JsonSchema {
                schema,
                strict: false,
            };
            (spec, "json_schema")
        }
        C::JsonObject(true) => (Spec::JsonObject, "json_object"),
        C::JsonObject(false) => {
            return Err(GatewayError::InvalidArgument(
                "`json_object` is set to false: leave the constraint unset for none".into(),
            ));
        }
        C::Regex(r) => (Spec::Regex(r), "regex"),
        C::Choice(c) => (Spec::Choice(c.choices), "choice"),
        C::Lark(g) => (Spec::Lark(g), "lark"),
    };
    Ok(Constraint { spec, field })
}

type EventStream = Pin<Box<dyn Stream<Item = Result<api::GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::inference_server::Inference for InferenceService {
    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<api::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let started = Instant::now();
        let deadline = deadline_of(&request);
        let caller = caller_of(&request);
        let (metadata, _, req) = request.into_parts();
        let prompt = Prompt::from_proto(req.prompt, &req.chat_template_kwargs)?;
        let constraint = req.constraint.map(constraint_of).transpose()?;
        let tools = tools_of(req.tools, &req.tool_choice, req.parallel_tool_calls)?;
        let choices = ferrite_proto::sampling::choices(Some(req.n.max(1)))
            .map_err(GatewayError::InvalidArgument)?;
        let span = trace::request_span(&req.model, &prompt);
        ferrite_telemetry::propagation::set_parent_from_metadata(&span, &metadata);
        let args = GenerateArgs {
            model: &req.model,
            prompt: &prompt,
            sampling: req.sampling,
            constraint,
            tools: tools.map(std::sync::Arc::new),
            deadline,
            started,
            api: trace::Api::Grpc,
            caller,
            choices,
        };
        let choices = self.gateway.generate(args, span).await?;
        let events = crate::stream::merge(choices.into_streams());
        Ok(Response::new(Box::pin(events.flat_map(|(i, r)| {
            let messages = match r {
                Ok(ev) => to_proto(i, ev).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(Status::from(e))],
            };
            futures::stream::iter(messages)
        }))))
    }

    async fn embed(
        &self,
        request: Request<api::EmbedRequest>,
    ) -> Result<Response<api::EmbedResponse>, Status> {
        let started = Instant::now();
        let caller = caller_of(&request);
        let (metadata, _, req) = request.into_parts();
        let inputs = embed_inputs(req.inputs)?;
        let asked = inputs.iter().map(|input| {
            let span = crate::embeddings::embeddings_span(&req.model);
            ferrite_telemetry::propagation::set_parent_from_metadata(&span, &metadata);
            let args = crate::embeddings::EmbedArgs {
                model: &req.model,
                input,
                dimensions: req.dimensions,
                classify: false,
                truncate: None,
                caller,
                started,
                api: trace::Api::Grpc,
            };
            self.gateway.embed(args, span)
        });
        let embeddings = futures::future::try_join_all(asked)
            .await?
            .into_iter()
            .map(|(values, n)| api::Embedding {
                values,
                prompt_tokens: u32::try_from(n).unwrap_or(u32::MAX),
            })
            .collect();
        Ok(Response::new(api::EmbedResponse { embeddings }))
    }

    async fn classify(
        &self,
        request: Request<api::ClassifyRequest>,
    ) -> Result<Response<api::ClassifyResponse>, Status> {
        Ok(Response::new(
            crate::classify::grpc(&self.gateway, request).await?,
        ))
    }

    async fn tokenize(
        &self,
        request: Request<api::TokenizeRequest>,
    ) -> Result<Response<api::TokenizeResponse>, Status> {
        let req = request.into_inner();
        let (text, _) = self.gateway.model_text(&req.model).await?;
        use api::tokenize_request::Input;
        let prompt = match req.input {
            Some(Input::Text(t)) => {
                let ids = text
                    .encode_text(&t, req.add_special_tokens)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                return Ok(Response::new(api::TokenizeResponse {
                    token_ids: ids,
                    rendered: String::new(),
                }));
            }
            Some(Input::Chat(c)) => {
                Prompt::from_proto(Some(api::generate_request::Prompt::Chat(c)), "")?
            }
            None => {
                return Err(Status::invalid_argument(
                    "nothing to tokenize (text or chat)",
                ));
            }
        };
        let (ids, rendered) = tokenize(&text, &prompt, None)?;
        Ok(Response::new(api::TokenizeResponse {
            token_ids: ids,
            rendered: rendered.unwrap_or_default(),
        }))
    }

    async fn detokenize(
        &self,
        request: Request<api::DetokenizeRequest>,
    ) -> Result<Response<api::DetokenizeResponse>, Status> {
        let req = request.into_inner();
        let (text, _) = self.gateway.model_text(&req.model).await?;
        let s = text
            .tokenizer
            .decode(&req.token_ids, req.skip_special_tokens)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(api::DetokenizeResponse { text: s }))
    }

    async fn list_models(
        &self,
        _: Request<api::ListModelsRequest>,
    ) -> Result<Response<api::ListModelsResponse>, Status> {
        let mut models = Vec::new();
        for s in self.gateway.pools().models() {
            let sampling_defaults = self.gateway.sampling_defaults(&s.name).await;
            models.push(api::Model {
                name: s.name,
                max_model_len: s.max_model_len,
                ready_pools: s.ready_pools,
                sampling_defaults,
                parent: s.parent,
            });
        }
        Ok(Response::new(api::ListModelsResponse { models }))
    }
}
