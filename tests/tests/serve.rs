//! `ferrite serve`: gateway and worker in one process with in-process placement (no etcd).

use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::cluster::{ServeProc, WORKER_READY_TIMEOUT, addr_after, channel};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{MODEL, Proc, ferrite_bin, http, metrics, serial, wait};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{FinishReason, ListModelsRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_grpc_and_openai_without_etcd_and_drains_on_sigterm() -> Result<()> {
    let _turn = serial().await;
    let ServeProc {
        grpc: grpc_addr,
        http: http_addr,
        proc: mut serve,
    } = ServeProc::start().await?;
    let mut client = InferenceClient::new(channel(grpc_addr).await?);

    wait::until("serve to list its model", Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            match client.list_models(ListModelsRequest {}).await {
                Ok(r)
                    if r.get_ref()
                        .models
                        .iter()
                        .any(|m| m.name == MODEL && m.ready_pools == 1) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await?;

    let c = grpc::generate(&mut client, greedy_text("The capital of France is", 8)).await?;
    assert_eq!(c.token_ids.len(), 8, "{c:?}");
    assert!(!c.text.is_empty(), "{c:?}");
    assert_eq!(
        c.finish.as_ref().map(|f| f.reason()),
        Some(FinishReason::Length),
        "{c:?}"
    );

    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let r = http::post_json(http_addr, "/v1/chat/completions", &body).await?;
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json()?;
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    assert!(
        v["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=8).contains(&n)),
        "{v}"
    );

    // SIGTERM with a request in flight: it finishes, then the process exits 0.
    let mut in_flight = client
        .generate(greedy_text("Once upon a time", 24))
        .await?
        .into_inner();
    in_flight.message().await?.context("no first message")?;
    serve.signal_term()?;
    let rest = tokio::time::timeout(Duration::from_secs(10), grpc::collect(in_flight))
        .await
        .context("the in-flight request did not finish within 10 s of SIGTERM")?;
    let rest =
        rest.map_err(|s| anyhow::anyhow!("the in-flight request failed after SIGTERM: {s:?}"))?;
    assert_eq!(
        rest.finish.as_ref().map(|f| f.reason()),
        Some(FinishReason::Length),
        "{rest:?}"
    );

    let status = serve.wait_exit(Duration::from_secs(10)).await;
    let status = match status {
        Ok(s) => s,
        Err(e) => anyhow::bail!("{e}\n{}", serve.stderr_report().await),
    };
    assert!(
        status.success(),
        "serve exited with {status} after SIGTERM\n{}",
        serve.stderr_report().await
    );
    Ok(())
}

/// The README's `curl`, word for word: `ferrite serve` with its defaults samples the default
/// model as the registry recommends (temperature 0.2, top-p 0.5), which names Paris, where
/// temperature 1 wandered off to Gabon and North America; a request's own temperature still
/// wins, drawing exactly what `ferrite generate` draws at that temperature and seed (and the
/// model's top-p, which the request left unset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_curl_names_paris_and_a_requests_own_temperature_wins() -> Result<()> {
    let _turn = serial().await;
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--kv-cache-mib",
        "400",
    ]
    .map(String::from);
    let mut serve = Proc::spawn("serve", &ferrite_bin()?, &args)?;
    let lines = serve.wait_ready(WORKER_READY_TIMEOUT).await?;
    let http_addr = addr_after(&lines, "HTTP")?;
    // First, with nothing in the prefix cache: the same steps as `ferrite generate`'s.
    let question = "What is the capital of France?";
    let own = json!({"model": "smollm2-135m", "messages": [{"role": "user", "content": question}],
        "temperature": 1, "seed": 11, "max_tokens": 24});
    let r = http::post_json(http_addr, "/v1/chat/completions", &own).await?;
    let served = r.json()?["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The request sets the temperature only: top-p is still the model's (0.5).
    let reference = [
        "generate",
        "--chat",
        "--prompt",
        question,
        "--temperature",
        "1",
        "--top-p",
        "0.5",
        "--seed",
        "11",
        "--max-tokens",
        "24",
        "--json",
    ]
    .map(String::from);
    let out = Proc::output(
        "generate",
        &ferrite_bin()?,
        &reference,
        WORKER_READY_TIMEOUT,
    )
    .await?;
    let want: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(
        served,
        want["text"].as_str().unwrap_or_default(),
        "temperature 1 as asked"
    );
    let readme = json!({"model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let mut paris = 0;
    let mut answers = Vec::new();
    for _ in 0..10 {
        let r = http::post_json(http_addr, "/v1/chat/completions", &readme).await?;
        assert_eq!(r.status, 200, "{r:?}");
        let text = r.json()?["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        paris += usize::from(text.contains("Paris"));
        answers.push(text);
    }
    assert!(paris >= 9, "{paris} of 10 name Paris: {answers:#?}");
    let models = http::get(http_addr, "/v1/models").await?.json()?;
    let defaults = &models["data"][0]["sampling_defaults"];
    assert_eq!(defaults["temperature"], json!(0.2f32), "{models}");
    assert_eq!(defaults["top_p"], json!(0.5f32), "{models}");

    serve.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// `n` prefills the prompt once: the later choices go out after the first has its first
/// token, when the prompt's full blocks are in the prefix cache, so each of them finds them
/// there. (Sent together, all four would prefill it in one step, and none would find it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_prefill_their_prompt_once() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    // 100 prompt tokens that no other request sends: 6 full blocks of 16.
    let prompt: Vec<u32> = (0..100).map(|i| 1000 + 37 * i).collect();
    let hits = format!("ferrite_prefix_cache_hits_total{{model_name={MODEL}}}");
    let before = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    let body = json!({"model": MODEL, "prompt": prompt, "n": 4, "max_tokens": 3,
        "temperature": 1, "ignore_eos": true});
    let r = http::post_json(serve.http, "/v1/completions", &body).await?;
    let reply = r.json()?;
    assert_eq!(r.status, 200, "{reply}");
    assert_eq!(
        reply["choices"].as_array().map(Vec::len),
        Some(4),
        "{reply}"
    );
    assert_eq!(reply["usage"]["prompt_tokens"], 100, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 12, "{reply}");
    assert_eq!(
        reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "choice 0 prefilled it: {reply}"
    );
    let after = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    assert_eq!(
        after - before,
        3.0 * 96.0,
        "the later choices' cached tokens"
    );
    Ok(())
}

/// The golden cases of the default model (transformers on its GGUF, `tests/fixtures/golden`).
fn golden_cases() -> Result<Vec<serde_json::Value>> {
    let path =
        ferrite_cluster_tests::workspace_root().join("tests/fixtures/golden/smollm2_q4_1.json");
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    Ok(golden["cases"].as_array().context("cases")?.clone())
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    (v.as_array().into_iter().flatten())
        .filter_map(|x| x.as_u64().map(|i| i as u32))
        .collect()
}

/// Scoring a prompt, as an evaluation harness asks for loglikelihoods: two golden prompts,
/// each followed by transformers' 32 greedy tokens, with `max_tokens` 0. Over gRPC every
/// continuation token is the most likely where it stands (transformers' margins there are
/// at least 0.3), and at the first, the 5 most likely tokens are transformers' top 5, their
/// logprobs as far apart as its logits (within 2e-2). OpenAI's completions with `echo`
/// give the same scores in their shape: the prompt's text, a null first logprob, nothing
/// generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scored_prompt_ranks_transformers_greedy_tokens_first() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let mut client = InferenceClient::new(channel(serve.grpc).await?);
    for case in golden_cases()? {
        let name = case["name"].as_str().unwrap_or("?");
        if !matches!(name, "question" | "math") {
            continue;
        }
        let (prompt, greedy) = (
            ids_of(&case["prompt_token_ids"]),
            ids_of(&case["greedy_token_ids"]),
        );
        let ids: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let mut req = grpc::greedy_ids(ids.clone(), 0);
        if let Some(s) = req.sampling.as_mut() {
            s.prompt_logprobs = Some(5);
        }
        let got = grpc::generate(&mut client, req).await?;
        let scores = got.prompt_logprobs.context("prompt logprobs")?;
        assert_eq!(scores.len(), ids.len() - 1, "{name}");
        assert_eq!(
            (got.deltas, got.token_ids.len()),
            (0, 0),
            "{name}: nothing generated"
        );
        let finish = got.finish.context("finish")?;
        assert_eq!(finish.reason, FinishReason::Length as i32, "{name}");
        let usage = finish.usage.context("usage")?;
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (ids.len() as u32, 0)
        );
        for (j, s) in scores.iter().enumerate().skip(prompt.len() - 1) {
            assert_eq!(s.token_id, ids[j + 1], "{name}");
            assert_eq!(
                s.top[0].token_id,
                s.token_id,
                "{name}: position {} is greedy",
                j + 1
            );
            assert!((s.top[0].logprob - s.logprob).abs() < 1e-6, "{name}");
        }
        let first = &scores[prompt.len() - 1];
        let want = case["top5"].as_array().context("top5")?;
        let logit = |i: usize| want[i]["logit"].as_f64().unwrap_or(f64::NAN);
        for (i, t) in first.top.iter().enumerate() {
            assert_eq!(
                u64::from(t.token_id),
                want[i]["id"].as_u64().unwrap_or(0),
                "{name}: top {i}"
            );
            let gap = f64::from(t.logprob - first.top[0].logprob);
            assert!(
                (gap - (logit(i) - logit(0))).abs() < 2e-2,
                "{name}: top {i}'s gap {gap}"
            );
        }
        // The same over OpenAI's completions, with echo.
        let body = json!({"model": MODEL, "prompt": ids, "echo": true, "logprobs": 5,
            "max_tokens": 0, "temperature": 0});
        let r = http::post_json(serve.http, "/v1/completions", &body).await?;
        let reply = r.json()?;
        assert_eq!(r.status, 200, "{reply}");
        let choice = &reply["choices"][0];
        let text = format!(
            "{}{}",
            case["prompt"].as_str().unwrap_or(""),
            case["greedy_text"].as_str().unwrap_or("")
        );
        assert_eq!(choice["text"], text.as_str(), "{name}: the prompt, echoed");
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(reply["usage"]["completion_tokens"], 0);
        let logprobs = choice["logprobs"]["token_logprobs"]
            .as_array()
            .context("logprobs")?;
        assert_eq!(logprobs.len(), ids.len());
        assert!(logprobs[0].is_null());
        for (l, s) in logprobs[1..].iter().zip(&scores) {
            let l = l.as_f64().context("a logprob")?;
            assert!(
                (l - f64::from(s.logprob)).abs() < 1e-3,
                "{name}: {l} against {}",
                s.logprob
            );
        }
        assert!(choice["logprobs"]["top_logprobs"][0].is_null());
        assert_eq!(
            choice["logprobs"]["top_logprobs"][1]
                .as_object()
                .map(|o| o.len()),
            Some(5)
        );
    }
    Ok(())
}

/// What lm-eval's `local-completions` sends for loglikelihoods (its payload: a batch of
/// token-id prompts, `echo`, `logprobs` 1, `max_tokens` 1, temperature 0, a seed) and what it
/// reads back (`token_logprobs` and `top_logprobs` of the continuation, `[ctxlen:-1]`; greedy
/// where each token's logprob equals the largest of its alternatives'). The golden `question`
/// prompt with transformers' greedy continuation is greedy; with its first continuation token
/// swapped for transformers' runner-up there, it is not; each loglikelihood is the sum of the
/// same tokens' scores over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lm_eval_loglikelihoods_parse_as_the_harness_parses_them() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let mut client = InferenceClient::new(channel(serve.grpc).await?);
    let cases = golden_cases()?;
    let case = cases
        .iter()
        .find(|c| c["name"] == "question")
        .context("question")?;
    let (context, greedy) = (
        ids_of(&case["prompt_token_ids"]),
        ids_of(&case["greedy_token_ids"]),
    );
    let mut swapped = greedy.clone();
    swapped[0] = case["top5"][1]["id"].as_u64().context("runner-up")? as u32;
    let prompts: Vec<Vec<u32>> = [&greedy, &swapped]
        .iter()
        .map(|c| context.iter().chain(c.iter()).copied().collect())
        .collect();
    let body = json!({"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": 1,
        "logprobs": 1, "seed": 1234, "echo": true});
    let r = http::post_json(serve.http, "/v1/completions", &body).await?;
    let reply = r.json()?;
    assert_eq!(r.status, 200, "{reply}");
    let ctxlen = context.len();
    for (i, ids) in prompts.iter().enumerate() {
        let choice = &reply["choices"][i];
        assert_eq!(choice["index"], i);
        let logprobs = choice["logprobs"]["token_logprobs"]
            .as_array()
            .context("logprobs")?;
        let tops = choice["logprobs"]["top_logprobs"]
            .as_array()
            .context("tops")?;
        assert_eq!(
            logprobs.len(),
            ids.len() + 1,
            "the prompt and the token generated"
        );
        let (span, top_span) = (
            &logprobs[ctxlen..logprobs.len() - 1],
            &tops[ctxlen..tops.len() - 1],
        );
        let sum: f64 = span.iter().filter_map(serde_json::Value::as_f64).sum();
        let is_greedy = span.iter().zip(top_span).all(|(t, top)| {
            let best = top
                .as_object()
                .into_iter()
                .flat_map(|o| o.values())
                .filter_map(serde_json::Value::as_f64);
            t.as_f64() == best.reduce(f64::max)
        });
        assert_eq!(is_greedy, i == 0, "prompt {i}");
        let mut req = grpc::greedy_ids(ids.clone(), 0);
        if let Some(s) = req.sampling.as_mut() {
            s.prompt_logprobs = Some(0);
        }
        let scores = grpc::generate(&mut client, req)
            .await?
            .prompt_logprobs
            .context("scores")?;
        let want: f64 = scores[ctxlen - 1..]
            .iter()
            .map(|s| f64::from(s.logprob))
            .sum();
        assert!(
            (sum - want).abs() < 1e-2,
            "prompt {i}: {sum} against {want}"
        );
    }
    Ok(())
}

/// vLLM's tokenizer endpoints, which lm-eval looks for before it loads a tokenizer of its own:
/// the special tokens and the chat template, texts and chats tokenized as the gRPC API
/// tokenizes them, ids read back; bad input is the client's fault, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokenizer_endpoints_tokenize_as_the_grpc_api_does() -> Result<()> {
    use ferrite_proto::v1::tokenize_request::Input;
    use ferrite_proto::v1::{ChatMessage, ChatMessages, TokenizeRequest};
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let client = InferenceClient::new(channel(serve.grpc).await?);
    let info = http::get(serve.http, "/tokenizer_info").await?.json()?;
    assert_eq!(info["model"], MODEL, "{info}");
    assert!(
        info["eos_token"].as_str().is_some_and(|e| !e.is_empty()),
        "{info}"
    );
    assert!(
        info["chat_template"]
            .as_str()
            .is_some_and(|t| t.contains("messages")),
        "{info}"
    );
    assert!(info["max_model_len"].as_u64() > Some(0), "{info}");
    let grpc_ids = |input| {
        let mut client = client.clone();
        async move {
            let req = TokenizeRequest {
                model: MODEL.into(),
                input: Some(input),
                add_special_tokens: None,
            };
            anyhow::Ok(client.tokenize(req).await?.into_inner().token_ids)
        }
    };
    let text = "Hello, world: 2026-11-28";
    let r = http::post_json(serve.http, "/tokenize", &json!({ "prompt": text }))
        .await?
        .json()?;
    let want = grpc_ids(Input::Text(text.into())).await?;
    assert_eq!(r["tokens"], json!(want), "{r}");
    assert_eq!(r["count"], want.len());
    let chat = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "Hi" }] });
    let r = http::post_json(serve.http, "/tokenize", &chat)
        .await?
        .json()?;
    let messages = vec![ChatMessage {
        role: "user".into(),
        content: "Hi".into(),
        ..Default::default()
    }];
    let want_chat = grpc_ids(Input::Chat(ChatMessages { messages })).await?;
    assert_eq!(r["tokens"], json!(want_chat), "{r}");
    let back = http::post_json(serve.http, "/detokenize", &json!({ "tokens": want })).await?;
    assert_eq!(back.json()?["prompt"], text);
    // What lm-eval sends to tell whether the endpoints are there.
    let probe = json!({ "prompt": "test", "add_special_tokens": false });
    let r = http::post_json(serve.http, "/tokenize", &probe)
        .await?
        .json()?;
    assert!(r["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{r}");
    for (path, body, status, param) in [
        (
            "/detokenize",
            json!({ "tokens": [u32::MAX] }),
            400,
            Some("tokens"),
        ),
        ("/tokenize", json!({}), 400, Some("prompt")),
        (
            "/tokenize",
            json!({ "model": "no-such-model", "prompt": "x" }),
            404,
            None,
        ),
    ] {
        let r = http::post_json(serve.http, path, &body).await?;
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        if let Some(param) = param {
            assert_eq!(r.json()?["error"]["param"], param, "{}", r.body);
        }
    }
    Ok(())
}

/// A scored prompt with `n` = 3: the first choice scores it (computing it whole), and the
/// later two take its scores and find the prompt in the prefix cache, rather than scoring it
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_share_their_prompts_scores() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    // 100 prompt tokens no other request sends: 6 full blocks of 16.
    let prompt: Vec<u32> = (0..100).map(|i| 2000 + 31 * i).collect();
    let hits = format!("ferrite_prefix_cache_hits_total{{model_name={MODEL}}}");
    let before = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    let body = json!({"model": MODEL, "prompt": prompt, "n": 3, "echo": true, "logprobs": 2,
        "max_tokens": 2, "temperature": 1, "ignore_eos": true});
    let r = http::post_json(serve.http, "/v1/completions", &body).await?;
    let reply = r.json()?;
    assert_eq!(r.status, 200, "{reply}");
    let scores = |i: usize| reply["choices"][i]["logprobs"]["token_logprobs"].clone();
    for i in 0..3 {
        assert_eq!(scores(i).as_array().map(Vec::len), Some(102), "{reply}");
        assert_eq!(
            scores(i).as_array().map(|s| s[..100].to_vec()),
            scores(0).as_array().map(|s| s[..100].to_vec())
        );
    }
    let after = metrics::sample(&metrics::scrape(serve.http).await?, &hits);
    assert_eq!(
        after - before,
        2.0 * 96.0,
        "the later choices' cached tokens"
    );
    Ok(())
}

/// A long scored prompt over gRPC (3000 tokens, 20 alternatives each: about 600 kB of
/// scores): they come in messages of 1024 tokens, in order, each token's once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompts_scores_come_in_several_messages() -> Result<()> {
    let _turn = serial().await;
    let serve = ServeProc::start().await?;
    let mut client = InferenceClient::new(channel(serve.grpc).await?);
    let ids: Vec<u32> = (0..3000u32).map(|i| 1000 + (i * 7919) % 40000).collect();
    let mut req = grpc::greedy_ids(ids.clone(), 0);
    if let Some(s) = req.sampling.as_mut() {
        s.prompt_logprobs = Some(20);
    }
    let got = grpc::generate(&mut client, req).await?;
    assert_eq!(got.prompt_messages, 3);
    let scores = got.prompt_logprobs.context("scores")?;
    let scored: Vec<u32> = scores.iter().map(|s| s.token_id).collect();
    assert_eq!(scored, ids[1..]);
    assert!(scores.iter().all(|s| s.top.len() == 20 && s.logprob <= 0.0));
    Ok(())
}

/// `ferrite serve --num-speculative-tokens 4` (by its environment variable, with exact f32
/// activations): golden prompts whose answers repeat themselves ("the last line of the last
/// line …") get transformers' greedy tokens over the OpenAI API, and the worker's metrics
/// count the drafts checked and accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_decoding_keeps_transformers_greedy_tokens() -> Result<()> {
    let _turn = serial().await;
    let env = [
        ("FERRITE_NUM_SPECULATIVE_TOKENS", "4"),
        ("FERRITE_CPU_ACTIVATIONS", "f32"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let serve = ServeProc::start_with_env(&env).await?;
    for case in golden_cases()? {
        // Whole characters in 16 tokens (the emoji case's are cut in their bytes).
        let repeating = ["multiline", "numbers_dates", "list"];
        if !repeating.contains(&case["name"].as_str().unwrap_or("")) {
            continue;
        }
        let want = ids_of(&case["greedy_token_ids"]);
        let body = json!({"model": MODEL, "prompt": ids_of(&case["prompt_token_ids"]),
            "max_tokens": 32, "temperature": 0, "ignore_eos": true});
        let reply = http::post_json(serve.http, "/v1/completions", &body)
            .await?
            .json()?;
        let prefix = http::post_json(serve.http, "/detokenize", &json!({ "tokens": want[..16] }))
            .await?
            .json()?;
        let text = reply["choices"][0]["text"].as_str().context("text")?;
        let prefix = prefix["prompt"].as_str().context("detokenized")?;
        assert!(
            text.starts_with(prefix),
            "{}: {text:?} after {prefix:?}",
            case["name"]
        );
        assert_eq!(reply["usage"]["completion_tokens"], 32, "{reply}");
    }
    let m = metrics::scrape(serve.http).await?;
    let count = |name: &str| metrics::sample(&m, &format!("{name}{{model_name={MODEL}}}"));
    let drafts = count("ferrite_spec_decode_num_draft_tokens_total");
    let accepted = count("ferrite_spec_decode_num_accepted_tokens_total");
    assert!(
        accepted >= 10.0 && drafts > accepted,
        "{drafts} drafts, {accepted} accepted"
    );
    Ok(())
}
