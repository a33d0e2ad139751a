//! How `metropolisd` and `bmaas-agent` end: one exit status per kind of
//! failure, the scheme of `metroctl` (docs/cli.md), and the fatal error
//! reported once on stderr, in the log format the program was started
//! with ([`report`]).
//!
//! | status | meaning |
//! | --- | --- |
//! | 0 | done: stopped by SIGTERM/SIGINT after a clean shutdown (the agent: the machine reboots) |
//! | 1 | any other failure (the store failed or is damaged, a file could not be read or written) |
//! | 2 | a usage error: a bad flag or value, named in the message |
//! | 3 | unavailable: a listen address in use, the data directory in use by another daemon |
//! | 4 | permission denied: an address or a path the program may not use |
//!
//! An error carries its status as a [`StartError`] in the chain of a
//! boxed error ([`status_of`]); one without is status 1.

use std::fmt;

use crate::daemon::LogFormat;

/// The exit status of a program that stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Done = 0,
    /// 1: any other failure.
    Failure = 1,
    /// 2: a usage error, the flag named.
    Usage = 2,
    /// 3: something the flags name is unavailable (in use, not answering).
    Unavailable = 3,
    /// 4: permission denied.
    PermissionDenied = 4,
}

impl Exit {
    /// As a process exit code.
    pub fn code(self) -> std::process::ExitCode {
        std::process::ExitCode::from(self as u8)
    }
}

/// A failure with its exit status and message (the message names the flag
/// and says what to do).
#[derive(Debug)]
pub struct StartError {
    /// The exit status it ends the program with.
    pub exit: Exit,
    /// What went wrong, and what to do.
    pub message: String,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StartError {}

/// A boxed error of status `exit`.
pub fn error(exit: Exit, message: impl Into<String>) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(StartError {
        exit,
        message: message.into(),
    })
}

/// A usage error (status 2): `message` names the flag.
pub fn usage(message: impl Into<String>) -> Box<dyn std::error::Error + Send + Sync> {
    error(Exit::Usage, message)
}

/// The status of an I/O failure on something a flag named: in use or not
/// there is 3, permission denied 4, an address not of this host 2, any
/// other 1.
pub fn io_status(e: &std::io::Error) -> Exit {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::AddrInUse => Exit::Unavailable,
        ErrorKind::PermissionDenied => Exit::PermissionDenied,
        ErrorKind::AddrNotAvailable => Exit::Usage,
        _ => Exit::Failure,
    }
}

/// The exit status of `error`: that of the first [`StartError`] in its
/// chain; 3 for a store whose directory another process holds; else 1.
pub fn status_of(error: &(dyn std::error::Error + 'static)) -> Exit {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(start) = e.downcast_ref::<StartError>() {
            return start.exit;
        }
        if let Some(metropolis_store::OpenError::Locked { .. }) =
            e.downcast_ref::<metropolis_store::OpenError>()
        {
            return Exit::Unavailable;
        }
        next = e.source();
    }
    Exit::Failure
}

/// Writes the fatal error `message` of `program` once to stderr in
/// `format`: `program: message` as text, or one JSON object as the JSON
/// log lines are (`timestamp`, `level` ERROR, `fields.message`,
/// `target`). Independent of the log filter, so it is never lost.
pub fn report(program: &str, format: LogFormat, message: &str) {
    use std::io::Write;
    let line = render(program, format, message);
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The line [`report`] writes, without its newline.
pub fn render(program: &str, format: LogFormat, message: &str) -> String {
    match format {
        LogFormat::Text => format!("{program}: {message}"),
        LogFormat::Json => {
            use tracing_subscriber::fmt::time::FormatTime;
            let mut timestamp = String::new();
            let _ = tracing_subscriber::fmt::time::SystemTime.format_time(
                &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
            );
            // In the order of the log's own JSON lines.
            let text = |s: &str| serde_json::Value::from(s).to_string();
            format!(
                "{{\"timestamp\":{},\"level\":\"ERROR\",\"fields\":{{\"message\":{}}},\"target\":{}}}",
                text(&timestamp),
                text(message),
                text(program)
            )
        }
    }
}

/// The log format the arguments ask for, read without parsing them
/// (for a usage error, when parsing failed): `--log-format json` or
/// `--log-format=json`, else the variable `env` set to `json`.
pub fn format_in_args(args: &[std::ffi::OsString], env: &str) -> LogFormat {
    let mut words = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(word) = words.next() {
        let value = match word.strip_prefix("--log-format") {
            Some("") => words.next().map(|v| v.into_owned()),
            Some(rest) => rest.strip_prefix('=').map(str::to_owned),
            None => continue,
        };
        return match value.as_deref() {
            Some("json") => LogFormat::Json,
            _ => LogFormat::Text,
        };
    }
    match std::env::var(env).as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// Ends the program over a settings error of clap's: help and version
/// printed as asked (status 0); a usage error once, in the log format
/// the arguments ask for, status 2.
pub fn settings_error(
    program: &str,
    error: clap::Error,
    args: &[std::ffi::OsString],
    env: &str,
) -> std::process::ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
        _ => {}
    }
    match format_in_args(args, env) {
        LogFormat::Text => {
            let _ = error.print();
        }
        LogFormat::Json => {
            let text = error.render().to_string();
            let text = text.trim_end().trim_start_matches("error: ");
            report(program, LogFormat::Json, text);
        }
    }
    Exit::Usage.code()
}
