//! `ferrite kernels build` through the real binary: every module compiled by NVRTC on a
//! cold cache, found in it on the next run, and bad targets refused. Needs `libnvrtc.so.13`
//! (CI installs it and sets `FERRITE_REQUIRE_NVRTC=1`); without it the test says so and
//! checks only that the refusal is clear.

mod common;

use common::{ferrite, json_of};

#[test]
fn kernels_build_fills_the_cache_then_hits_it() {
    let dir = std::env::temp_dir().join(format!("ferrite-cli-kernels-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.to_string_lossy().into_owned();
    let args = [
        "kernels",
        "build",
        "--arch",
        "sm_90",
        "--cache-dir",
        &dir_s,
        "--json",
    ];
    let out = ferrite(&args);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var_os("FERRITE_REQUIRE_NVRTC").is_none(),
            "NVRTC required: {err}"
        );
        assert!(err.contains("NVRTC") && !err.contains("panicked"), "{err}");
        eprintln!("no libnvrtc here: checked the refusal only");
        return;
    }
    let cold = json_of(&out);
    let modules = cold["modules"].as_array().expect("modules");
    assert!(modules.len() >= 10, "{cold}");
    for m in modules {
        assert_eq!(m["hit"], false, "{m}");
        assert!(m["cubin_bytes"].as_u64().is_some_and(|b| b > 1000), "{m}");
    }
    let warm = json_of(&ferrite(&args));
    for m in warm["modules"].as_array().expect("modules") {
        assert_eq!(m["hit"], true, "{m}");
    }
    let _ = std::fs::remove_dir_all(&dir);

    let out = ferrite(&["kernels", "build", "--arch", "90", "--cache-dir", &dir_s]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected an arch such as sm_90"));
}
