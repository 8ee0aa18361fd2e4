//! Requests to and streams from the public `ferrite.v1.Inference` API.

use ferrite_proto::v1::generate_request::Prompt;
use ferrite_proto::v1::generate_response::Event;
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{
    ChatMessage, ChatMessages, Finish, GenerateRequest, GenerateResponse, SamplingParams, TokenIds,
};
use ferrite_proto::worker::v1 as pb;
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use futures::StreamExt;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use crate::MODEL;

/// A greedy request for [`MODEL`] that ignores EOS, so it produces exactly `max_tokens` tokens.
pub fn greedy_text(prompt: &str, max_tokens: u32) -> GenerateRequest {
    request(Prompt::Text(prompt.to_owned()), max_tokens)
}

/// A greedy chat request (one user message) that stops at EOS.
pub fn greedy_chat(user: &str, max_tokens: u32) -> GenerateRequest {
    let mut req = request(
        Prompt::Chat(ChatMessages {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: user.to_owned(),
            }],
        }),
        max_tokens,
    );
    if let Some(s) = req.sampling.as_mut() {
        s.ignore_eos = false;
    }
    req
}

/// A greedy request with a token-id prompt.
pub fn greedy_ids(ids: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    request(Prompt::TokenIds(TokenIds { ids }), max_tokens)
}

fn request(prompt: Prompt, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        model: MODEL.into(),
        prompt: Some(prompt),
        sampling: Some(SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ignore_eos: true,
            ..SamplingParams::default()
        }),
    }
}

/// A whole completion, as the deltas and the finish of one stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Delta messages received.
    pub deltas: usize,
    pub finish: Option<Finish>,
}

impl Completion {
    /// Appends one stream message; fails on a message after the finish.
    pub fn push(&mut self, msg: GenerateResponse) -> Result<(), String> {
        if self.finish.is_some() {
            return Err(format!("a message after the finish: {msg:?}"));
        }
        match msg.event {
            Some(Event::Delta(d)) => {
                self.deltas += 1;
                self.text.push_str(&d.text);
                self.token_ids.extend(d.token_ids);
            }
            Some(Event::Finish(f)) => self.finish = Some(f),
            None => return Err("a message without an event".into()),
        }
        Ok(())
    }
}

/// Reads `stream` to its end. A stream error is returned as is.
pub async fn collect(mut stream: Streaming<GenerateResponse>) -> Result<Completion, Status> {
    let mut c = Completion::default();
    while let Some(msg) = stream.next().await {
        c.push(msg?).map_err(Status::internal)?;
    }
    if c.finish.is_none() {
        return Err(Status::internal("the stream ended without a Finish"));
    }
    Ok(c)
}

/// Calls Generate and reads the whole stream.
pub async fn generate(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
) -> Result<Completion, Status> {
    let stream = client.generate(req).await?.into_inner();
    collect(stream).await
}

/// Greedy generation straight from a worker (bypassing the gateway): the token ids it streams.
pub async fn worker_greedy(
    client: &mut WorkerClient<Channel>,
    prompt_token_ids: Vec<u32>,
    max_tokens: u32,
) -> Result<Vec<u32>, Status> {
    let req = pb::GenerateRequest {
        prompt_token_ids,
        sampling: Some(pb::SamplingParams {
            max_tokens,
            temperature: 0.0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ignore_eos: true,
            ..pb::SamplingParams::default()
        }),
    };
    let mut stream = client.generate(req).await?.into_inner();
    let mut ids = Vec::new();
    while let Some(msg) = stream.next().await {
        ids.extend(msg?.tokens.iter().map(|t| t.id));
    }
    Ok(ids)
}
