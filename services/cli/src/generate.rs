//! `ferrite generate`: one prompt, streamed to the terminal or printed as one JSON object.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::engine::FinishReason;
use ferrite_engine::sampler::SamplingParams;
use ferrite_text::{ChatMessage, TextStream};
use serde_json::json;

use crate::loading::{self, ModelArgs};

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Run with this LoRA adapter of --lora-modules.
    #[arg(long)]
    lora: Option<String>,
    /// Wrap the prompt as one user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message before the user message.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Stop before this text (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Stop after this token id (repeatable).
    #[arg(long)]
    stop_token_id: Vec<u32>,
    /// Add BIAS to token ID's logit before sampling, as ID=BIAS (repeatable; -100 bans it).
    #[arg(long, value_parser = parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Keep generating past EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Report this many top alternatives per token (JSON only).
    #[arg(long)]
    logprobs: Option<usize>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// `ID=BIAS`, as `--logit-bias` takes it.
fn parse_logit_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or("expected ID=BIAS")?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("`{id}` is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("`{bias}` is not a number"))?;
    Ok((id, bias))
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let mut params = SamplingParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        stop_token_ids: args.stop_token_id.clone(),
        ignore_eos: args.ignore_eos,
        logprobs: args.logprobs,
        logit_bias: args.logit_bias.clone(),
        prompt_logprobs: None,
        embed: None,
        lora: None,
    };
    params.validate()?;
    let (mut engine, tokenizer) = loading::engine(&args.model)?;
    if let Some(name) = &args.lora {
        params.lora = Some(engine.lora_number(name).context("--lora")?);
    }
    let (rendered, prompt_ids) = if args.chat {
        let template = tokenizer
            .chat_template()
            .context("--chat: this model has no chat template")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        // The model's template defaults (`--default-chat-template-kwargs`), as served.
        let kwargs = match &args.model.default_chat_template_kwargs {
            Some(json) => ferrite_text::chat::parse_kwargs(json)?,
            None => ferrite_text::TemplateKwargs::new(),
        };
        let rendered = template.render_with(&messages, None, true, &kwargs)?;
        let ids = tokenizer.encode(&rendered, false)?;
        (Some(rendered), ids)
    } else {
        (None, tokenizer.encode(&args.prompt, true)?)
    };
    let mut text_stream = TextStream::new(tokenizer.clone(), args.stop.clone());
    let mut text = String::new();
    let mut stopped_by_string = false;
    let started = Instant::now();
    let mut first_token_at = None;
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    let mut decode_error = None;
    let results = engine.run_to_completion(vec![(0, prompt_ids.clone(), params)], |ev| {
        first_token_at.get_or_insert_with(|| started.elapsed());
        let out = match text_stream.push(ev.token.id) {
            Ok(o) => o,
            Err(e) => {
                decode_error = Some(e);
                return false;
            }
        };
        text.push_str(&out.text);
        if stream {
            let _ = stdout.write_all(out.text.as_bytes());
            let _ = stdout.flush();
        }
        stopped_by_string = out.stopped.is_some();
        !stopped_by_string
    })?;
    if let Some(e) = decode_error {
        return Err(e.into());
    }
    if !stopped_by_string {
        let rest = text_stream.finish()?;
        stopped_by_string = rest.stopped.is_some();
        if stream {
            let _ = stdout.write_all(rest.text.as_bytes());
        }
        text.push_str(&rest.text);
    }
    let elapsed = started.elapsed();
    let generation = results.get(&0).cloned().unwrap_or_default();
    let finish = if stopped_by_string {
        FinishReason::Stop
    } else {
        generation.finish.unwrap_or(FinishReason::Abort)
    };
    if stream {
        let _ = writeln!(stdout);
        return Ok(());
    }
    let token_ids = generation.token_ids();
    let ttft = first_token_at.unwrap_or(elapsed);
    let decode_s = (elapsed - ttft).as_secs_f64();
    let mut out = json!({
        "model": args.model.model,
        "prompt": args.prompt,
        "prompt_token_ids": prompt_ids,
        "token_ids": token_ids,
        "text": text,
        "finish_reason": finish.as_str(),
        "usage": { "prompt_tokens": prompt_ids.len(), "completion_tokens": token_ids.len() },
        "timing": {
            "time_to_first_token_ms": ttft.as_secs_f64() * 1e3,
            "total_ms": elapsed.as_secs_f64() * 1e3,
            "decode_tokens_per_s": if decode_s > 0.0 { (token_ids.len().saturating_sub(1)) as f64 / decode_s } else { 0.0 },
        },
    });
    if let Some(r) = rendered {
        out["rendered_prompt"] = json!(r);
    }
    if args.logprobs.is_some() {
        out["logprobs"] = generation
            .tokens
            .iter()
            .map(|t| json!({ "token_id": t.id, "logprob": t.logprob, "top": t.top.iter().map(|(i, l)| json!([i, l])).collect::<Vec<_>>() }))
            .collect();
    }
    writeln!(stdout, "{out}")?;
    Ok(())
}
