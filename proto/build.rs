//! Compiles the .proto files with protox (no `protoc` needed) and generates:
//!
//! - prost messages and tonic clients/servers for every package (`mod.rs`),
//! - the encoded file descriptor set (`descriptor.bin`),
//! - the per-method authorization table read from the `authorization`
//!   method option of the descriptors (`authorization.rs`).

use std::fmt::Write as _;
use std::path::PathBuf;

use prost_reflect::{DescriptorPool, Value};

const PROTOS: &[&str] = &[
    "metropolis/node/core/curator/proto/api/api.proto",
    "metropolis/node/core/curator/proto/private/storage.proto",
    "metropolis/node/core/curator/proto/private/management.proto",
    "metropolis/node/core/curator/proto/private/machines.proto",
    "metropolis/node/core/curator/proto/private/maintenance.proto",
    "metropolis/node/core/curator/proto/private/images.proto",
    "cloud/bmaas/server/api/agent.proto",
    "metropolis/proto/api/debug.proto",
];

/// containerd's API, the subset the containerd image store calls: compiled
/// apart, so it stays out of the descriptor set this node's reflection
/// serves, and without servers.
const CONTAINERD_PROTOS: &[&str] = &[
    "containerd/services/content/v1/content.proto",
    "containerd/services/images/v1/images.proto",
    "containerd/services/leases/v1/leases.proto",
];

type BuildResult = Result<(), Box<dyn std::error::Error>>;

fn main() -> BuildResult {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for dir in ["metropolis", "cloud", "version", "osbase", "containerd"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTOS)?;
    let fds = compiler.file_descriptor_set();
    std::fs::write(
        out.join("descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    let pool = compiler.descriptor_pool();

    std::fs::write(out.join("authorization.rs"), authorization_table(&pool)?)?;

    // Services only with the `grpc` feature: the messages alone need no
    // tonic.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_transport(false)
        .build_client(grpc)
        .build_server(grpc)
        .include_file("mod.rs")
        .bytes(".")
        .compile_fds(fds)?;

    let mut containerd = protox::Compiler::new([&root])?;
    containerd.include_imports(true);
    containerd.open_files(CONTAINERD_PROTOS)?;
    tonic_prost_build::configure()
        .build_transport(false)
        .build_client(grpc)
        .build_server(false)
        .include_file("containerd.rs")
        .bytes(".")
        .compile_fds(containerd.file_descriptor_set())?;

    Ok(())
}

/// One `MethodPolicy` per method of every service, taken from the
/// `metropolis.proto.ext.authorization` option. Methods without the option
/// get `None`: the service does its own authentication.
fn authorization_table(pool: &DescriptorPool) -> Result<String, Box<dyn std::error::Error>> {
    let ext = pool
        .get_extension_by_name("metropolis.proto.ext.authorization")
        .ok_or("authorization extension missing from descriptors")?;
    let permission = pool
        .get_enum_by_name("metropolis.proto.ext.Permission")
        .ok_or("Permission enum missing from descriptors")?;
    let mut s = String::from("/// Every method of every compiled service, with its policy.\n");
    s.push_str("pub static METHODS: &[MethodPolicy] = &[\n");
    for service in pool.services() {
        for method in service.methods() {
            let path = format!("/{}/{}", service.full_name(), method.name());
            let options = method.options();
            if !options.has_extension(&ext) {
                writeln!(s, "    MethodPolicy {{ path: {path:?}, rule: None }},")?;
                continue;
            }
            let Value::Message(auth) = options.get_extension(&ext).into_owned() else {
                return Err(format!("{path}: authorization option is not a message").into());
            };
            let mut need = Vec::new();
            if let Some(Value::List(items)) = auth.get_field_by_name("need").map(|v| v.into_owned())
            {
                for item in items {
                    let Value::EnumNumber(n) = item else {
                        return Err(format!("{path}: need holds a non-enum").into());
                    };
                    let value = permission
                        .get_value(n)
                        .ok_or_else(|| format!("{path}: unknown permission number {n}"))?;
                    need.push(format!("Permission::{}", enum_variant(value.name())));
                }
            }
            let allow = matches!(
                auth.get_field_by_name("allow_unauthenticated")
                    .map(|v| v.into_owned()),
                Some(Value::Bool(true))
            );
            writeln!(
                s,
                "    MethodPolicy {{ path: {path:?}, rule: Some(Rule {{ need: &[{}], allow_unauthenticated: {allow} }}) }},",
                need.join(", ")
            )?;
        }
    }
    s.push_str("];\n");
    Ok(s)
}

/// prost's enum variant naming: strip the enum-name prefix, then CamelCase.
fn enum_variant(proto_name: &str) -> String {
    let stripped = proto_name.strip_prefix("PERMISSION_").unwrap_or(proto_name);
    stripped
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect()
}
