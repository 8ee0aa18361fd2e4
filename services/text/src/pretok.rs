//! Pre-tokenizer split regexes for byte-level BPE GGUF vocabularies, keyed by
//! `tokenizer.ggml.pre`.
//!
//! GGUF files do not carry the pre-tokenizer, only its name; llama.cpp maps the
//! name to a list of regexes in `llm_tokenizer_bpe` (`llama-vocab.cpp`). Each
//! regex splits every fragment produced by the previous one, and the text
//! between matches is kept as its own fragment. That is exactly a sequence of
//! `Split(regex, behavior = Isolated)` pre-tokenizers in `tokenizers`, so we
//! copy llama.cpp's table verbatim and emit it that way. Where llama.cpp
//! rewrote a pattern for `std::regex` (no `(?i:...)`, lookahead emulation), the
//! rewritten and the original forms match the same strings; we keep the
//! rewritten one except for `tekken`, whose original needs no lookarounds.

/// GPT-2's pattern, shared by many entries.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's pattern (also dbrx, smaug, chatglm4): digits in groups of three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: like Llama 3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

// Cased-letter ranges from DeepSeek LLM's tokenizer.json, written as escapes:
// several of these code points change under Unicode normalization, which
// editors and copy/paste apply silently.
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    r"\s?[",
    r"A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}",
    r"\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}",
    r"\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}",
    r"\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}",
    r"\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}",
    r"\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}",
    r"\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}",
    r"\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}",
    r"\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}",
    r"\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}",
    r"\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}",
    r"\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}",
    r"\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}",
    r"\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}",
    r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}",
    r"\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}",
    r"\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}",
    r"\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}",
    "]+"
);

const DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";

const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// How a byte-level BPE vocabulary splits text before merging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Applied in order, each as an isolating split.
    pub regexes: Vec<&'static str>,
    /// llama.cpp's `ignore_merges`: a fragment that is itself a vocabulary
    /// entry is emitted whole (Llama 3 / tekken behaviour; HF's BPE has the
    /// same flag).
    pub ignore_merges: bool,
    /// llama.cpp forces BOS on for these vocabularies unless the GGUF says
    /// otherwise.
    pub default_add_bos: bool,
}

/// One row of the table: the names llama.cpp accepts and what they mean.
struct Entry {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    ignore_merges: bool,
    default_add_bos: bool,
}

const fn entry(names: &'static [&'static str], regexes: &'static [&'static str]) -> Entry {
    Entry {
        names,
        regexes,
        ignore_merges: false,
        default_add_bos: false,
    }
}

const TABLE: &[Entry] = &[
    entry(
        &["default"],
        &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    ),
    Entry {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
        ],
        regexes: &[LLAMA3],
        ignore_merges: true,
        default_add_bos: true,
    },
    entry(&["dbrx", "smaug-bpe", "chatglm-bpe", "glm4"], &[LLAMA3]),
    entry(
        &["deepseek-llm"],
        &[
            "[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
    ),
    entry(
        &["deepseek-v3"],
        &[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_MAIN],
    ),
    entry(
        &["deepseek-coder"],
        &[
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ],
    ),
    entry(
        &["falcon"],
        &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    ),
    // Digits first split individually, then GPT-2 (SmolLM is here).
    entry(
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        &[r"\p{N}", GPT2],
    ),
    entry(
        &[
            "gpt2",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v1-en",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
            "a.x-4.0",
            "mellum",
            "modern-bert",
        ],
        &[GPT2],
    ),
    entry(
        &[
            "qwen2",
            "stablelm2",
            "megrez",
            "deepseek-r1-qwen",
            "hunyuan",
            "solar-open",
            "kormo",
            "f2llmv2",
        ],
        &[QWEN2],
    ),
    entry(&["qwen35"], &[QWEN35]),
    entry(&["poro-chat", "bloom", "gpt3-finnish"], &[PORO]),
    entry(&["viking"], &[PORO, r"\p{N}"]),
    Entry {
        names: &["tekken"],
        regexes: &[TEKKEN],
        ignore_merges: true,
        default_add_bos: true,
    },
    entry(&["gpt-4o", "llama4", "minimax-m2", "kanana2"], &[GPT4O]),
    entry(&["seed-coder"], &[SEED_CODER]),
    entry(&["bailingmoe", "bailingmoe2", "llada-moe"], &[BAILINGMOE]),
    entry(&["grok-2"], &[QWEN2]),
];

/// Looks up `pre`; `None` (key absent) means llama.cpp's `default`.
pub(crate) fn lookup(pre: Option<&str>) -> Option<PreTokenizerSpec> {
    let name = pre.unwrap_or("default");
    TABLE
        .iter()
        .find(|e| e.names.contains(&name))
        .map(|e| PreTokenizerSpec {
            regexes: e.regexes.to_vec(),
            ignore_merges: e.ignore_merges,
            default_add_bos: e.default_add_bos,
        })
}

/// Every accepted name, for error messages.
pub(crate) fn supported_names() -> String {
    let mut names: Vec<&str> = TABLE.iter().flat_map(|e| e.names.iter().copied()).collect();
    names.sort_unstable();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every regex in the table must compile with the engine `tokenizers`
    /// uses (fancy-regex), or loading a GGUF with that `pre` would fail late.
    #[test]
    fn all_regexes_compile() {
        for e in TABLE {
            for re in e.regexes {
                assert!(
                    fancy_regex_compiles(re),
                    "regex for {:?} does not compile: {re}",
                    e.names
                );
            }
        }
    }

    fn fancy_regex_compiles(re: &str) -> bool {
        tokenizers::pre_tokenizers::split::Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .is_ok()
    }

    #[test]
    fn smollm_and_missing() {
        let s = lookup(Some("smollm")).map(|s| s.regexes);
        assert_eq!(s, Some(vec![r"\p{N}", GPT2]));
        assert!(lookup(None).is_some());
        assert!(lookup(Some("no-such-pre")).is_none());
        assert!(supported_names().contains("llama-bpe"));
    }
}
