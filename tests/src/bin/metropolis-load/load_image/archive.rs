//! The test archive: a `docker save` style tarball with one layer of
//! incompressible bytes, written once per run.

use std::io::Read;
use std::path::Path;

use serde_json::json;
use sha2::Digest as _;

use crate::util::{Context, Result};

/// Deterministic incompressible bytes (xorshift64*).
pub(crate) fn fill(buf: &mut [u8], state: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Writes a `docker save` style archive with one layer holding a file of
/// `size` bytes to `path`; returns the archive's size.
pub fn write_archive(dir: &Path, path: &Path, size: u64) -> Result<u64> {
    // The layer tar first (its sha256 is the config's diff_id).
    let layer_path = dir.join("layer.tar");
    {
        let file = std::fs::File::create(&layer_path).context(|| "layer.tar".into())?;
        let mut layer = tar::Builder::new(std::io::BufWriter::new(file));
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        struct Gen {
            left: u64,
            state: u64,
        }
        impl Read for Gen {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                fill(&mut buf[..n], &mut self.state);
                self.left -= n as u64;
                Ok(n)
            }
        }
        let data = Gen {
            left: size,
            state: 0x9e37_79b9_7f4a_7c15,
        };
        layer
            .append_data(&mut header, "payload.bin", data)
            .context(|| "writing layer.tar".into())?;
        layer
            .into_inner()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .context(|| "finishing layer.tar".into())?;
    }
    let mut hasher = sha2::Sha256::new();
    let mut file = std::fs::File::open(&layer_path).context(|| "layer.tar".into())?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).context(|| "reading layer.tar".into())?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let diff_id: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    }))
    .context(|| "config".into())?;
    let config_name = format!(
        "{}.json",
        sha2::Sha256::digest(&config)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": ["bench/load-image:latest"],
        "Layers": ["layer/layer.tar"],
    }]))
    .context(|| "manifest".into())?;
    let out = std::fs::File::create(path).context(|| format!("{}", path.display()))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(out));
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        archive.append_data(&mut h, name, data)
    };
    add(&config_name, &config).context(|| "archive".into())?;
    add("manifest.json", &manifest).context(|| "archive".into())?;
    archive
        .append_path_with_name(&layer_path, "layer/layer.tar")
        .context(|| "archive".into())?;
    archive
        .into_inner()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .context(|| "finishing the archive".into())?;
    std::fs::remove_file(&layer_path).context(|| "removing layer.tar".into())?;
    Ok(std::fs::metadata(path)
        .context(|| "archive size".into())?
        .len())
}
