//! Models named by their Hugging Face Hub repository. huggingface.co cannot be reached from
//! CI, so a local server speaks the Hub's protocol (`tests/clients/hub_server.py`: the
//! revision and tree APIs, `resolve` with LFS files redirected to another host), and the
//! official `huggingface_hub` client is the reference (`tests/clients/hub_interop.py`): it
//! downloads from the same server, and ferrite's cache must be the tree it makes, readable by
//! it offline; a GGUF file it downloaded is served by ferrite by `repo:quant` with the network
//! forbidden; a transfer that breaks resumes, in the same run or the next; and every way a
//! download goes wrong says what to do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferrite_cluster_tests::cluster::ServeProc;
use ferrite_cluster_tests::python::client_script;
use ferrite_cluster_tests::{Proc, ferrite_bin, http, serial, workspace_root};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
const GGUF_REPO: &str = "ferrite-test/SmolLM2-135M-Instruct-GGUF";
const LORA_REPO: &str = "tiny/smollm2-lora";

/// The repositories the server holds, under `root/{org}/{name}`.
fn make_repos(root: &Path, default_model: &Path) -> Result<()> {
    let fixtures = workspace_root().join("tests/fixtures");
    let llama = fixtures.join("models/llama31");
    let tok = fixtures.join("quant/interop/ct_gptq_w4a16");
    let put = |repo: &str, name: &str, from: Result<PathBuf, &[u8]>| -> Result<()> {
        let path = root.join(repo).join(name);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        match from {
            Ok(src) => std::fs::copy(&src, &path).map(|_| ()),
            Err(bytes) => std::fs::write(&path, bytes),
        }
        .with_context(|| format!("writing {}", path.display()))
    };
    let sharded = "tiny/llama31-sharded";
    for f in ["config.json", "model.safetensors.index.json"]
        .into_iter()
        .chain((1..=3).map(|i| match i {
            1 => "model-00001-of-00003.safetensors",
            2 => "model-00002-of-00003.safetensors",
            _ => "model-00003-of-00003.safetensors",
        }))
    {
        put(sharded, f, Ok(llama.join(f)))?;
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        put(sharded, f, Ok(tok.join(f)))?;
    }
    // sentence-transformers' description: its pooling is in a subfolder (read), its
    // Normalize module's folder has nothing ferrite reads.
    let modules = br#"[{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#;
    put(sharded, "modules.json", Err(modules))?;
    put(
        sharded,
        POOLING,
        Err(br#"{"pooling_mode_mean_tokens": true}"#),
    )?;
    put(sharded, "2_Normalize/README.md", Err(b"nothing\n"))?;
    // Files ferrite does not read: never downloaded.
    put(sharded, "README.md", Err(b"# tiny\n"))?;
    put(sharded, "pytorch_model.bin", Err(&[7u8; 1000]))?;
    put(sharded, "onnx/model.onnx", Err(b"onnx"))?;
    for repo in ["gated/tiny", "corrupt/tiny", "flaky/tiny"] {
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            put(repo, f, Ok(tok.join(f)))?;
        }
    }
    put(
        GGUF_REPO,
        "SmolLM2-135M-Instruct-Q4_1.gguf",
        Ok(default_model.to_owned()),
    )?;
    let other = fixtures.join("models/qwen2/model.gguf");
    put(GGUF_REPO, "SmolLM2-135M-Instruct-Q8_0.gguf", Ok(other))?;
    put(GGUF_REPO, "README.md", Err(b"# gguf\n"))?;
    // A LoRA adapter of the default model, with files ferrite does not read.
    ferrite_cluster_tests::lora::write_adapter(&root.join(LORA_REPO), 3, 8, 16.0)?;
    put(LORA_REPO, "README.md", Err(b"# a LoRA\n"))?;
    put(LORA_REPO, "training_args.bin", Err(&[0u8; 64]))
}

/// The Hub's stand-in on a free port.
async fn start_hub(root: &Path) -> Result<(Proc, String)> {
    let script = client_script("hub_server.py")
        .to_string_lossy()
        .into_owned();
    let args = [script, "--root".into(), root.to_string_lossy().into_owned()];
    let mut proc = Proc::spawn("hub_server", Path::new("python3"), &args)?;
    for _ in 0..100 {
        if let Some(port) = proc.stdout().iter().find_map(|l| l.strip_prefix("port ")) {
            return Ok((proc, format!("http://127.0.0.1:{}", port.trim())));
        }
        if !proc.is_running() {
            bail!("hub_server exited: {}", proc.stderr_report().await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("hub_server printed no port")
}

/// `(key, value)` pairs as a process's environment takes them.
fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

/// `ferrite model ARGS` with `env`: whether it succeeded, its stdout and its stderr.
async fn ferrite(args: &[&str], env: &[(String, String)]) -> Result<(bool, String, String)> {
    let args: Vec<String> = ["model"]
        .iter()
        .chain(args)
        .map(|s| (*s).to_owned())
        .collect();
    let mut proc = Proc::spawn_with_env("ferrite model", &ferrite_bin()?, &args, env)?;
    let status = proc.wait_exit(TIMEOUT).await?;
    let _ = proc.stderr_report().await; // lets the pipes drain
    Ok((status.success(), proc.stdout().join("\n"), proc.stderr()))
}

/// A cache's model directories as (path, link target or "file") pairs: what `huggingface_hub`
/// keeps beside them (`.locks`, `CACHEDIR.TAG`, its `trees/` listings) left out.
fn tree(cache: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut stack = vec![cache.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let rel = path.strip_prefix(cache)?.to_string_lossy().into_owned();
            if !rel.starts_with("models--") || rel.contains("/trees") {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_symlink() {
                out.push((
                    rel,
                    std::fs::read_link(&path)?.to_string_lossy().into_owned(),
                ));
            } else if meta.is_dir() {
                stack.push(path);
            } else {
                out.push((rel, "file".into()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `hub_interop.py ARGS` against `endpoint`: what it printed.
async fn interop(args: &[&str], endpoint: &str) -> Result<Value> {
    let mut full = vec![
        client_script("hub_interop.py")
            .to_string_lossy()
            .into_owned(),
    ];
    full.extend(args.iter().map(|s| (*s).to_owned()));
    let env = env(&[("HF_ENDPOINT", endpoint)]);
    let mut proc = Proc::spawn_with_env("hub_interop", Path::new("python3"), &full, &env)?;
    let status = proc.wait_exit(TIMEOUT).await?;
    let report = proc.stderr_report().await;
    anyhow::ensure!(status.success(), "hub_interop {full:?} failed\n{report}");
    let last = proc.stdout().pop().context("no output")?;
    serde_json::from_str(&last).with_context(|| last.clone())
}

/// An endpoint where nothing listens: what resolves with it used no network.
const NOWHERE: &str = "http://127.0.0.1:9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_models_share_huggingface_hubs_cache_and_serve_from_it_offline() -> Result<()> {
    let _turn = serial().await;
    let work = std::env::temp_dir().join(format!("ferrite-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let path_args = ["model", "path"].map(String::from);
    let default_model = Proc::output("model path", &ferrite_bin()?, &path_args, TIMEOUT).await?;
    make_repos(&work.join("repos"), Path::new(default_model.trim()))?;
    let (_hub, endpoint) = start_hub(&work.join("repos")).await?;
    let cache = |c: &str| work.join(c).to_string_lossy().into_owned();
    shares_the_cache(&endpoint, &cache("a"), &cache("b")).await?;
    serves_offline(&endpoint, &cache("c")).await?;
    failures_say_what_to_do(&endpoint, &cache("d")).await?;
    adapters_come_from_the_hub(&endpoint, &work.join("repos"), &cache("e")).await?;
    transfers_resume(&endpoint, &work.join("repos"), &cache("f"), &cache("g")).await?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// sentence-transformers' pooling configuration, the one file of a subfolder ferrite reads.
const POOLING: &str = "1_Pooling/config.json";

/// ferrite downloads the model's files and no others into cache `a`; huggingface_hub
/// downloads the same files into `b`: the two trees are the same, huggingface_hub reads
/// ferrite's without the network, and so does ferrite.
async fn shares_the_cache(endpoint: &str, a: &str, b: &str) -> Result<()> {
    let online = env(&[("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", a)]);
    let (ok, path, err) = ferrite(&["pull", "tiny/llama31-sharded"], &online).await?;
    anyhow::ensure!(ok, "pull failed: {err}");
    let mut files: Vec<String> = std::fs::read_dir(&path)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    files.sort();
    let shards = (1..=3).map(|i| format!("model-0000{i}-of-00003.safetensors"));
    let mut want: Vec<String> = [
        "1_Pooling",
        "config.json",
        "model.safetensors.index.json",
        "modules.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .map(String::from)
    .into_iter()
    .chain(shards)
    .collect();
    want.sort();
    assert_eq!(files, want);
    anyhow::ensure!(Path::new(path.trim()).join(POOLING).is_file(), "{POOLING}");
    let mut download = vec!["download", "tiny/llama31-sharded", "--cache", b, "--allow"];
    download.extend(files.iter().map(|f| match f.as_str() {
        "1_Pooling" => POOLING,
        f => f,
    }));
    interop(&download, endpoint).await?;
    assert_eq!(tree(Path::new(a))?, tree(Path::new(b))?);
    let read = interop(&["read", "tiny/llama31-sharded", "--cache", a], NOWHERE).await?;
    assert_eq!(read["path"], json!(path.trim()), "{read}");
    assert!(
        read["config"]
            .as_str()
            .is_some_and(|c| c.ends_with("config.json")),
        "{read}"
    );
    let cached = env(&[("HF_ENDPOINT", NOWHERE), ("HF_HUB_CACHE", a)]);
    let (ok, again, err) = ferrite(&["path", "tiny/llama31-sharded"], &cached).await?;
    anyhow::ensure!(ok && again == path, "{again} {err}");
    // `ferrite model list` shows what the cache holds, and its ref.
    let (ok, list, err) = ferrite(&["list"], &cached).await?;
    let row = list.lines().find(|l| l.contains("tiny/llama31-sharded"));
    anyhow::ensure!(
        ok && row.is_some_and(|r| r.contains("safetensors") && r.contains("[main ")),
        "{list}\n{err}"
    );
    Ok(())
}

/// huggingface_hub downloads one GGUF file of a repository of two; ferrite serves it by
/// `repo:quant`, the network forbidden, under that name.
async fn serves_offline(endpoint: &str, c: &str) -> Result<()> {
    let file = "SmolLM2-135M-Instruct-Q4_1.gguf";
    interop(
        &["download", GGUF_REPO, "--cache", c, "--file", file],
        endpoint,
    )
    .await?;
    let name = format!("{GGUF_REPO}:Q4_1");
    let offline = env(&[
        ("HF_HUB_CACHE", c),
        ("HF_HUB_OFFLINE", "1"),
        ("HF_ENDPOINT", NOWHERE),
    ]);
    let (_, list, _) = ferrite(&["list"], &offline).await?;
    anyhow::ensure!(list.contains(&format!("GGUF: {file}")), "{list}");
    let serve = ServeProc::start_model(&name, &offline).await?;
    let models = http::get(serve.http, "/v1/models").await?.json()?;
    assert_eq!(models["data"][0]["id"], json!(name), "{models}");
    let body = json!({"model": name, "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let answer = http::post_json(serve.http, "/v1/chat/completions", &body)
        .await?
        .json()?;
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    anyhow::ensure!(text.contains("Paris"), "{answer}");
    Ok(())
}

/// `ferrite generate --lora` of `--lora-modules a=PATH`, with `env`: its token ids.
async fn generate_with_adapter(path: &str, env: &[(String, String)]) -> Result<Value> {
    let args: Vec<String> = [
        "generate",
        "--lora-modules",
        &format!("a={path}"),
        "--lora",
        "a",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ]
    .map(String::from)
    .into();
    let mut proc = Proc::spawn_with_env("ferrite generate", &ferrite_bin()?, &args, env)?;
    let status = proc.wait_exit(TIMEOUT).await?;
    let report = proc.stderr_report().await;
    anyhow::ensure!(status.success(), "generate with {path} failed\n{report}");
    let out = proc.stdout().join("\n");
    let v: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    Ok(v["token_ids"].clone())
}

/// A LoRA adapter named by its repository is fetched (PEFT's two files, no others) and
/// generates what the same files do from a directory; then again from the cache offline.
async fn adapters_come_from_the_hub(endpoint: &str, repos: &Path, e: &str) -> Result<()> {
    let repo = LORA_REPO;
    let dir = repos.join(repo);
    let local = generate_with_adapter(&dir.to_string_lossy(), &[]).await?;
    let online = env(&[("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", e)]);
    assert_eq!(generate_with_adapter(repo, &online).await?, local);
    let offline = env(&[
        ("HF_ENDPOINT", NOWHERE),
        ("HF_HUB_CACHE", e),
        ("HF_HUB_OFFLINE", "1"),
    ]);
    assert_eq!(generate_with_adapter(repo, &offline).await?, local);
    let snapshots = Path::new(e).join("models--tiny--smollm2-lora/snapshots");
    let snap = std::fs::read_dir(&snapshots)?
        .next()
        .context("a snapshot")??
        .path();
    let mut got: Vec<String> = std::fs::read_dir(&snap)?
        .map(|f| Ok(f?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    got.sort();
    assert_eq!(got, ["adapter_config.json", "adapter_model.safetensors"]);
    Ok(())
}

/// The sha256 (hex) of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A transfer that breaks halfway (`flaky/`) is asked again from where it stopped, and the
/// blob is the file; the half of a file an earlier run left in `blobs/{sha256}.incomplete`
/// is resumed (its rest asked for by a range), and the blob is the file again.
async fn transfers_resume(endpoint: &str, repos: &Path, f: &str, g: &str) -> Result<()> {
    let weights = std::fs::read(repos.join("flaky/tiny/model.safetensors"))?;
    let online = env(&[("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", f)]);
    let (ok, _, err) = ferrite(&["pull", "flaky/tiny"], &online).await?;
    anyhow::ensure!(ok && err.contains("asking for the rest"), "{err}");
    let blob = Path::new(f)
        .join("models--flaky--tiny/blobs")
        .join(sha256(&weights));
    anyhow::ensure!(
        std::fs::read(&blob)? == weights,
        "flaky/tiny's weights differ"
    );

    let shard = repos.join("tiny/llama31-sharded/model-00002-of-00003.safetensors");
    let shard = std::fs::read(&shard)?;
    let blobs = Path::new(g).join("models--tiny--llama31-sharded/blobs");
    std::fs::create_dir_all(&blobs)?;
    let sha = sha256(&shard);
    let half = &shard[..shard.len() / 2];
    std::fs::write(blobs.join(format!("{sha}.incomplete")), half)?;
    let online = env(&[("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", g)]);
    let (ok, _, err) = ferrite(&["pull", "tiny/llama31-sharded"], &online).await?;
    anyhow::ensure!(ok && err.contains("resuming after"), "{err}");
    anyhow::ensure!(
        std::fs::read(blobs.join(&sha))? == shard,
        "the resumed shard differs"
    );
    anyhow::ensure!(!blobs.join(format!("{sha}.incomplete")).exists());
    Ok(())
}

/// What goes wrong says what to do, and leaves no file behind as if it were good.
async fn failures_say_what_to_do(endpoint: &str, d: &str) -> Result<()> {
    let online = [("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", d)];
    let offline = Some(("HF_HUB_OFFLINE", "1"));
    let cases = [
        ("gated/tiny", None, "HF_TOKEN"),
        ("corrupt/tiny", None, "arrived corrupt"),
        (GGUF_REPO, None, "SmolLM2-135M-Instruct-Q8_0.gguf"),
        ("tiny/llama31-sharded@v2", None, "revision v2"),
        ("tiny/llama31-sharded", offline, "HF_HUB_OFFLINE"),
    ];
    for (repo, extra, says) in cases {
        let pairs: Vec<(&str, &str)> = online.iter().copied().chain(extra).collect();
        let (ok, _, err) = ferrite(&["path", repo], &env(&pairs)).await?;
        anyhow::ensure!(!ok && err.contains(says), "{repo}: {err}");
    }
    // The corrupt weights were not kept (their blob would be named by their sha256).
    let blobs = Path::new(d).join("models--corrupt--tiny/blobs");
    let names: Vec<String> = std::fs::read_dir(&blobs)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    anyhow::ensure!(names.iter().all(|b| b.len() == 40), "{names:?}");
    let token = [online[0], online[1], ("HF_TOKEN", "hf_test_token")];
    let (ok, _, err) = ferrite(&["path", "gated/tiny"], &env(&token)).await?;
    anyhow::ensure!(ok, "with the token: {err}");
    Ok(())
}
