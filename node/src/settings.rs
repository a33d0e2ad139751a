//! Where a program's settings come from: every flag also from an
//! environment variable (a prefix and the flag's name in upper case,
//! dashes as underscores: the daemon's `--agent-listen` is
//! `METROPOLIS_AGENT_LISTEN`) and from a TOML file (`--config FILE`)
//! whose keys are the flags' names. Precedence: a flag, then its
//! variable, then the file, then the built-in default. [`parse`] reads
//! the daemon's [`Config`] ([`DAEMON`]); [`parse_settings`] any clap
//! parser with a `config` flag (`bmaas-agent`'s, with its own prefix).
//!
//! The file's values become the flags' defaults before clap parses the
//! command line (so `--help` with `--config` shows them as defaults), and
//! clap then applies its own order: a flag, else its variable, else the
//! default.

use std::ffi::OsString;
use std::path::Path;

use clap::error::ErrorKind;
use clap::{Arg, ArgAction, Command, CommandFactory, FromArgMatches};
use metropolis_core::quote::quoted;

use crate::daemon::Config;

/// The prefix of the daemon's environment variables.
pub const ENV_PREFIX: &str = "METROPOLIS_";

/// A program whose settings [`parse_settings`] reads.
#[derive(Clone, Copy, Debug)]
pub struct Program {
    /// Its name, in errors.
    pub name: &'static str,
    /// The prefix of its environment variables (`METROPOLIS_`).
    pub env_prefix: &'static str,
}

/// `metropolisd`.
pub const DAEMON: Program = Program {
    name: "metropolisd",
    env_prefix: ENV_PREFIX,
};

/// The largest settings file read, in bytes.
const MAX_FILE_LEN: u64 = 1 << 20;

/// Parses the daemon's settings from `args` (the program name first),
/// the environment and the file `--config` names.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Config, clap::Error> {
    parse_settings(args, DAEMON)
}

/// Parses the settings of `program`, a clap parser `T` with a `config`
/// flag (the settings file), from `args` (the program name first), the
/// environment and that file.
pub fn parse_settings<T: CommandFactory + FromArgMatches>(
    args: impl IntoIterator<Item = OsString>,
    program: Program,
) -> Result<T, clap::Error> {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut command = with_env(T::command(), program);
    // Which file: a first pass that tolerates every other problem (the
    // second pass reports them, or prints the help).
    let file = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(&args)
        .ok()
        .and_then(|m| m.get_one::<std::path::PathBuf>("config").cloned());
    if let Some(file) = file {
        command = with_file(command, &file, program)?;
    }
    let matches = command.try_get_matches_from(&args)?;
    T::from_arg_matches(&matches)
}

/// `PROGRAM man DIR`: when `args` (the program name first) are exactly
/// that, writes the man page of `T` (the flags and their variables, as
/// `--help` shows them) into `DIR` as `<name>.1` and returns the page's
/// path, or why it could not; `None` for any other arguments.
pub fn man<T: CommandFactory>(
    args: &[OsString],
    program: Program,
) -> Option<Result<std::path::PathBuf, String>> {
    let [_, word, dir] = args else {
        return None;
    };
    if word != "man" {
        return None;
    }
    let dir = Path::new(dir);
    let command = with_env(T::command(), program);
    let page = dir.join(format!("{}.1", program.name));
    Some(
        std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(command, dir))
            .map(|()| page)
            .map_err(|e| format!("man {}: {e}", dir.display())),
    )
}

/// The variable of `arg`: the program's prefix and its long name.
fn env_name(program: Program, long: &str) -> String {
    let prefix = program.env_prefix;
    format!("{prefix}{}", long.to_uppercase().replace('-', "_"))
}

/// `command` with a variable for every flag that has none.
fn with_env(command: Command, program: Program) -> Command {
    let longs: Vec<(String, String)> = command
        .get_arguments()
        .filter(|a| a.get_env().is_none() && takes_setting(a))
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.to_owned())))
        .collect();
    let command = longs.into_iter().fold(command, |c, (id, long)| {
        c.mut_arg(id, |a| a.env(env_name(program, &long)))
    });
    let prefix = program.env_prefix;
    let after = format!(
        "Every flag can also be set by its environment variable (shown with it, \
         {prefix}<FLAG>) or in a TOML file given by --config, whose keys are the flag \
         names (`flag-name = value`, a list for a repeatable flag). A flag beats its variable, \
         which beats the file, which beats the default."
    );
    match command.get_after_help().map(|h| h.to_string()) {
        Some(before) => command.after_help(format!("{before}\n\n{after}")),
        None => command.after_help(after),
    }
}

/// Whether `arg` is a setting (not --help or --version).
fn takes_setting(arg: &Arg) -> bool {
    !matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    )
}

fn file_error(program: Program, file: &Path, problem: impl std::fmt::Display) -> clap::Error {
    Command::new(program.name).error(
        ErrorKind::InvalidValue,
        format!("--config {}: {problem}", file.display()),
    )
}

/// `command` with the settings of the TOML file at `path` as defaults.
fn with_file(mut command: Command, path: &Path, program: Program) -> Result<Command, clap::Error> {
    let file_error = |path: &Path, problem: String| file_error(program, path, problem);
    let len = std::fs::metadata(path)
        .map_err(|e| file_error(path, e.to_string()))?
        .len();
    if len > MAX_FILE_LEN {
        return Err(file_error(
            path,
            format!("{len} bytes; a settings file is at most {MAX_FILE_LEN}"),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| file_error(path, e.to_string()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| file_error(path, e.to_string()))?;
    for (key, value) in table {
        let long = key.replace('_', "-");
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && takes_setting(a))
        else {
            return Err(file_error(
                path,
                format!(
                    "unknown key {} (not a flag of {})",
                    quoted(&key),
                    program.name
                ),
            ));
        };
        if long == "config" {
            return Err(file_error(
                path,
                "a settings file cannot name another".into(),
            ));
        }
        let id = arg.get_id().to_string();
        let many = matches!(arg.get_action(), ArgAction::Append);
        let values = match value {
            toml::Value::Array(items) if many => items
                .into_iter()
                .map(|v| scalar(program, path, &key, v))
                .collect::<Result<Vec<_>, _>>()?,
            toml::Value::Array(_) => {
                return Err(file_error(
                    path,
                    format!("{} takes one value, not a list", quoted(&key)),
                ));
            }
            other => vec![scalar(program, path, &key, other)?],
        };
        // A flag the file sets is no longer required on the command line.
        command = command.mut_arg(id, |a| a.default_values(values).required(false));
    }
    Ok(command)
}

/// A string, number or boolean of the file as a flag's value.
fn scalar(
    program: Program,
    path: &Path,
    key: &str,
    value: toml::Value,
) -> Result<String, clap::Error> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(file_error(
            program,
            path,
            format!(
                "{}: a {} is not a flag's value (a string, a number or a boolean)",
                quoted(key),
                other.type_str()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("metropolisd")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metropolisd.toml");
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap().to_owned();
        (dir, path)
    }

    #[test]
    fn the_file_sets_defaults_that_a_flag_beats() {
        let (_dir, path) = file(
            "listen = \"127.0.0.1:9001\"\nagent_listen = \"127.0.0.1:9002\"\n\
             san = [\"a.example\", \"10.0.0.1\"]\ntrace-instances = true\n\
             shutdown-grace = 9\nlease-ttl = 7\n",
        );
        let config = parse(args(&["--config", &path, "--listen", "127.0.0.1:9100"])).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9100", "the flag wins");
        assert_eq!(config.agent_listen.to_string(), "127.0.0.1:9002");
        assert_eq!(config.extra_sans, ["a.example", "10.0.0.1"]);
        assert!(config.trace_instances);
        assert_eq!(config.shutdown_grace, 9);
        let defaults = parse(args(&[])).unwrap();
        assert_eq!(defaults.shutdown_grace, 5);
        assert!(!defaults.trace_instances);
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_key() {
        let cases = [
            ("no-such-flag = 1\n", "unknown key \"no-such-flag\""),
            ("listen = [\"a\", \"b\"]\n", "takes one value"),
            ("listen = { a = 1 }\n", "a table is not a flag's value"),
            ("config = \"other.toml\"\n", "cannot name another"),
            ("listen = \n", "metropolisd.toml"),
            ("shutdown-grace = \"soon\"\n", "soon"),
        ];
        for (text, expected) in cases {
            let (_dir, path) = file(text);
            let e = parse(args(&["--config", &path])).unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
        let e = parse(args(&["--config", "/nonexistent/metropolisd.toml"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/metropolisd.toml"), "{e}");
    }

    #[test]
    fn every_flag_has_a_variable() {
        let command = with_env(Config::command(), DAEMON);
        for arg in command.get_arguments().filter(|a| takes_setting(a)) {
            let long = arg.get_long().unwrap();
            let env = arg.get_env().unwrap().to_string_lossy().into_owned();
            assert_eq!(env, env_name(DAEMON, long), "--{long}");
        }
    }
}
