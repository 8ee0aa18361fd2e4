//! `ferrite model list|pull`.

use anyhow::{Result, bail};
use clap::Subcommand;
use ferrite_engine::model::presets;
use ferrite_engine::recommended;
use ferrite_engine::registry;

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// The models ferrite can fetch by name and whether they are cached, the Hugging Face Hub cache's models, and the shapes for dummy weights.
    List,
    /// Print a model's path (a known name, or a Hugging Face Hub repository `org/name[@revision][:quant]`), pulling it first if it is not cached.
    Path {
        #[arg(default_value = registry::DEFAULT_MODEL)]
        name: String,
    },
    /// Fetch a known model into the cache (again, if it is there), or a Hugging Face Hub repository's files into the Hub's cache (those its snapshot of the revision, looked up anew, lacks).
    Pull {
        #[arg(default_value = registry::DEFAULT_MODEL)]
        name: String,
    },
}

pub fn run(cmd: ModelCommand) -> Result<()> {
    match cmd {
        ModelCommand::List => {
            for m in registry::KNOWN_MODELS {
                let path = registry::cached_path(m);
                let state = if path.exists() {
                    "cached"
                } else {
                    "not pulled"
                };
                println!(
                    "{:<16} {:<44} {state}: {}",
                    m.name,
                    m.description,
                    path.display()
                );
                println!("{:<16} sampling defaults: {}", "", defaults_of(m, &path));
            }
            hub_listing();
            println!("\nshapes for --load-format dummy (random weights):");
            for p in presets::PRESETS {
                let billions = |n: u64| n as f64 / 1e9;
                let params = p.config().map(|c| {
                    let (all, active) = (
                        presets::parameter_count(&c),
                        presets::active_parameter_count(&c),
                    );
                    match all == active {
                        true => format!("{:.2}B params", billions(all)),
                        false => format!(
                            "{:.2}B params, {:.2}B active",
                            billions(all),
                            billions(active)
                        ),
                    }
                });
                let params = params.unwrap_or_else(|e| e.to_string());
                println!("{:<18} {:<42} {params}", p.name, p.model);
            }
            Ok(())
        }
        ModelCommand::Path { name } => {
            let path = registry::resolve(&name, |what| eprintln!("ferrite: {what} ..."))?;
            println!("{}", path.display());
            Ok(())
        }
        ModelCommand::Pull { name } => {
            if let Some(repo) = ferrite_hub::RepoRef::parse(&name) {
                let path = ferrite_hub::pull(&repo, |what| {
                    eprintln!("ferrite: pulling {what} from the Hugging Face Hub ...")
                })?;
                println!("{}", path.display());
                return Ok(());
            }
            let Some(m) = registry::known(&name) else {
                let names: Vec<&str> = registry::KNOWN_MODELS.iter().map(|m| m.name).collect();
                bail!("unknown model `{name}` (known: {})", names.join(", "));
            };
            eprintln!("ferrite: {} ...", registry::pull_notice(m));
            let path = registry::pull(m)?;
            println!("{}", path.display());
            Ok(())
        }
    }
}

/// The Hugging Face Hub cache's models (`--model org/name` serves them without the network):
/// each with its refs, size, and what `--model` takes of it.
fn hub_listing() {
    let cache = ferrite_hub::hub_cache();
    println!("\nHugging Face Hub cache {}:", cache.display());
    let repos = ferrite_hub::cached_repos(&cache);
    if repos.is_empty() {
        println!("  (no models)");
    }
    for r in repos {
        let refs: Vec<String> = r
            .refs
            .iter()
            .map(|(name, commit)| format!("{name} {}", commit.get(..12).unwrap_or(commit)))
            .collect();
        let ggufs: Vec<&str> = r
            .files
            .iter()
            .filter(|f| f.ends_with(".gguf"))
            .map(String::as_str)
            .collect();
        let what = match ggufs.as_slice() {
            [] => "safetensors".to_owned(),
            files => format!("GGUF: {}", files.join(", ")),
        };
        let mb = r.bytes as f64 / 1e6;
        println!(
            "  {:<44} {mb:>9.1} MB  {what}  [{}]",
            r.repo,
            refs.join(", ")
        );
    }
}

/// The sampling defaults `serve` applies to `m` (`--generation-config auto`): the cached
/// file's own recommendation when it has one, else the model card's.
fn defaults_of(m: &registry::KnownModel, path: &std::path::Path) -> String {
    let from_file = path
        .exists()
        .then(|| recommended::sampling_defaults(m.name, path).ok().flatten())
        .flatten();
    let d = from_file.unwrap_or_else(|| m.sampling.to_proto(&format!("registry: {}", m.card)));
    let parts: Vec<String> = ferrite_proto::sampling::recommended_fields(&d)
        .into_iter()
        .map(|(name, v)| format!("{name} {v}"))
        .collect();
    if parts.is_empty() {
        return "none (temperature 1, no truncation)".into();
    }
    format!("{} ({})", parts.join(", "), d.source)
}
