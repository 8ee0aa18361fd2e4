//! Recommended sampling from each source, in order, and values out of range left out.

use std::path::PathBuf;

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-rec-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A GGUF v3 file of no tensors and the metadata `kvs` (f32 or u32 values).
fn gguf_with(path: &Path, kvs: &[(&str, GgufValue)]) {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        b.extend((k.len() as u64).to_le_bytes());
        b.extend(k.as_bytes());
        match v {
            GgufValue::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            GgufValue::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            other => panic!("not written here: {other:?}"),
        }
    }
    std::fs::write(path, b).expect("write");
}

use crate::weights::gguf::GgufValue;

fn fixture_gguf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2/model.gguf")
}

#[test]
fn a_hugging_face_generation_config_recommends_what_it_names() {
    let dir = temp_dir("hf");
    let cfg = r#"{"bos_token_id": 1, "do_sample": true, "temperature": 0.6, "top_p": 0.95,
        "top_k": 20, "repetition_penalty": 1.05, "transformers_version": "4.51"}"#;
    std::fs::write(dir.join("generation_config.json"), cfg).expect("write");
    let d = sampling_defaults("some/model", &dir)
        .expect("read")
        .expect("recommended");
    assert_eq!(d.temperature, Some(0.6));
    assert_eq!(d.top_p, Some(0.95));
    assert_eq!(d.top_k, Some(20));
    assert_eq!(d.min_p, None);
    assert_eq!(d.repetition_penalty, Some(1.05));
    assert_eq!(d.source, "generation_config.json");
    // Naming nothing about sampling, or no file at all: nothing recommended.
    std::fs::write(dir.join("generation_config.json"), r#"{"bos_token_id": 1}"#).expect("write");
    assert_eq!(sampling_defaults("some/model", &dir).expect("read"), None);
    std::fs::remove_file(dir.join("generation_config.json")).expect("rm");
    assert_eq!(sampling_defaults("some/model", &dir).expect("read"), None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gguf_files_general_sampling_keys_recommend() {
    let dir = temp_dir("gguf");
    let file = dir.join("m.gguf");
    gguf_with(
        &file,
        &[
            ("general.sampling.temp", GgufValue::F32(0.7)),
            ("general.sampling.top_k", GgufValue::U32(40)),
            ("general.sampling.min_p", GgufValue::F32(0.05)),
            ("general.sampling.penalty_repeat", GgufValue::F32(1.1)),
        ],
    );
    let d = sampling_defaults("m", &file)
        .expect("read")
        .expect("recommended");
    assert_eq!(
        (
            d.temperature,
            d.top_k,
            d.min_p,
            d.repetition_penalty,
            d.top_p
        ),
        (Some(0.7), Some(40), Some(0.05), Some(1.1), None)
    );
    assert_eq!(d.source, "gguf general.sampling");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_known_model_without_its_own_recommendation_gets_its_cards() {
    // The test model's GGUF carries no sampling keys: by the name of a known model, the
    // registry's entry applies; by any other name, nothing does.
    let file = fixture_gguf();
    let d = sampling_defaults("smollm2-135m", &file)
        .expect("read")
        .expect("the card's");
    assert_eq!((d.temperature, d.top_p), (Some(0.2), Some(0.5)));
    assert!(d.source.starts_with("registry: "), "{}", d.source);
    assert_eq!(sampling_defaults("tiny", &file).expect("read"), None);
}

#[test]
fn values_out_of_range_are_left_out() {
    let r = Recommended {
        temperature: Some(-1.0),
        top_p: Some(1.5),
        top_k: Some(5),
        min_p: Some(2.0),
        repetition_penalty: Some(0.0),
    };
    let d = r.to_proto("test");
    assert_eq!(
        (
            d.temperature,
            d.top_p,
            d.top_k,
            d.min_p,
            d.repetition_penalty
        ),
        (None, None, Some(5), None, None)
    );
}
