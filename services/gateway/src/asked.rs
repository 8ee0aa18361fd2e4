//! What an OpenAI-style request asks of the pools, whichever endpoint it came by (completions,
//! chats, responses), and opening its choices' streams.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use ferrite_proto::v1 as api;

use crate::api_error::ApiError;
use crate::auth::Caller;
use crate::stream::Indexed;
use crate::tools::Tools;
use crate::validate::{Constraint, Prompt};
use crate::{Choices, Gateway, GenerateArgs, trace};

/// What a request asks of the pools, whichever endpoint it came by.
pub(crate) struct Asked {
    pub model: String,
    pub sampling: api::SamplingParams,
    pub constraint: Option<Constraint>,
    pub tools: Option<Arc<Tools>>,
    /// Choices per prompt (`n`).
    pub choices: u32,
}

/// Opens `asked.choices` choices of each of `prompts`, each prompt a request of its own to the
/// gateway (its span, its limits), all at once; gives their events merged, and how many
/// choices there are (choice `j` of prompt `i` has index `i * choices + j`).
pub(crate) async fn open(
    gw: &Gateway,
    headers: &HeaderMap,
    caller: Caller,
    asked: &Asked,
    prompts: &[Prompt],
    started: Instant,
) -> Result<(impl futures::Stream<Item = Indexed> + Send + 'static, usize), ApiError> {
    let opened = prompts.iter().map(|prompt| {
        let span = trace::request_span(&asked.model, prompt);
        ferrite_telemetry::propagation::set_parent_from_headers(&span, headers);
        let args = GenerateArgs {
            model: &asked.model,
            prompt,
            sampling: Some(asked.sampling.clone()),
            constraint: asked.constraint.clone(),
            tools: asked.tools.clone(),
            deadline: None,
            started,
            api: trace::Api::Http,
            caller,
            choices: asked.choices,
        };
        gw.generate(args, span)
    });
    let streams: Vec<_> = futures::future::try_join_all(opened)
        .await?
        .into_iter()
        .flat_map(Choices::into_streams)
        .collect();
    let n = streams.len();
    Ok((crate::stream::merge(streams), n))
}

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
