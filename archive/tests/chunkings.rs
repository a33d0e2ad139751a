//! Properties over the fixtures: any chunking gives the same members and
//! plan, a changed blob byte is caught, and mutated, truncated or
//! re-sized archives never panic and are accepted only with a consistent
//! plan.

mod common;

use std::collections::BTreeMap;

use common::*;
use metropolis_archive::*;
use proptest::prelude::*;

/// Where proptest keeps this file's failing cases: next to it
/// (`<file>.proptest-regressions`; the default looks for a `src/` that an
/// integration test is not in).
fn regressions() -> proptest::test_runner::FileFailurePersistence {
    proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions")
}

/// Members read as documents (not blobs): changing them may break the
/// archive.
const WELL_KNOWN: [&str; 4] = ["manifest.json", "index.json", "oci-layout", "repositories"];

fn archives() -> [Vec<u8>; 3] {
    [docker_archive(), docker25_archive(), oci_archive()]
}

/// Where each regular member's data lies in an archive, by path (read
/// with the `tar` crate's own reader).
fn data_spans(archive: &[u8]) -> BTreeMap<String, (usize, usize)> {
    let mut a = ::tar::Archive::new(archive);
    let mut spans = BTreeMap::new();
    for entry in a.entries().expect("entries") {
        let entry = entry.expect("entry");
        if entry.header().entry_type().is_file() {
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let start = entry.raw_file_position() as usize;
            spans.insert(path, (start, entry.size() as usize));
        }
    }
    spans
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: Some(Box::new(regressions())),
        ..ProptestConfig::default()
    })]

    /// Changing any byte of a member the plan uses as a blob is caught;
    /// changing any other member's bytes leaves a consistent plan.
    #[test]
    fn blob_mutations_are_caught(
        which in 0usize..3,
        member in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let archive = archives()[which].clone();
        let (outputs, plan) = run_chunks(&archive, &[usize::MAX], ArchiveLimits::default());
        let plan = plan.expect("valid fixture");
        let streamed = members(&outputs);
        let spans = data_spans(&archive);
        let target = member.get(&streamed);
        prop_assume!(target.size > 0);
        let (start, size) = spans[&target.path];
        let mut mutated = archive.clone();
        mutated[start + at.index(size)] ^= flip;
        let is_blob = plan.blobs.iter().any(|b| b.member == target.index);
        let (outputs, result) = run_chunks(&mutated, &[1000], ArchiveLimits::default());
        match result {
            Ok(plan) => {
                prop_assert!(!is_blob, "mutated blob {} accepted", target.path);
                check_plan(&plan, &outputs);
            }
            Err(_) => prop_assert!(
                is_blob || WELL_KNOWN.contains(&target.path.as_str()),
                "mutating {} rejected", target.path
            ),
        }
    }

    /// Any chunking of a valid archive gives the same members and plan.
    #[test]
    fn chunkings_agree(which in 0usize..3, chunks in prop::collection::vec(1usize..3000, 1..40)) {
        let archive = &archives()[which];
        let (o1, p1) = run_chunks(archive, &[usize::MAX], ArchiveLimits::default());
        let (o2, p2) = run_chunks(archive, &chunks, ArchiveLimits::default());
        prop_assert!(p1.is_ok());
        prop_assert_eq!(p1, p2);
        prop_assert_eq!(members(&o1), members(&o2));
    }

    /// Mutated or truncated archives never panic, and are accepted only
    /// with a plan consistent with what was streamed.
    #[test]
    fn mutations_never_panic(
        which in 0usize..3,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        chunks in prop::collection::vec(1usize..2000, 1..8),
    ) {
        let mut archive = archives()[which].clone();
        for (at, byte) in edits {
            let i = at.index(archive.len());
            archive[i] = byte;
        }
        if truncate {
            archive.truncate(cut.index(archive.len()));
        }
        let (outputs, plan) = run_chunks(&archive, &chunks, ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }

    /// Any declared size (octal or base-256) never panics.
    #[test]
    fn declared_sizes_never_panic(
        which in 0usize..3,
        block in 0usize..8,
        size in prop_oneof![any::<u64>(), (u64::MAX - 4096)..=u64::MAX, 0u64..100_000],
    ) {
        let mut archive = archives()[which].clone();
        let start = (block * 512).min(archive.len() - 512);
        let mut h = ::tar::Header::from_byte_slice(&archive[start..start + 512]).clone();
        h.set_size(size);
        h.set_cksum();
        archive[start..start + 512].copy_from_slice(h.as_bytes());
        let (outputs, plan) = run_chunks(&archive, &[900], ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }

    /// Headers with fixed checksums but random fields never panic.
    #[test]
    fn header_fields_never_panic(
        which in 0usize..3,
        block in 0usize..8,
        // Anywhere, or in the size field, or the type flag.
        edits in prop::collection::vec(
            (prop_oneof![0usize..512, 124usize..136, Just(156usize)], any::<u8>()),
            1..6,
        ),
    ) {
        let mut archive = archives()[which].clone();
        let start = (block * 512).min(archive.len() - 512);
        for (at, byte) in edits {
            if !(148..156).contains(&at) {
                archive[start + at] = byte;
            }
        }
        let h = ::tar::Header::from_byte_slice(&archive[start..start + 512]).clone();
        let mut h = h;
        h.set_cksum();
        archive[start..start + 512].copy_from_slice(h.as_bytes());
        let (outputs, plan) = run_chunks(&archive, &[700], ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }
}
