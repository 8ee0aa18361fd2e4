//! Compiles the .proto files with tonic. `protoc` is the one the protoc-bin-vendored crate ships,
//! unless `PROTOC` names another; no system protoc is needed. (etcd-client's build script finds
//! the same binary through `.cargo/config.toml` and `tools/protoc`.)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protoc = match std::env::var_os("PROTOC") {
        Some(set) if !set.is_empty() => std::path::PathBuf::from(set),
        _ => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("ferrite_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                "ferrite/v1/inference.proto",
                "ferrite/worker/v1/worker.proto",
            ],
            &["."],
        )?;
    println!("cargo:rerun-if-changed=ferrite");
    Ok(())
}
