//! Which of a repository's files ferrite reads: the same rule for a listing from the Hub and
//! for a snapshot in the cache.

/// What to fetch of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// The model: its safetensors weights with the files beside them; or, in a repository of
    /// GGUF files only, its one model file.
    Model,
    /// The GGUF file of this quantization (`Q4_K_M`) or name (`x.Q4_K_M.gguf`).
    Gguf(String),
    /// A LoRA adapter as PEFT saves it: [`ADAPTER_FILES`].
    Adapter,
}

/// The files of a PEFT adapter that ferrite reads.
pub const ADAPTER_FILES: [&str; 2] = ["adapter_config.json", "adapter_model.safetensors"];

/// Top-level files read beside safetensors weights: config, tokenizer, chat template,
/// generation config, quantization config (all `.json`), a separate template (`.jinja`), a
/// sentencepiece or tiktoken vocabulary, merges.
const BESIDE: [&str; 5] = [".json", ".jinja", ".model", ".txt", ".tiktoken"];

/// Whether `f` is sentence-transformers' pooling configuration (`1_Pooling/config.json`), the
/// one file of a subfolder ferrite reads: how an embedding model pools (mean, for
/// all-MiniLM), which the files at the top do not say.
fn pooling_config(f: &str) -> bool {
    f.split_once('/')
        .is_some_and(|(dir, file)| dir.ends_with("_Pooling") && file == "config.json")
}

/// The files of `files` (paths in the repository) to have, in order; or why none fit.
pub fn choose(files: &[String], wanted: &Wanted) -> Result<Vec<String>, String> {
    let top = |f: &&String| !f.contains('/');
    let weights: Vec<&String> = files
        .iter()
        .filter(top)
        .filter(|f| f.ends_with(".safetensors"))
        .collect();
    // Mistral's repositories hold their weights twice: Hugging Face's shards and Mistral's
    // own `consolidated.safetensors`, which ferrite does not read. Only the shards, then.
    let consolidated = |f: &String| f.starts_with("consolidated");
    let only_consolidated = weights.iter().all(|f| consolidated(f));
    match wanted {
        Wanted::Model if !weights.is_empty() => Ok(files
            .iter()
            .filter(|f| {
                let weight = f.ends_with(".safetensors") && (only_consolidated || !consolidated(f));
                top(f) && (weight || BESIDE.iter().any(|x| f.ends_with(x)))
            })
            .chain(files.iter().filter(|f| pooling_config(f)))
            .cloned()
            .collect()),
        Wanted::Model => match ggufs(files).as_slice() {
            [] => Err("it has neither safetensors weights nor a GGUF file".into()),
            [one] => Ok(vec![(*one).clone()]),
            many => Err(format!(
                "it has several GGUF files: name one as `repo:QUANT` or `repo:FILE.gguf` \
                 (files: {})",
                names(many)
            )),
        },
        Wanted::Gguf(tag) => gguf(files, tag).map(|f| vec![f]),
        Wanted::Adapter if ADAPTER_FILES.iter().all(|a| files.iter().any(|f| f == a)) => {
            Ok(ADAPTER_FILES.map(String::from).to_vec())
        }
        Wanted::Adapter => Err(format!(
            "it is not a LoRA adapter as PEFT saves one: {} are not all there",
            ADAPTER_FILES.join(" and ")
        )),
    }
}

/// The model's GGUF files: not the vision projectors (`mmproj`) that repositories of
/// multimodal models carry beside them.
fn ggufs(files: &[String]) -> Vec<&String> {
    files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| !base(f).to_ascii_lowercase().starts_with("mmproj"))
        .collect()
}

fn base(f: &str) -> &str {
    f.rsplit('/').next().unwrap_or(f)
}

fn names(files: &[&String]) -> String {
    let mut v: Vec<&str> = files.iter().map(|f| base(f)).collect();
    v.truncate(24);
    v.join(", ")
}

/// The one GGUF file named by `tag`: its file name, else the file whose name has `tag` as a
/// part (between `-` and `.`: `Llama-3.2-1B-Instruct-Q4_K_M.gguf` for `Q4_K_M`, any case),
/// else the one whose name contains it.
fn gguf(files: &[String], tag: &str) -> Result<String, String> {
    let all = ggufs(files);
    let upper = tag.to_ascii_uppercase();
    let by_name: Vec<&String> = all
        .iter()
        .copied()
        .filter(|f| base(f) == tag || f.as_str() == tag)
        .collect();
    let by_part: Vec<&String> = all
        .iter()
        .copied()
        .filter(|f| {
            let stem = &base(f)[..base(f).len() - ".gguf".len()];
            stem.split(['-', '.', '_'])
                .collect::<Vec<_>>()
                .windows(upper.split('_').count())
                .any(|w| w.join("_").to_ascii_uppercase() == upper)
        })
        .collect();
    let by_text: Vec<&String> = all
        .iter()
        .copied()
        .filter(|f| base(f).to_ascii_uppercase().contains(&upper))
        .collect();
    let found = [by_name, by_part, by_text]
        .into_iter()
        .find(|m| !m.is_empty())
        .unwrap_or_default();
    match found.as_slice() {
        [one] if is_split(one) => Err(format!(
            "{one} is one part of a split GGUF file, which ferrite does not read: merge the \
             parts (`llama-gguf-split --merge`) and serve the file"
        )),
        [one] => Ok((*one).clone()),
        [] => Err(format!(
            "no GGUF file matches `{tag}` (files: {})",
            names(&all)
        )),
        many => Err(format!(
            "`{tag}` matches several GGUF files: name one (files: {})",
            names(many)
        )),
    }
}

/// `x-00001-of-00003.gguf`, as llama.cpp's `gguf-split` names the parts.
fn is_split(f: &str) -> bool {
    let stem = base(f).to_ascii_lowercase();
    let stem = stem.trim_end_matches(".gguf");
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    matches!(parts.as_slice(), [total, "of", part, _]
        if total.len() == 5 && part.len() == 5
            && total.chars().chain(part.chars()).all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_safetensors_model_takes_its_weights_and_the_files_beside_them() {
        let repo = files(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "merges.txt",
            "onnx/model.onnx",
            "original/consolidated.safetensors",
            "consolidated.safetensors",
            "params.json",
            "model-q4.gguf",
            "modules.json",
            "1_Pooling/config.json",
            "2_Normalize/README.md",
            "openvino/openvino_model.xml",
        ]);
        let got = choose(&repo, &Wanted::Model).expect("a model");
        assert_eq!(
            got,
            files(&[
                "config.json",
                "generation_config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja",
                "merges.txt",
                "params.json",
                "modules.json",
                "1_Pooling/config.json",
            ])
        );
    }

    #[test]
    fn a_gguf_file_is_chosen_by_its_quantization_or_name() {
        let repo = files(&[
            "README.md",
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
            "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
            "Llama-3.2-1B-Instruct-Q8_0.gguf",
            "Llama-3.2-1B-Instruct-f16.gguf",
            "mmproj-model-f16.gguf",
            "big/Big-Q2_K-00001-of-00002.gguf",
        ]);
        let pick = |tag: &str| choose(&repo, &Wanted::Gguf(tag.into()));
        assert_eq!(
            pick("Q4_K_M"),
            Ok(files(&["Llama-3.2-1B-Instruct-Q4_K_M.gguf"]))
        );
        assert_eq!(
            pick("q8_0"),
            Ok(files(&["Llama-3.2-1B-Instruct-Q8_0.gguf"]))
        );
        // f16 is the model's, not the vision projector's.
        assert_eq!(pick("F16"), Ok(files(&["Llama-3.2-1B-Instruct-f16.gguf"])));
        assert_eq!(
            pick("Llama-3.2-1B-Instruct-Q4_K_S.gguf"),
            Ok(files(&["Llama-3.2-1B-Instruct-Q4_K_S.gguf"]))
        );
        let e = pick("Q4_K").expect_err("two files");
        assert!(e.contains("several") && e.contains("Q4_K_S"), "{e}");
        let e = pick("Q3_K_L").expect_err("none");
        assert!(e.contains("no GGUF file") && e.contains("Q8_0"), "{e}");
        let e = pick("Q2_K").expect_err("split");
        assert!(e.contains("split"), "{e}");
        let e = choose(&repo, &Wanted::Model).expect_err("which one");
        assert!(e.contains("repo:QUANT"), "{e}");
        let one = files(&["x.Q4_0.gguf", "mmproj.gguf"]);
        assert_eq!(choose(&one, &Wanted::Model), Ok(files(&["x.Q4_0.gguf"])));
        assert!(choose(&files(&["README.md"]), &Wanted::Model).is_err());
    }

    #[test]
    fn an_adapter_is_peft_s_two_files_and_nothing_else() {
        let repo = files(&[
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "training_args.bin",
            "checkpoint-500/adapter_model.safetensors",
        ]);
        let want = files(&["adapter_config.json", "adapter_model.safetensors"]);
        assert_eq!(choose(&repo, &Wanted::Adapter), Ok(want));
        let e = choose(
            &files(&["adapter_config.json", "adapter_model.bin"]),
            &Wanted::Adapter,
        )
        .expect_err("no safetensors");
        assert!(e.contains("not a LoRA adapter"), "{e}");
        let r = crate::RepoRef::adapter("org/lora@v2").expect("a repo");
        assert_eq!((r.wanted(), r.revision.as_str()), (Wanted::Adapter, "v2"));
        let r = crate::RepoRef::adapter("org/lora-gguf:x.gguf").expect("a file");
        assert_eq!(r.wanted(), Wanted::Gguf("x.gguf".into()));
    }
}
