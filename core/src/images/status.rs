//! Which gRPC status `LoadImage` answers a rejected archive with: the one
//! place where the validator's errors, which say what is wrong with the
//! archive, become codes.

use metropolis_archive::ArchiveError;
use tonic::{Code, Status};

/// The code of a rejected archive: ResourceExhausted for a limit passed
/// (the archive's size, its number of members, one JSON document or all
/// of them together), InvalidArgument for anything else (a malformed or
/// inconsistent archive, and any kind of error the validator adds later).
pub fn archive_code(e: &ArchiveError) -> Code {
    match e {
        ArchiveError::ArchiveTooLarge { .. }
        | ArchiveError::TooManyMembers { .. }
        | ArchiveError::JsonTooLarge { .. }
        | ArchiveError::MetadataTooLarge { .. } => Code::ResourceExhausted,
        _ => Code::InvalidArgument,
    }
}

/// A gRPC status with [`archive_code`] and the error's message.
pub fn archive_status(e: &ArchiveError) -> Status {
    Status::new(archive_code(e), e.to_string())
}
