//! etcd's protocol, compiled by protox (in Rust) rather than a system `protoc`: the only change to the
//! published crate's build script.

#[cfg(feature = "build-server")]
fn should_build_server() -> bool {
    true
}

#[cfg(not(feature = "build-server"))]
fn should_build_server() -> bool {
    false
}

fn main() {
    let proto_root = "proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let files = protox::compile(
        [
            "proto/auth.proto",
            "proto/kv.proto",
            "proto/rpc.proto",
            "proto/v3election.proto",
            "proto/v3lock.proto",
        ],
        [proto_root],
    )
    .expect("Failed to parse proto files");
    tonic_prost_build::configure()
        .build_server(should_build_server())
        .compile_fds(files)
        .expect("Failed to compile proto files");
}
