//! vLLM's tokenizer endpoints over HTTP, which evaluation harnesses use instead of a tokenizer
//! of their own (lm-eval's `local-completions` looks for them: its "remote tokenizer"):
//! `GET /tokenizer_info` (the special tokens and the chat template), `POST /tokenize` (a text,
//! or chat messages rendered with the model's template) and `POST /detokenize`. Each takes a
//! `model`, which may be left out while the gateway serves one model. The same tokenizer as
//! the gRPC API's `Tokenize` and `Detokenize`, and as every request's prompt.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Gateway;
use crate::api_error::{ApiError, bad_json};
use crate::models::ModelText;
use crate::openai::{ChatMessageIn, chat_prompt};
use crate::validate::{Prompt, tokenize};

pub fn routes() -> Router<Gateway> {
    Router::new()
        .route("/tokenizer_info", axum::routing::get(tokenizer_info))
        .route("/tokenize", axum::routing::post(tokenize_text))
        .route("/detokenize", axum::routing::post(detokenize))
}

#[derive(Debug, Deserialize)]
struct ModelQuery {
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    chat_template_kwargs: Option<Value>,
    /// Default: the model's own choice for text prompts (its BOS, where it adds one).
    add_special_tokens: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<u32>,
    #[serde(default)]
    skip_special_tokens: bool,
}

/// The text side of `model`, or of the only model served when it is left out; and the
/// largest context its pools hold.
async fn model_text(gw: &Gateway, model: Option<&str>) -> Result<(Arc<ModelText>, u32), ApiError> {
    let models = gw.pools().models();
    let name = match (model, &models[..]) {
        (Some(m), _) => m.to_owned(),
        (None, [only]) => only.name.clone(),
        (None, _) => {
            let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
            return Err(ApiError::invalid(
                format!("name the `model`: this gateway serves {names:?}"),
                Some("model"),
            ));
        }
    };
    let (text, _) = gw.model_text(&name).await?;
    let max_len = (models.iter())
        .find(|m| m.name == name)
        .map_or(0, |m| m.max_model_len);
    Ok((text, max_len))
}

async fn tokenizer_info(
    State(gw): State<Gateway>,
    Query(q): Query<ModelQuery>,
) -> Result<Json<Value>, ApiError> {
    let (text, max_len) = model_text(&gw, q.model.as_deref()).await?;
    let t = &text.tokenizer;
    Ok(Json(json!({
        "model": text.name,
        "eos_token": t.eos_token(),
        "bos_token": t.bos_token(),
        "pad_token": null,
        "chat_template": t.chat_template().map(|c| c.source()),
        "add_special_tokens": text.add_special_tokens,
        "vocab_size": text.vocab_size,
        "max_model_len": max_len,
    })))
}

async fn tokenize_text(
    State(gw): State<Gateway>,
    body: Result<Json<TokenizeBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let (text, max_len) = model_text(&gw, req.model.as_deref()).await?;
    let ids = match (req.prompt, req.messages) {
        (Some(p), None) => (text.encode_text(&p, req.add_special_tokens))
            .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?,
        (None, Some(messages)) => {
            let chat = chat_prompt(&messages, req.chat_template_kwargs.as_ref())?;
            tokenize(&text, &Prompt::Chat(chat), None)?.0
        }
        _ => {
            return Err(ApiError::invalid(
                "send one of `prompt` (a text) and `messages` (a chat)",
                Some("prompt"),
            ));
        }
    };
    Ok(Json(
        json!({ "tokens": ids, "count": ids.len(), "max_model_len": max_len }),
    ))
}

async fn detokenize(
    State(gw): State<Gateway>,
    body: Result<Json<DetokenizeBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let (text, _) = model_text(&gw, req.model.as_deref()).await?;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= text.vocab_size) {
        return Err(ApiError::invalid(
            format!(
                "token id {bad} is outside the vocabulary (size {})",
                text.vocab_size
            ),
            Some("tokens"),
        ));
    }
    let prompt = (text.tokenizer.decode(&req.tokens, req.skip_special_tokens))
        .map_err(|e| ApiError::invalid(e.to_string(), Some("tokens")))?;
    Ok(Json(json!({ "prompt": prompt })))
}
