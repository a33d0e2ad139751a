//! The files metroctl writes, and its one rule for them: nothing it
//! writes replaces a file. Every target (a key, a credential bundle, a
//! kubeconfig, a backup, man pages) is checked before anything is sent or
//! generated, and an existing one is a usage error naming the flag (exit
//! 2); the file is then written whole beside its target and linked into
//! place, which fails rather than replaces if one appeared meanwhile.

use std::path::Path;

use super::CliError;
use super::exit::usage;

/// Checks, before any call, that nothing is at `path` (the value of
/// `flag`): not a file, a directory or a dangling symbolic link.
pub fn check_absent(flag: &str, path: &Path) -> Result<(), CliError> {
    if path.symlink_metadata().is_ok() {
        return Err(usage(format!(
            "{flag} {}: the file exists; remove it or give another path (nothing was sent)",
            path.display()
        )));
    }
    Ok(())
}

/// Checks, before any call, that `path` (the value of `flag`) can be
/// written later: nothing is there yet ([`check_absent`]) and its
/// directory exists.
pub fn check_new_file(flag: &str, path: &Path) -> Result<(), CliError> {
    check_absent(flag, path)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(usage(format!(
            "{flag} {}: the directory {} does not exist (nothing was sent)",
            path.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// Checks, before any call, that the directory `dir` (the value of
/// `flag`) holds none of the files `names` that would be written into it
/// (it may be missing: it is created then). `what` says what they are,
/// for the message.
pub fn check_new_files_in(
    flag: &str,
    dir: &Path,
    names: &[&str],
    what: &str,
) -> Result<(), CliError> {
    if dir.symlink_metadata().is_ok() && !dir.is_dir() {
        return Err(usage(format!(
            "{flag} {}: exists and is not a directory; give a new or empty directory (nothing \
             was sent)",
            dir.display()
        )));
    }
    let taken: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| dir.join(name).symlink_metadata().is_ok())
        .collect();
    if !taken.is_empty() {
        return Err(usage(format!(
            "{flag} {}: already holds {} ({what}), which would be overwritten; nothing was sent \
             and nothing changed: give a new or empty directory, or move the old files away \
             first",
            dir.display(),
            taken.join(", ")
        )));
    }
    Ok(())
}

/// Writes `contents` to `path` (the value of `flag`), mode 0600, without
/// replacing anything: whole into a temporary file beside it, synced,
/// then linked into place (a failure, also a file that appeared since
/// [`check_new_file`], leaves no new file at `path`).
pub fn write_private(flag: &str, path: &Path, contents: &str) -> Result<(), CliError> {
    metropolis_pki::write_new_file(path, contents.as_bytes(), 0o600)
        .map_err(|e| format!("{flag}: {e}").into())
}

/// The man pages of `command`, as `clap_mangen::generate_to` names them
/// (`metroctl.1`, `metroctl-machine-show.1`, ...): file name and text.
fn man_pages(command: clap::Command) -> Result<Vec<(String, Vec<u8>)>, CliError> {
    fn collect(command: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<(), CliError> {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            collect(sub.clone(), pages)?;
        }
        let man = clap_mangen::Man::new(command);
        let mut text = Vec::new();
        man.render(&mut text)
            .map_err(|e| format!("rendering the man page {}: {e}", man.get_filename()))?;
        pages.push((man.get_filename(), text));
        Ok(())
    }
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut pages = Vec::new();
    collect(command, &mut pages)?;
    Ok(pages)
}

/// `metroctl man DIR`: writes the man pages of `command` into `dir`
/// (created if missing), mode 0644. A page already there is refused
/// before anything is written, naming DIR and `--replace`; with
/// `replace`, each page is replaced atomically (written beside it, then
/// renamed over it). Returns how many pages were written.
pub fn write_man_pages(
    command: clap::Command,
    dir: &Path,
    replace: bool,
) -> Result<usize, CliError> {
    let pages = man_pages(command)?;
    if dir.symlink_metadata().is_ok() && !dir.is_dir() {
        return Err(usage(format!(
            "DIR {}: exists and is not a directory",
            dir.display()
        )));
    }
    if !replace {
        let taken: Vec<&str> = pages
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| dir.join(name).symlink_metadata().is_ok())
            .collect();
        if let Some(first) = taken.first() {
            return Err(usage(format!(
                "DIR {}: already holds {first}{}; nothing was written: give --replace to \
                 replace metroctl's pages there (e.g. after an upgrade), or another directory",
                dir.display(),
                match taken.len() {
                    1 => String::new(),
                    n => format!(" and {} other metroctl page(s)", n - 1),
                }
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| usage(format!("DIR {}: cannot create it: {e}", dir.display())))?;
    for (name, text) in &pages {
        let path = dir.join(name);
        let written = if replace {
            replace_atomically(&path, text)
        } else {
            metropolis_pki::write_new_file(&path, text, 0o644).map_err(|e| e.to_string())
        };
        written.map_err(|e| format!("DIR {}: {e}", dir.display()))?;
    }
    Ok(pages.len())
}

/// Writes `text` beside `path` (mode 0644), then renames it over `path`.
fn replace_atomically(path: &Path, text: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(path.file_name().unwrap_or_default());
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temp)
        .and_then(|mut f| f.write_all(text).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("{}: cannot write it: {e}", path.display()));
    }
    Ok(())
}
