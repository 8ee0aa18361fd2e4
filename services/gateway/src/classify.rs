//! Sequence classifiers' endpoints, as vLLM serves them: rerankers through the rerank API of
//! Jina and Cohere (`POST /v1/rerank`, `/rerank`, `/v2/rerank`: what RAG frameworks' rerank
//! steps call) and vLLM's score API (`POST /v1/score`, `/score`); classifiers through
//! `POST /classify` (`/v1/classify`).
//!
//! A reranker has one label: a query-document pair is rendered by the model's score template
//! where it has one (`--score-template`), else joined as its tokenizer joins a pair
//! (transformers' `tokenizer(query, document)`), and its relevance is the sigmoid of the
//! logit, as sentence-transformers' `CrossEncoder` and vLLM score it. A classifier's text is
//! tokenized as a completion's prompt; its answer is the softmax of its labels' logits (the
//! sigmoid of one label's) and the most likely label. Each input is a request of its own to
//! the gateway (`Gateway::embed` with `classify`: routed, rate-limited, traced as
//! `rerank {model}`, `score {model}` or `classify {model}`), at most [`IN_FLIGHT`] at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use ferrite_proto::v1 as api;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Gateway;
use crate::api_error::{ApiError, bad_json};
use crate::asked::unix_now;
use crate::auth::Caller;
use crate::embeddings::{EmbedArgs, first_empty, request_span};
use crate::error::GatewayError;
use crate::models::ModelText;
use crate::openai::prompts_in;
use crate::trace::Api;
use crate::validate::Prompt;

/// Inputs of one request sent to the pools at once: a rerank of a thousand documents does
/// not fill a pool's queue by itself.
const IN_FLIGHT: usize = 32;
/// The most inputs (documents, pairs) one request may hold.
const MAX_INPUTS: usize = 1024;

pub fn routes() -> Router<Gateway> {
    Router::new()
        .route("/v1/rerank", post(rerank))
        .route("/rerank", post(rerank))
        .route("/v2/rerank", post(rerank))
        .route("/v1/score", post(score))
        .route("/score", post(score))
        .route("/classify", post(classify))
        .route("/v1/classify", post(classify))
}

type Body<T> = Result<Json<T>, axum::extract::rejection::JsonRejection>;

/// A rerank request: Jina's and Cohere's fields that ferrite serves. Others (Cohere's
/// `rank_fields`, `relevant_spans`, `priority`...) are refused naming them, never ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    model: String,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: Option<bool>,
    /// Cut each document to its first this many tokens (Cohere's; none by default: a pair
    /// longer than the model's context is refused).
    #[serde(default)]
    max_tokens_per_doc: Option<usize>,
}

/// A document: its text, or an object holding it (`{"text": ...}`, as Cohere's v1 API and
/// Jina's multimodal one send).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

/// `POST /v1/rerank`: the documents by relevance to the query, most relevant first, the
/// first `top_n` of them.
async fn rerank(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body<RerankRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Json(req) = body.map_err(bad_json)?;
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents is empty", Some("documents")));
    }
    let top_n = match req.top_n {
        Some(0) => return Err(ApiError::invalid("top_n must be at least 1", Some("top_n"))),
        n => n.unwrap_or(usize::MAX).min(req.documents.len()),
    };
    if req.max_tokens_per_doc == Some(0) {
        let why = "max_tokens_per_doc must be at least 1";
        return Err(ApiError::invalid(why, Some("max_tokens_per_doc")));
    }
    let pairs = (req.documents.iter())
        .map(|d| (req.query.clone(), d.text().to_owned()))
        .collect();
    let ask = Ask::http(&gw, &req.model, "rerank", caller, headers, started);
    let answers = ask.reranked(pairs, req.max_tokens_per_doc).await?;
    let mut results: Vec<(usize, f32)> = (answers.iter().map(|(l, _)| sigmoid(l[0])))
        .enumerate()
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let with_documents = req.return_documents.unwrap_or(true);
    let results: Vec<Value> = (results.iter().take(top_n))
        .map(|&(index, score)| {
            let mut r = json!({"index": index, "relevance_score": score});
            if with_documents {
                r["document"] = json!({"text": req.documents[index].text()});
            }
            r
        })
        .collect();
    Ok(Json(json!({
        "id": response_id("rerank"),
        "model": req.model,
        "usage": {"total_tokens": tokens(&answers)},
        "results": results,
    }))
    .into_response())
}

/// vLLM's score request: `text_1` against `text_2`, one against each, or pair by pair
/// (another field is refused, naming it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest {
    model: String,
    text_1: Texts,
    text_2: Texts,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

/// `POST /v1/score`: each pair's relevance, in the pairs' order.
async fn score(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body<ScoreRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Json(req) = body.map_err(bad_json)?;
    let pairs = score_pairs(req.text_1, req.text_2)?;
    let ask = Ask::http(&gw, &req.model, "score", caller, headers, started);
    let answers = ask.reranked(pairs, None).await?;
    let data = (answers.iter().enumerate())
        .map(|(index, (l, _))| json!({"index": index, "object": "score", "score": sigmoid(l[0])}))
        .collect();
    Ok(list_body("score", &req.model, data, &answers))
}

/// The answer of `/v1/score` and `/classify` (vLLM's shape): `data` with the tokens of
/// `answers` as the usage.
fn list_body(kind: &str, model: &str, data: Vec<Value>, answers: &Answers) -> Response {
    let tokens = tokens(answers);
    Json(json!({
        "id": response_id(kind),
        "object": "list",
        "created": unix_now(),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// The pairs a score request asks for: `text_1` one text against each of `text_2`, or two
/// lists of one length pair by pair.
fn score_pairs(a: Texts, b: Texts) -> Result<Vec<(String, String)>, ApiError> {
    let bad = |m: &str| Err(ApiError::invalid(m, Some("text_2")));
    let pairs: Vec<(String, String)> = match (a, b) {
        (Texts::One(a), Texts::One(b)) => vec![(a, b)],
        (Texts::One(a), Texts::Many(b)) => b.into_iter().map(|b| (a.clone(), b)).collect(),
        (Texts::Many(a), Texts::Many(b)) if a.len() == b.len() => a.into_iter().zip(b).collect(),
        (Texts::Many(_), _) => {
            return bad("text_1 is a list: text_2 must be a list of the same length");
        }
    };
    if pairs.is_empty() {
        return bad("nothing to score: text_2 is empty");
    }
    Ok(pairs)
}

/// vLLM's classification request: a text or token ids, or a batch of either (another field
/// is refused, naming it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyRequest {
    model: String,
    input: Value,
}

/// `POST /classify`: each input's label and the probabilities of all labels, in the inputs'
/// order.
async fn classify(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body<ClassifyRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Json(req) = body.map_err(bad_json)?;
    let inputs = prompts_in(&req.input, "input")?;
    if let Some(i) = first_empty(&inputs) {
        return Err(ApiError::invalid(
            format!("input {i} is empty"),
            Some("input"),
        ));
    }
    let ask = Ask::http(&gw, &req.model, "classify", caller, headers, started);
    let labels = ask.labels(None).await?;
    let answers = ask.all(inputs).await?;
    let data = (answers.iter().enumerate())
        .map(|(index, (l, _))| {
            let probs = probabilities(l);
            json!({"index": index, "label": label_of(&labels, &probs), "probs": probs,
                "num_classes": probs.len()})
        })
        .collect();
    Ok(list_body("classify", &req.model, data, &answers))
}

/// `Classify` of the gRPC API: each input's logits, probabilities and label.
pub async fn grpc(
    gw: &Gateway,
    request: tonic::Request<api::ClassifyRequest>,
) -> Result<api::ClassifyResponse, GatewayError> {
    let started = Instant::now();
    let caller = request.extensions().get::<Caller>().copied();
    let (metadata, _, req) = request.into_parts();
    let ask = Ask {
        gw,
        model: &req.model,
        op: "classify",
        caller: caller.unwrap_or_default(),
        parent: Parent::Grpc(metadata),
        started,
    };
    let labels = ask.labels(None).await?;
    let inputs = ask.prompts_of(req.inputs, None).await?;
    let classifications = (ask.all(inputs).await?.into_iter())
        .map(|(logits, n)| {
            let probs = probabilities(&logits);
            api::Classification {
                label: label_of(&labels, &probs).unwrap_or_default(),
                logits,
                probs,
                prompt_tokens: u32::try_from(n).unwrap_or(u32::MAX),
            }
        })
        .collect();
    Ok(api::ClassifyResponse {
        classifications,
        labels,
    })
}

/// Where a request's trace context comes from.
enum Parent {
    Http(HeaderMap),
    Grpc(tonic::metadata::MetadataMap),
}

/// One request's inputs on their way to the pools.
struct Ask<'a> {
    gw: &'a Gateway,
    model: &'a str,
    /// The operation's name, for the spans.
    op: &'static str,
    caller: Caller,
    parent: Parent,
    started: Instant,
}

impl<'a> Ask<'a> {
    fn http(
        gw: &'a Gateway,
        model: &'a str,
        op: &'static str,
        caller: Option<Extension<Caller>>,
        headers: HeaderMap,
        started: Instant,
    ) -> Self {
        Self {
            gw,
            model,
            op,
            caller: caller.map(|Extension(c)| c).unwrap_or_default(),
            parent: Parent::Http(headers),
            started,
        }
    }

    /// The model's labels; refused where it is no classifier, or (`count`) has another
    /// number of labels than asked for.
    async fn labels(&self, count: Option<usize>) -> Result<Vec<String>, GatewayError> {
        let (text, _) = self.gw.model_text(self.model).await?;
        let refuse = |message: String| {
            Err(GatewayError::InvalidField {
                field: "model",
                message,
            })
        };
        match (text.labels.len(), count) {
            (0, _) => refuse(format!(
                "model `{}` is not a sequence classifier (a reranker or a classifier): it \
                 does not {}",
                self.model, self.op
            )),
            (n, Some(want)) if n != want => refuse(format!(
                "{} needs a reranker (a classifier of one label); model `{}` has {n} labels: \
                 ask /classify",
                self.op, self.model
            )),
            _ => Ok(text.labels.clone()),
        }
    }

    /// Each (query, document) pair's logit from a reranker (each document cut to its first
    /// `cut` tokens, where given), and its tokens.
    async fn reranked(
        &self,
        pairs: Vec<(String, String)>,
        cut: Option<usize>,
    ) -> Result<Answers, GatewayError> {
        self.labels(Some(1)).await?;
        let inputs = pairs.into_iter().map(|(text, text_pair)| {
            let pair = api::TextPair { text, text_pair };
            api::ClassifyInput {
                input: Some(api::classify_input::Input::Pair(pair)),
            }
        });
        let prompts = self.prompts_of(inputs.collect(), cut).await?;
        self.all(prompts).await
    }

    /// `inputs` as prompts, pairs joined by the model's tokenizer (their second text cut to
    /// `cut` tokens, where given; on a blocking thread).
    async fn prompts_of(
        &self,
        inputs: Vec<api::ClassifyInput>,
        cut: Option<usize>,
    ) -> Result<Vec<Prompt>, GatewayError> {
        use api::classify_input::Input;
        if inputs.is_empty() || inputs.len() > MAX_INPUTS {
            return Err(GatewayError::InvalidArgument(format!(
                "1 to {MAX_INPUTS} inputs (or documents), not {}",
                inputs.len()
            )));
        }
        let (text, _) = self.gw.model_text(self.model).await?;
        let prompts = tokio::task::spawn_blocking(move || {
            (inputs.into_iter())
                .map(|i| match i.input {
                    Some(Input::Text(t)) => Ok(Prompt::Text(t)),
                    Some(Input::TokenIds(ids)) => Ok(Prompt::TokenIds(ids.ids)),
                    Some(Input::Pair(p)) => joined(&text, p, cut),
                    None => Ok(Prompt::Text(String::new())),
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("the tokenizing thread: {e}")))?
        .map_err(|e| GatewayError::InvalidArgument(e.to_string()))?;
        match first_empty(&prompts) {
            Some(i) => Err(GatewayError::InvalidArgument(format!("input {i} is empty"))),
            None => Ok(prompts),
        }
    }

    /// The logits of each input, in order, with its tokens.
    async fn all(&self, inputs: Vec<Prompt>) -> Result<Answers, GatewayError> {
        let one = |input: Prompt| async move {
            let span = request_span(self.op, self.model);
            let api = match &self.parent {
                Parent::Http(headers) => {
                    ferrite_telemetry::propagation::set_parent_from_headers(&span, headers);
                    Api::Http
                }
                Parent::Grpc(metadata) => {
                    ferrite_telemetry::propagation::set_parent_from_metadata(&span, metadata);
                    Api::Grpc
                }
            };
            let args = EmbedArgs {
                model: self.model,
                input: &input,
                dimensions: 0,
                classify: true,
                truncate: None,
                caller: self.caller,
                started: self.started,
                api,
            };
            self.gw.embed(args, span).await
        };
        futures::stream::iter(inputs)
            .map(one)
            .buffered(IN_FLIGHT)
            .try_collect()
            .await
    }
}

/// A pair as one prompt: rendered by the model's score template, or joined as its tokenizer
/// joins a pair; its second text first cut to `cut` tokens (without special tokens).
fn joined(
    text: &ModelText,
    mut pair: api::TextPair,
    cut: Option<usize>,
) -> Result<Prompt, ferrite_text::TextError> {
    if let Some(n) = cut {
        let ids = text.tokenizer.encode(&pair.text_pair, false)?;
        if ids.len() > n {
            pair.text_pair = text.tokenizer.decode(&ids[..n], false)?;
        }
    }
    match &text.score_template {
        Some(t) => t.render(&pair.text, &pair.text_pair).map(Prompt::Text),
        None => (text.tokenizer)
            .encode_pair(&pair.text, &pair.text_pair)
            .map(Prompt::TokenIds),
    }
}

/// Each input's logits and its tokens.
type Answers = Vec<(Vec<f32>, usize)>;

/// The tokens of all the answers.
fn tokens(answers: &Answers) -> usize {
    answers.iter().map(|(_, n)| n).sum()
}

/// The label of the largest probability (none where a pool answered with more logits than
/// the model has labels).
fn label_of(labels: &[String], probs: &[f32]) -> Option<String> {
    let best = (0..probs.len()).max_by(|&a, &b| probs[a].total_cmp(&probs[b]))?;
    labels.get(best).cloned()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// A classifier's probabilities: the softmax of its logits, the sigmoid of one.
fn probabilities(logits: &[f32]) -> Vec<f32> {
    if let [one] = logits {
        return vec![sigmoid(*one)];
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = logits.iter().map(|l| ((l - max) as f64).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| (e / sum) as f32).collect()
}

/// An id of `kind`, unique enough within a gateway's life.
fn response_id(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{kind}-{:x}{n:06x}", unix_now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: Value) -> Texts {
        serde_json::from_value(v).expect("texts")
    }

    /// One against one, one against many, and pair by pair; lists of other lengths refused.
    #[test]
    fn score_pairs_follow_vllms_rules() {
        let p = score_pairs(texts(json!("q")), texts(json!(["a", "b"]))).expect("pairs");
        assert_eq!(p, [("q".into(), "a".into()), ("q".into(), "b".into())]);
        let p = score_pairs(texts(json!(["q", "r"])), texts(json!(["a", "b"]))).expect("pairs");
        assert_eq!(p, [("q".into(), "a".into()), ("r".into(), "b".into())]);
        assert_eq!(
            score_pairs(texts(json!("q")), texts(json!("a")))
                .expect("pair")
                .len(),
            1
        );
        for (a, b) in [
            (json!(["q", "r"]), json!(["a"])),
            (json!(["q"]), json!("a")),
        ] {
            let e = score_pairs(texts(a), texts(b)).expect_err("refused");
            assert_eq!(e.param, Some("text_2"));
        }
        let e = score_pairs(texts(json!("q")), texts(json!([]))).expect_err("empty");
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    /// Softmax over several labels (summing to 1, in order), the sigmoid of one.
    #[test]
    fn probabilities_are_softmax_or_sigmoid() {
        let p = probabilities(&[1.0, 2.0, 3.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[0] < p[1] && p[1] < p[2]);
        assert!((p[2] - 0.665_240_9).abs() < 1e-6, "{p:?}");
        assert_eq!(probabilities(&[0.0]), vec![0.5]);
        assert!((probabilities(&[2.0])[0] - 0.880_797).abs() < 1e-6);
    }

    /// Documents as texts or objects with a text, as the rerank APIs' clients send them; a
    /// field not served is refused by name.
    #[test]
    fn documents_are_texts_or_objects() {
        let r: RerankRequest = serde_json::from_value(json!({"model": "m", "query": "q",
            "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": false}))
        .expect("request");
        let texts: Vec<&str> = r.documents.iter().map(Document::text).collect();
        assert_eq!(texts, ["a", "b"]);
        let unserved = json!({"model": "m", "query": "q", "documents": ["a"],
            "rank_fields": ["text"]});
        let e = serde_json::from_value::<RerankRequest>(unserved).expect_err("refused");
        assert!(e.to_string().contains("rank_fields"), "{e}");
    }
}
