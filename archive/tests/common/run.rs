//! Running the validator over an archive in chunks, and checking what it
//! streamed and planned.

use std::collections::BTreeMap;

use bytes::Bytes;
use metropolis_archive::*;

use super::sha;

/// Feeds `archive` in chunks of `chunk` bytes (the sizes cycle), draining
/// outputs after each chunk. Returns the outputs and the result.
pub fn run_chunks(
    archive: &[u8],
    chunks: &[usize],
    limits: ArchiveLimits,
) -> (Vec<Output>, Result<ImportPlan, ArchiveError>) {
    let input = Bytes::copy_from_slice(archive);
    let mut v = ArchiveValidator::new(limits);
    let mut outputs = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < input.len() {
        let n = chunks[i % chunks.len()].max(1).min(input.len() - at);
        i += 1;
        let result = v.handle_data(input.slice(at..at + n));
        at += n;
        while let Some(o) = v.poll_output() {
            outputs.push(o);
        }
        if let Err(e) = result {
            // Sticky: the same error again, and no outputs.
            assert_eq!(v.handle_data(Bytes::from_static(b"x")), Err(e.clone()));
            assert_eq!(v.poll_output(), None);
            assert_eq!(v.handle_eof(), Err(e.clone()));
            return (outputs, Err(e));
        }
    }
    (outputs, v.handle_eof())
}

pub fn run(archive: &[u8]) -> Result<ImportPlan, ArchiveError> {
    run_chunks(archive, &[4096], ArchiveLimits::default()).1
}

pub fn run_with(archive: &[u8], limits: ArchiveLimits) -> Result<ImportPlan, ArchiveError> {
    run_chunks(archive, &[4096], limits).1
}

/// A regular member as the outputs describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streamed {
    pub index: usize,
    pub path: String,
    pub data: Vec<u8>,
    pub sha256: [u8; 32],
    pub size: u64,
}

/// Joins the outputs into members, checking their order and hashes.
pub fn members(outputs: &[Output]) -> Vec<Streamed> {
    let mut done = Vec::new();
    let mut open: Option<Streamed> = None;
    for o in outputs {
        match o {
            Output::MemberStart { index, path } => {
                assert!(open.is_none(), "MemberStart inside a member");
                open = Some(Streamed {
                    index: *index,
                    path: path.clone(),
                    data: Vec::new(),
                    sha256: [0; 32],
                    size: 0,
                });
            }
            Output::MemberData { index, data } => {
                let m = open.as_mut().expect("MemberData outside a member");
                assert_eq!(m.index, *index);
                assert!(!data.is_empty(), "empty MemberData");
                m.data.extend_from_slice(data);
            }
            Output::MemberEnd {
                index,
                sha256,
                size,
            } => {
                let mut m = open.take().expect("MemberEnd outside a member");
                assert_eq!(m.index, *index);
                assert_eq!(*size, m.data.len() as u64);
                assert_eq!(sha(&m.data).sha256(), sha256);
                m.sha256 = *sha256;
                m.size = *size;
                done.push(m);
            }
        }
    }
    done
}

/// Checks that a plan is consistent with the streamed members: every blob
/// is a member with its digest and size, synthesized blobs hash to their
/// digests, every image's manifest is in the plan with its size, and the
/// synthesized manifests reference blobs of the plan.
pub fn check_plan(plan: &ImportPlan, outputs: &[Output]) {
    let streamed = members(outputs);
    let by_index: BTreeMap<usize, &Streamed> = streamed.iter().map(|m| (m.index, m)).collect();
    for b in &plan.blobs {
        let m = by_index
            .get(&b.member)
            .unwrap_or_else(|| panic!("blob {} from unknown member {}", b.digest, b.member));
        assert_eq!(&m.sha256, b.digest.sha256(), "blob {} content", b.digest);
        assert_eq!(m.size, b.size, "blob {} size", b.digest);
    }
    for s in &plan.synthesized {
        assert_eq!(sha(&s.data), s.digest);
        let m: serde_json::Value = serde_json::from_slice(&s.data).expect("synthesized JSON");
        let config = &m["config"];
        let refs = std::iter::once(config).chain(m["layers"].as_array().expect("layers").iter());
        for d in refs {
            let digest = Digest::parse(d["digest"].as_str().expect("digest")).expect("digest");
            let b = plan
                .blob(&digest)
                .expect("synthesized manifest references a blob");
            assert_eq!(Some(b.size), d["size"].as_u64());
        }
    }
    assert!(!plan.images.is_empty());
    for image in &plan.images {
        let d = &image.manifest;
        let size = match (plan.blob(&d.digest), plan.synthesized_blob(&d.digest)) {
            (Some(b), _) => b.size,
            (None, Some(s)) => s.data.len() as u64,
            (None, None) => panic!("image manifest {} not in the plan", d.digest),
        };
        assert_eq!(size, d.size);
    }
    check_children(plan);
}

/// The plan's reference graph is what its JSON says and covers it: every
/// manifest and index lists exactly the descriptors its own bytes hold,
/// and every blob is an image's root or some blob's child.
pub fn check_children(plan: &ImportPlan) {
    let in_plan = |d: &Digest| plan.blob(d).is_some() || plan.synthesized_blob(d).is_some();
    let mut reached: std::collections::BTreeSet<Digest> =
        plan.images.iter().map(|i| i.manifest.digest).collect();
    for (parent, children) in &plan.children {
        assert!(in_plan(parent), "children of {parent}, not in the plan");
        for c in children {
            assert!(
                in_plan(&c.digest),
                "{parent} references {}, not in the plan",
                c.digest
            );
            reached.insert(c.digest);
        }
    }
    let all: std::collections::BTreeSet<Digest> = plan
        .blobs
        .iter()
        .map(|b| b.digest)
        .chain(plan.synthesized.iter().map(|s| s.digest))
        .collect();
    assert_eq!(reached, all, "blobs reached through images and children");
    for s in &plan.synthesized {
        let m: serde_json::Value = serde_json::from_slice(&s.data).expect("synthesized JSON");
        let listed: Vec<(String, String)> = std::iter::once(&m["config"])
            .chain(m["layers"].as_array().expect("layers").iter())
            .map(|d| {
                (
                    d["mediaType"].as_str().expect("mediaType").to_owned(),
                    d["digest"].as_str().expect("digest").to_owned(),
                )
            })
            .collect();
        let recorded: Vec<(String, String)> = plan.children[&s.digest]
            .iter()
            .map(|c| (c.media_type.clone(), c.digest.to_string()))
            .collect();
        assert_eq!(recorded, listed, "children of synthesized {}", s.digest);
    }
}

pub const CHUNKS: [usize; 5] = [1, 7, 512, 4096, usize::MAX];

/// Runs an archive at every chunk size of the brief, checks the results
/// agree, and returns the plan.
pub fn accept_everywhere(archive: &[u8]) -> ImportPlan {
    let (outputs, plan) = run_chunks(archive, &[usize::MAX], ArchiveLimits::default());
    let plan = plan.unwrap_or_else(|e| panic!("rejected: {e}"));
    check_plan(&plan, &outputs);
    let whole = members(&outputs);
    for chunk in CHUNKS {
        let (o, p) = run_chunks(archive, &[chunk], ArchiveLimits::default());
        assert_eq!(p.as_ref(), Ok(&plan), "chunk size {chunk}");
        assert_eq!(members(&o), whole, "chunk size {chunk}");
    }
    plan
}

pub fn reject(archive: &[u8]) -> ArchiveError {
    let e = run(archive).expect_err("archive accepted");
    // Every chunking gives the same error.
    for chunk in [1, 511, usize::MAX] {
        assert_eq!(
            run_chunks(archive, &[chunk], ArchiveLimits::default())
                .1
                .as_ref(),
            Err(&e),
            "chunk size {chunk}"
        );
    }
    e
}
