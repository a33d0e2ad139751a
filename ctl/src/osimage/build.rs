//! `metroctl osimage build`: an OS image written as an OCI image layout
//! directory (`oci-layout`, `index.json`, `blobs/sha256/<hex>`).

use std::io::{BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};

use super::encode::{EncodeError, encode};
use super::format::{
    self, Compression, Descriptor, Kind, MAX_CHUNK_SIZE, Payload, digest_of, quoted,
};
use crate::CliError;
use crate::exit::{Exit, failed, usage};

/// Payloads from this size on get a progress bar (on a terminal).
const PROGRESS_FROM_BYTES: u64 = 64 << 20;

/// What `build` was asked for.
#[derive(Debug)]
pub struct Plan {
    /// The layout directory.
    pub out: PathBuf,
    /// The image's kind.
    pub kind: Kind,
    /// How layers are stored.
    pub compression: Compression,
    /// `hash_chunk_size`.
    pub chunk_size: u64,
    /// `(name, file)` in layer order.
    pub payloads: Vec<(String, PathBuf)>,
}

/// What `build` wrote.
#[derive(Debug)]
pub struct Built {
    /// The manifest.
    pub manifest: Descriptor,
    /// Every payload and its layer.
    pub payloads: Vec<(Payload, Descriptor)>,
}

/// Checks the command line: the chunk size, the payloads against the
/// kind, and that `--out` is new or empty. Errors name the flag.
pub fn plan(
    out: PathBuf,
    specs: &[String],
    kind: Kind,
    compression: Compression,
    chunk_size: u64,
) -> Result<Plan, CliError> {
    if chunk_size == 0 || chunk_size > MAX_CHUNK_SIZE {
        return Err(usage(format!(
            "--chunk-size {chunk_size}: must be from 1 to {MAX_CHUNK_SIZE} bytes (16 MiB)"
        )));
    }
    let wanted = kind.payloads();
    let mut given: Vec<(String, PathBuf)> = Vec::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            return Err(usage(format!(
                "--payload {}: expected NAME=FILE, e.g. --payload {}=./{}",
                quoted(spec),
                wanted[0],
                wanted[0]
            )));
        };
        if let Some(problem) = format::name_problem(name) {
            return Err(usage(format!("--payload {}: {problem}", quoted(name))));
        }
        if file.is_empty() {
            return Err(usage(format!("--payload {name}=: no FILE after =")));
        }
        if given.iter().any(|(n, _)| n == name) {
            return Err(usage(format!(
                "--payload {name}: given twice; give each payload once"
            )));
        }
        if !wanted.contains(&name) {
            let hint = match kind {
                Kind::Metropolis => "; for a whole-disk image give --kind disk --payload disk=FILE",
                Kind::Disk => "; for a Metropolis image give --kind metropolis",
            };
            return Err(usage(format!(
                "--payload {name}: not a payload of a {} image, which has {}{hint}",
                kind.name(),
                wanted.join(" and ")
            )));
        }
        given.push((name.to_string(), PathBuf::from(file)));
    }
    let mut payloads = Vec::new();
    for name in wanted {
        let Some(found) = given.iter().find(|(n, _)| n == name) else {
            let all: Vec<String> = wanted
                .iter()
                .map(|n| format!("--payload {n}=FILE"))
                .collect();
            return Err(usage(format!(
                "--payload {name}=FILE is missing: a {} image needs {}",
                kind.name(),
                all.join(" and ")
            )));
        };
        payloads.push(found.clone());
    }
    match std::fs::read_dir(&out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(usage(format!(
                    "--out {}: exists and is not empty; give a new or empty directory",
                    out.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(usage(format!(
                "--out {}: {e}; give a new or empty directory",
                out.display()
            )));
        }
    }
    Ok(Plan {
        out,
        kind,
        compression,
        chunk_size,
        payloads,
    })
}

fn io_failure(path: &Path, e: impl std::fmt::Display) -> CliError {
    failed(Exit::Failure, format!("{}: {e}", path.display()))
}

/// Writes `bytes` as a blob of `dir` (`blobs/sha256`).
fn write_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> Result<Descriptor, CliError> {
    use sha2::Digest as _;
    let digest = digest_of(&sha2::Sha256::digest(bytes));
    let path = dir.join(&digest["sha256:".len()..]);
    std::fs::write(&path, bytes).map_err(|e| io_failure(&path, e))?;
    Ok(Descriptor {
        media_type: media_type.to_string(),
        digest,
        size: bytes.len() as u64,
    })
}

fn progress_bar(name: &str, total: u64) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    if total < PROGRESS_FROM_BYTES {
        return ProgressBar::hidden();
    }
    // Drawn only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = format!(
        "{name} {{bar:30}} {{binary_bytes}}/{{binary_total_bytes}} ({{percent}}%), \
         {{binary_bytes_per_sec}}, ETA {{eta}}"
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Streams one payload file into a blob of `blobs`.
fn payload_blob(
    plan: &Plan,
    blobs: &Path,
    name: &str,
    file: &Path,
) -> Result<(Payload, Descriptor), CliError> {
    let flag = format!("--payload {name}={}", file.display());
    let source = std::fs::File::open(file).map_err(|e| usage(format!("{flag}: {e}")))?;
    let length = source
        .metadata()
        .map_err(|e| usage(format!("{flag}: {e}")))?
        .len();
    let partial = blobs.join(format!(".partial-{name}"));
    let sink = std::fs::File::create(&partial).map_err(|e| io_failure(&partial, e))?;
    let bar = progress_bar(name, length);
    let result = encode(
        name,
        BufReader::with_capacity(1 << 20, source),
        BufWriter::with_capacity(1 << 20, &sink),
        plan.chunk_size,
        plan.compression,
        bar.clone(),
    );
    bar.finish_and_clear();
    let encoded = match result {
        Ok(encoded) => encoded,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(match e {
                EncodeError::Read(e) => failed(Exit::Failure, format!("{flag}: {e}")),
                EncodeError::Write(e) => io_failure(&partial, e),
            });
        }
    };
    if encoded.payload.size == 0 {
        let _ = std::fs::remove_file(&partial);
        return Err(usage(format!("{flag}: the file is empty")));
    }
    sink.sync_all().map_err(|e| io_failure(&partial, e))?;
    let path = blobs.join(&encoded.digest["sha256:".len()..]);
    std::fs::rename(&partial, &path).map_err(|e| io_failure(&path, e))?;
    let layer = Descriptor {
        media_type: plan.compression.media_type().to_string(),
        digest: encoded.digest,
        size: encoded.blob_size,
    };
    Ok((encoded.payload, layer))
}

fn write_layout(plan: &Plan) -> Result<Built, CliError> {
    let blobs = plan.out.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| {
        usage(format!(
            "--out {}: {e}; give a directory that can be created",
            plan.out.display()
        ))
    })?;
    let mut payloads = Vec::new();
    for (name, file) in &plan.payloads {
        payloads.push(payload_blob(plan, &blobs, name, file)?);
    }
    let described: Vec<Payload> = payloads.iter().map(|(p, _)| p.clone()).collect();
    let layers: Vec<Descriptor> = payloads.iter().map(|(_, l)| l.clone()).collect();
    let config = write_blob(
        &blobs,
        format::CONFIG_MEDIA_TYPE,
        &format::config_json(&described),
    )?;
    let manifest_bytes = format::manifest_json(plan.kind, &config, &layers);
    let manifest = write_blob(&blobs, format::MANIFEST_MEDIA_TYPE, &manifest_bytes)?;
    for (file, bytes) in [
        ("oci-layout", format::OCI_LAYOUT.to_vec()),
        ("index.json", format::index_json(plan.kind, &manifest)),
    ] {
        let path = plan.out.join(file);
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .map_err(|e| io_failure(&path, e))?;
    }
    Ok(Built { manifest, payloads })
}

/// Writes the image layout `plan` describes. On failure, what was written
/// is removed again (the directory was new or empty).
pub fn build(plan: &Plan) -> Result<Built, CliError> {
    let existed = plan.out.exists();
    let result = write_layout(plan);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(plan.out.join("blobs"));
        let _ = std::fs::remove_file(plan.out.join("index.json"));
        let _ = std::fs::remove_file(plan.out.join("oci-layout"));
        if !existed {
            let _ = std::fs::remove_dir(&plan.out);
        }
    }
    result
}
