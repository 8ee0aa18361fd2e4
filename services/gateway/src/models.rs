//! What the gateway knows of each model's text side, fetched once from a pool over
//! `GetModelInfo`: the gateway needs no model files.

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_proto::worker::v1 as pb;
use ferrite_text::Tokenizer;
use tokio::sync::Mutex;

use crate::error::GatewayError;
use crate::pools::Pool;

/// A model's tokenizer and limits.
#[derive(Debug)]
pub struct ModelText {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// Whether text prompts are encoded with the tokenizer's special tokens (BOS).
    pub add_special_tokens: bool,
}

impl ModelText {
    pub fn from_info(info: pb::ModelInfo) -> Result<Self, GatewayError> {
        let mut config = serde_json::Map::new();
        if let Some(b) = info.bos_token {
            config.insert("bos_token".into(), b.into());
        }
        if let Some(e) = info.eos_token {
            config.insert("eos_token".into(), e.into());
        }
        if let Some(t) = info.chat_template {
            config.insert("chat_template".into(), t.into());
        }
        let tokenizer =
            Tokenizer::from_tokenizer_json(info.tokenizer_json.as_bytes(), Some(&config.into()))
                .map_err(|e| {
                    GatewayError::Internal(format!(
                        "the tokenizer of `{}` from its pool: {e}",
                        info.model
                    ))
                })?;
        Ok(Self {
            name: info.model,
            tokenizer,
            max_model_len: info.max_model_len as usize,
            vocab_size: info.vocab_size as usize,
            add_special_tokens: info.add_special_tokens,
        })
    }
}

/// Model text by name, fetched on first use.
#[derive(Debug, Default)]
pub struct ModelTexts {
    cache: Mutex<HashMap<String, Arc<ModelText>>>,
}

impl ModelTexts {
    /// The text side of `model`, asking `pools` (ready pools of that model) if not cached.
    pub async fn get(&self, model: &str, pools: &[Pool]) -> Result<Arc<ModelText>, GatewayError> {
        // Held across the fetch on purpose: concurrent first requests wait for one fetch.
        let mut cache = self.cache.lock().await;
        if let Some(t) = cache.get(model) {
            return Ok(t.clone());
        }
        let mut last_err = GatewayError::ModelNotFound(model.to_owned());
        for pool in pools {
            let mut client = pool.client.clone();
            match client.get_model_info(pb::GetModelInfoRequest {}).await {
                Ok(info) => {
                    let text = Arc::new(ModelText::from_info(info.into_inner())?);
                    cache.insert(model.to_owned(), text.clone());
                    return Ok(text);
                }
                Err(s) => last_err = GatewayError::from_worker(&s),
            }
        }
        Err(last_err)
    }
}
