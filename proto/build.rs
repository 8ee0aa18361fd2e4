//! Compiles the .proto files with tonic. Needs `protoc`: `PROTOC` if set, else on the PATH
//! (Debian: `protobuf-compiler`; `tests/run.sh` installs it).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("ferrite_descriptor.bin"))
        .compile_protos(
            &[
                "ferrite/v1/inference.proto",
                "ferrite/worker/v1/worker.proto",
            ],
            &["."],
        )?;
    println!("cargo:rerun-if-changed=ferrite");
    Ok(())
}
