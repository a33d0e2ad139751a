//! `archive_validator`: [`ArchiveValidator`] fed arbitrary bytes in
//! arbitrary chunkings, under default or tight limits.
//!
//! Input: `[chunking][limits][s0][s1][s2][s3]` then the archive bytes.
//! `chunking % 4`: 0 one chunk; 1 chunks of `s_i` bytes (0: an empty
//! chunk); 2 of `16 * s_i + 1`; 3 of `512 * s_i + 1`, cycling through
//! `s0..s3` (all zero: `0, 1`). `limits % 4`: 0 the defaults; 1 tight
//! everything; 2 tight JSON caps; 3 few members.
//!
//! Checked: no panic; the outputs are well-formed (each regular member is
//! `MemberStart`, `MemberData`*, `MemberEnd`, indexes increase, paths are
//! normalised, relative, without `..` and unique, the end's digest and
//! size are those of the data streamed); errors are sticky and
//! map to InvalidArgument or ResourceExhausted (through the service
//! layer's `archive_code`); an accepted archive's plan
//! is consistent (every blob's member index had a `MemberEnd` with that
//! digest and size, blob digests unique, every image's manifest is a blob
//! or a synthesized blob, synthesized blobs hash to their digests); and
//! the outcome does not depend on the chunking (same plan and outputs as
//! one chunk; same error unless the total size limit fired, which is
//! checked as bytes arrive).

use std::collections::BTreeMap;

use bytes::Bytes;
use metropolis_archive::{
    ArchiveError, ArchiveLimits, ArchiveValidator, Digest, ImportPlan, Output,
};
use metropolis_service::status::debug::archive_code;
use sha2::Digest as _;

use super::input::Input;

/// A regular member as streamed: `(path, sha256, size)` by index.
pub type Members = BTreeMap<usize, (String, [u8; 32], u64)>;

/// Checks the output stream of a validator, member by member.
#[derive(Default)]
pub struct OutputChecker {
    current: Option<(usize, String, sha2::Sha256, u64)>,
    /// Completed members.
    pub members: Members,
}

impl OutputChecker {
    /// Takes the next output; panics if it breaks the stream's shape.
    pub fn handle(&mut self, output: &Output) {
        match output {
            Output::MemberStart { index, path } => {
                assert!(
                    self.current.is_none(),
                    "member {index} starts inside another"
                );
                assert!(
                    !path.is_empty() && path.split('/').all(|c| !matches!(c, "" | "." | "..")),
                    "member {index}: path {path:?} is not normalised or escapes"
                );
                assert!(
                    self.members.values().all(|(p, ..)| p != path),
                    "member {index}: path {path:?} twice"
                );
                if let Some((&last, _)) = self.members.last_key_value() {
                    assert!(*index > last, "member index {index} after {last}");
                }
                self.current = Some((*index, path.clone(), sha2::Sha256::new(), 0));
            }
            Output::MemberData { index, data } => {
                let cur = self.current.as_mut().expect("data outside a member");
                assert_eq!(cur.0, *index, "data of another member");
                cur.2.update(data);
                cur.3 += data.len() as u64;
            }
            Output::MemberEnd {
                index,
                sha256,
                size,
            } => {
                let (i, path, hasher, len) = self.current.take().expect("end outside a member");
                assert_eq!(i, *index, "end of another member");
                let digest: [u8; 32] = hasher.finalize().into();
                assert_eq!(
                    &digest, sha256,
                    "member {index}: digest differs from its data"
                );
                assert_eq!(len, *size, "member {index}: size differs from its data");
                self.members.insert(i, (path, digest, len));
            }
        }
    }

    /// Whether a member is open (started, not ended).
    pub fn in_member(&self) -> bool {
        self.current.is_some()
    }
}

/// Checks an accepted archive's plan against the members streamed.
pub fn check_plan(plan: &ImportPlan, members: &Members) {
    let mut digests = std::collections::BTreeSet::new();
    for blob in &plan.blobs {
        assert!(digests.insert(blob.digest), "blob {} twice", blob.digest);
        let (path, sha, size) = members.get(&blob.member).unwrap_or_else(|| {
            panic!(
                "blob {} names member {} that never ended",
                blob.digest, blob.member
            )
        });
        assert_eq!(
            Digest::from_sha256(*sha),
            blob.digest,
            "blob {} from member {} ({path}) of another digest",
            blob.digest,
            blob.member
        );
        assert_eq!(
            *size, blob.size,
            "blob {}: size differs from member {path}",
            blob.digest
        );
    }
    for s in &plan.synthesized {
        assert_eq!(Digest::of(&s.data), s.digest, "synthesized blob digest");
    }
    assert!(!plan.images.is_empty(), "an accepted archive has an image");
    for image in &plan.images {
        let d = &image.manifest.digest;
        match (plan.blob(d), plan.synthesized_blob(d)) {
            (Some(b), None) => assert_eq!(b.size, image.manifest.size, "manifest size"),
            (None, Some(s)) => {
                assert_eq!(s.data.len() as u64, image.manifest.size, "manifest size")
            }
            other => panic!("image manifest {d} is not exactly one blob: {other:?}"),
        }
    }
}

fn limits(mode: u8) -> ArchiveLimits {
    let tight = ArchiveLimits {
        max_total_size: 4096 + 512 * u64::from(mode >> 2),
        max_json_size: 64 + 16 * usize::from(mode >> 2),
        max_json_total: 256 + 64 * usize::from(mode >> 2),
        max_members: 2 + usize::from(mode >> 4),
    };
    let default = ArchiveLimits::default();
    match mode % 4 {
        0 => default,
        1 => tight,
        2 => ArchiveLimits {
            max_json_size: tight.max_json_size,
            max_json_total: tight.max_json_total,
            ..default
        },
        _ => ArchiveLimits {
            max_members: tight.max_members,
            ..default
        },
    }
}

/// What one feeding produced.
struct Outcome {
    result: Result<ImportPlan, ArchiveError>,
    members: Members,
}

fn feed(archive: &Bytes, sizes: impl Iterator<Item = usize>, limits: ArchiveLimits) -> Outcome {
    let mut v = ArchiveValidator::new(limits);
    let mut checker = OutputChecker::default();
    let mut at = 0;
    let mut sizes = sizes;
    loop {
        let n = sizes
            .next()
            .unwrap_or(archive.len())
            .min(archive.len() - at);
        let chunk = archive.slice(at..at + n);
        at += n;
        if let Err(e) = v.handle_data(chunk) {
            assert!(v.poll_output().is_none(), "outputs after an error");
            assert_eq!(v.error(), Some(&e), "error not kept");
            assert_eq!(
                v.handle_data(Bytes::from_static(b"x")),
                Err(e.clone()),
                "error not sticky"
            );
            let code = archive_code(&e);
            assert!(
                matches!(
                    code,
                    tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
                ),
                "{e}: code {code:?}"
            );
            let eof = v.handle_eof();
            assert_eq!(eof, Err(e), "handle_eof after an error");
            return Outcome {
                result: eof,
                members: checker.members,
            };
        }
        while let Some(output) = v.poll_output() {
            checker.handle(&output);
        }
        if at == archive.len() {
            break;
        }
    }
    assert_eq!(v.bytes_received(), archive.len() as u64);
    let in_member = checker.in_member();
    let result = v.handle_eof();
    match &result {
        Ok(plan) => {
            assert!(!in_member, "accepted with a member still open");
            check_plan(plan, &checker.members);
        }
        Err(e) => {
            let code = archive_code(e);
            assert!(
                matches!(
                    code,
                    tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
                ),
                "{e}: code {code:?}"
            );
        }
    }
    Outcome {
        result,
        members: checker.members,
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let chunking = input.u8();
    let limits = limits(input.u8());
    let s: Vec<usize> = input.bytes(4).iter().map(|b| usize::from(*b)).collect();
    // Chunks of 0 bytes only would never end.
    let s = if s.iter().all(|&b| b == 0) {
        vec![0, 1]
    } else {
        s
    };
    let archive = Bytes::copy_from_slice(input.rest());
    let sizes = s.iter().cycle().map(move |&b| match chunking % 4 {
        1 => b,
        2 => 16 * b + 1,
        _ => 512 * b + 1,
    });
    let whole = feed(&archive, std::iter::empty(), limits.clone());
    if chunking.is_multiple_of(4) {
        return;
    }
    let chunked = feed(&archive, sizes, limits);
    match (&whole.result, &chunked.result) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "plan depends on the chunking");
            assert_eq!(
                whole.members, chunked.members,
                "outputs depend on the chunking"
            );
        }
        (Err(a), Err(b)) => {
            let size_limit = |e: &ArchiveError| matches!(e, ArchiveError::ArchiveTooLarge { .. });
            if !size_limit(a) && !size_limit(b) {
                assert_eq!(a, b, "error depends on the chunking");
            }
        }
        (a, b) => panic!(
            "accepted in one chunking only: whole {:?}, chunked {:?}",
            a.as_ref().map(|_| "plan"),
            b.as_ref().map(|_| "plan")
        ),
    }
}
