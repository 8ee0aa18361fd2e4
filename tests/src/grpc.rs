//! Requests to and streams from the public `ferrite.v1.Inference` API.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferrite_proto::v1::generate_request::Prompt;
use ferrite_proto::v1::generate_response::Event;
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{
    ChatMessage, ChatMessages, Finish, GenerateRequest, GenerateResponse, SamplingParams, TokenIds,
    TokenLogprob,
};
use ferrite_proto::worker::v1 as pb;
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use futures::StreamExt;
use prost::Message;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::{MODEL, Proc};

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
                ..Default::default()
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
        ..Default::default()
    }
}

/// A whole completion, as the deltas and the finish of one stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub text: String,
    /// A reasoning model's thinking (`Delta.reasoning`).
    pub reasoning: String,
    pub token_ids: Vec<u32>,
    /// Delta messages received.
    pub deltas: usize,
    pub finish: Option<Finish>,
    /// The prompt's scores, where the request asked for them (they must come first).
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// The messages they came in.
    pub prompt_messages: usize,
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
                self.reasoning.push_str(&d.reasoning);
                self.token_ids.extend(d.token_ids);
            }
            Some(Event::Finish(f)) => self.finish = Some(f),
            Some(Event::PromptLogprobs(p)) => {
                if self.deltas > 0 {
                    return Err(format!("prompt logprobs after a delta: {p:?}"));
                }
                self.prompt_messages += 1;
                self.prompt_logprobs
                    .get_or_insert_default()
                    .extend(p.logprobs);
            }
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

/// Calls Generate for `req.n` completions and reads the whole stream: each completion by its
/// index.
pub async fn generate_choices(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
) -> Result<Vec<Completion>, Status> {
    let mut out = vec![Completion::default(); req.n.max(1) as usize];
    let mut stream = client.generate(req).await?.into_inner();
    while let Some(msg) = stream.next().await {
        let msg = msg?;
        let c = out.get_mut(msg.index as usize);
        let c = c.ok_or_else(|| Status::internal(format!("index {} past n", msg.index)))?;
        c.push(msg).map_err(Status::internal)?;
    }
    if out.iter().any(|c| c.finish.is_none()) {
        return Err(Status::internal("a completion ended without a Finish"));
    }
    Ok(out)
}

/// Greedy generation straight from a worker (bypassing the gateway): the token ids it streams.
pub async fn worker_greedy(
    client: &mut WorkerClient<Channel>,
    prompt_token_ids: Vec<u32>,
    max_tokens: u32,
) -> Result<Vec<u32>, Status> {
    let tokens = worker_tokens(client, prompt_token_ids, max_tokens, None).await?;
    Ok(tokens.iter().map(|t| t.id).collect())
}

/// Greedy generation straight from a worker, each token with its logprob and, with
/// `logprobs`, that many top alternatives.
pub async fn worker_tokens(
    client: &mut WorkerClient<Channel>,
    prompt_token_ids: Vec<u32>,
    max_tokens: u32,
    logprobs: Option<u32>,
) -> Result<Vec<pb::Token>, Status> {
    let req = pb::GenerateRequest {
        prompt_token_ids,
        sampling: Some(pb::SamplingParams {
            max_tokens,
            temperature: 0.0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ignore_eos: true,
            logprobs,
            ..pb::SamplingParams::default()
        }),
        ..pb::GenerateRequest::default()
    };
    let mut stream = client.generate(req).await?.into_inner();
    let mut tokens = Vec::new();
    while let Some(msg) = stream.next().await {
        tokens.extend(msg?.tokens);
    }
    Ok(tokens)
}

/// The final status of a raw gRPC call, as the server sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStatus {
    pub code: Code,
    pub message: String,
    /// Every header and trailer line curl printed, for error messages.
    pub head: String,
}

/// Calls `method` (e.g. `/ferrite.v1.Inference/Generate`) on `addr` with `curl --http2-prior-knowledge`,
/// sending `headers` as given, and returns the `grpc-status` the server sent.
///
/// Why curl: tonic's (and grpcio's) client enforces `grpc-timeout` itself and reports its own
/// timer (tonic: CANCELLED "Timeout expired"), so only a client that does not can show what the
/// server answers when a deadline passes.
pub async fn raw_call(
    addr: SocketAddr,
    method: &str,
    message: &impl Message,
    headers: &[(&str, &str)],
) -> anyhow::Result<RawStatus> {
    use anyhow::Context;
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "refusing a non-loopback address {addr}"
    );
    let payload = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(payload.len())?.to_be_bytes());
    framed.extend_from_slice(&payload);
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let body_path = std::env::temp_dir().join(format!(
        "ferrite-grpc-body-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&body_path, &framed)?;
    let mut args: Vec<String> = [
        "--silent",
        "--show-error",
        "--http2-prior-knowledge",
        "--max-time",
        "30",
        "--output",
        "/dev/null",
        "--dump-header",
        "-",
        "-X",
        "POST",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
    ]
    .map(String::from)
    .into();
    for (k, v) in headers {
        args.extend(["-H".into(), format!("{k}: {v}")]);
    }
    args.extend(["--data-binary".into(), format!("@{}", body_path.display())]);
    args.push(format!("http://{addr}{method}"));
    let out = Proc::output("curl", Path::new("curl"), &args, Duration::from_secs(40)).await;
    let _ = std::fs::remove_file(&body_path);
    let head = out?;
    let field = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .next_back()
    };
    let code: i32 = field("grpc-status")
        .with_context(|| format!("no grpc-status in {head}"))?
        .parse()
        .with_context(|| format!("bad grpc-status in {head}"))?;
    Ok(RawStatus {
        code: Code::from_i32(code),
        message: percent_decode(&field("grpc-message").unwrap_or_default()),
        head,
    })
}

/// Decodes grpc-message's percent-encoding.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
