//! Validation of a `TraceRequest` before anything is written to tracefs.
//!
//! Every string of a request ends up either in a tracefs path (an instance
//! name) or written into a tracefs control file (the tracer, the filter
//! patterns), so each is checked against a small whitelist:
//!
//! - **names** (the tracer, an instance name): 1 to [`MAX_NAME_LEN`] bytes
//!   of `[A-Za-z0-9_-]`. Every kernel tracer (`function_graph`, `wakeup_rt`,
//!   `blk`, ...) fits; `.` is refused so `.` and `..` can never become path
//!   components.
//! - **filter patterns** (`function_filter`, `graph_function_filter`): 1 to
//!   [`MAX_PATTERN_LEN`] bytes of printable ASCII except `/`, at most
//!   [`MAX_PATTERNS`] per list. `*` (and the kernel's other glob characters,
//!   and a leading `!`) are allowed. `:` selects set_ftrace_filter
//!   *commands*; only ftrace's module form is accepted,
//!   `PATTERN:mod:MODULE` (as the reference and ftrace accept), with a
//!   non-empty pattern and a module name of 1 to [`MAX_MODULE_LEN`] bytes
//!   of `[A-Za-z0-9_-]` and the globs `*?`, after an optional `!`. It only
//!   selects functions, and the truncating reset at teardown clears it
//!   (with the kernel's list of filters for modules not loaded yet). Every
//!   other command (`func:traceoff`, `func:snapshot`, ...) arms a probe
//!   that outlives the session, so it is refused.
//!
//! Whitespace of any kind (a pattern with a space would be two patterns to
//! the kernel), newlines, NUL and other control characters are refused
//! everywhere, each with its own message.

use std::fmt;

use metropolis_proto::prelude::debug;

/// Longest tracer or instance name accepted, in bytes. Kernel tracer names
/// are under 32 bytes; 128 leaves room without letting a request grow
/// paths and messages without bound.
pub const MAX_NAME_LEN: usize = 128;

/// Longest filter pattern accepted, in bytes: the kernel's `KSYM_NAME_LEN`
/// (512 since Linux 6.1), the longest symbol name a pattern can match.
pub const MAX_PATTERN_LEN: usize = 512;

/// Most patterns accepted per filter list.
pub const MAX_PATTERNS: usize = 1024;

/// Longest module name accepted in `PATTERN:mod:MODULE`: the kernel's
/// `MODULE_NAME_LEN` less its terminating NUL.
pub const MAX_MODULE_LEN: usize = 55;

/// Longest excerpt of an offending value quoted in an error message.
const QUOTE_LEN: usize = 64;

/// The request field (or instance name) an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `TraceRequest.tracer`.
    Tracer,
    /// `TraceRequest.function_filter` as a whole (its length).
    FunctionFilters,
    /// `TraceRequest.function_filter[i]`.
    FunctionFilter(usize),
    /// `TraceRequest.graph_function_filter` as a whole (its length).
    GraphFunctionFilters,
    /// `TraceRequest.graph_function_filter[i]`.
    GraphFunctionFilter(usize),
    /// The tracefs instance name chosen by the caller.
    Instance,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Tracer => f.write_str("tracer"),
            Field::FunctionFilters => f.write_str("function_filter"),
            Field::FunctionFilter(i) => write!(f, "function_filter[{i}]"),
            Field::GraphFunctionFilters => f.write_str("graph_function_filter"),
            Field::GraphFunctionFilter(i) => write!(f, "graph_function_filter[{i}]"),
            Field::Instance => f.write_str("instance"),
        }
    }
}

/// What is wrong with a value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The value is empty.
    Empty,
    /// The value is longer than allowed.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The list has more entries than allowed.
    TooMany {
        /// Its number of entries.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The value contains `/`.
    PathSeparator,
    /// The value contains `\n` or `\r`.
    Newline,
    /// The value contains a NUL character.
    Nul,
    /// The value contains whitespace other than a newline.
    Whitespace,
    /// The value contains another control character.
    ControlCharacter,
    /// The value contains a non-ASCII character.
    NonAscii,
    /// The value contains a character not allowed in this field.
    Disallowed(char),
    /// A filter pattern carries a set_ftrace_filter command other than
    /// the module form `PATTERN:mod:MODULE`.
    FilterCommand,
    /// `PATTERN:mod:MODULE` has no function pattern before `:mod:`.
    ModuleFunctions,
    /// The module of `PATTERN:mod:MODULE` is empty, too long, or has a
    /// character outside `[A-Za-z0-9_-*?]` (after an optional `!`).
    ModuleName,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Empty => f.write_str("is empty"),
            Problem::TooLong { len, max } => {
                write!(f, "is {len} bytes long, more than the limit of {max}")
            }
            Problem::TooMany { count, max } => {
                write!(f, "has {count} entries, more than the limit of {max}")
            }
            Problem::PathSeparator => f.write_str("contains a path separator '/'"),
            Problem::Newline => f.write_str("contains a newline"),
            Problem::Nul => f.write_str("contains a NUL character"),
            Problem::Whitespace => f.write_str("contains whitespace"),
            Problem::ControlCharacter => f.write_str("contains a control character"),
            Problem::NonAscii => f.write_str("contains a non-ASCII character"),
            Problem::Disallowed(c) => write!(f, "contains {c:?}, which is not allowed here"),
            Problem::FilterCommand => f.write_str(
                "carries a set_ftrace_filter command; only the module form \
                 PATTERN:mod:MODULE is accepted (other commands outlive the trace)",
            ),
            Problem::ModuleFunctions => f.write_str(
                "has no function pattern before :mod: (use * for every function of the module)",
            ),
            Problem::ModuleName => write!(
                f,
                "names no valid module after :mod: (1 to {MAX_MODULE_LEN} characters of \
                 A-Z a-z 0-9 _ - * ?, after an optional !)"
            ),
        }
    }
}

/// A request value that failed validation: which field, what was wrong,
/// and (an excerpt of) the value.
///
/// Displays as e.g. `function_filter[2]: contains a newline (got "a\nb")`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// The offending field.
    pub field: Field,
    /// What is wrong with it.
    pub problem: Problem,
    /// The value, cut to its first 64 characters (empty for list-length
    /// errors).
    pub value: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)?;
        if matches!(self.problem, Problem::Empty | Problem::TooMany { .. }) {
            return Ok(());
        }
        let cut: String = self.value.chars().take(QUOTE_LEN).collect();
        let ellipsis = if cut.len() < self.value.len() {
            "..."
        } else {
            ""
        };
        write!(f, " (got {cut:?}{ellipsis})")
    }
}

impl std::error::Error for ValidationError {}

/// Which whitelist a value is checked against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Name,
    Pattern,
}

/// Checks one value; the first problem found wins, scanning left to right
/// after the length checks.
fn check(field: Field, value: &str, kind: Kind) -> Result<(), ValidationError> {
    let max = match kind {
        Kind::Name => MAX_NAME_LEN,
        Kind::Pattern => MAX_PATTERN_LEN,
    };
    let problem = if value.is_empty() {
        Some(Problem::Empty)
    } else if value.len() > max {
        Some(Problem::TooLong {
            len: value.len(),
            max,
        })
    } else {
        value
            .chars()
            .find_map(|c| char_problem(c, kind))
            .or_else(|| match kind {
                Kind::Pattern => command_problem(value),
                Kind::Name => None,
            })
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(ValidationError {
            field,
            problem,
            value: value.to_owned(),
        }),
    }
}

fn char_problem(c: char, kind: Kind) -> Option<Problem> {
    match c {
        '\0' => Some(Problem::Nul),
        '\n' | '\r' => Some(Problem::Newline),
        '/' => Some(Problem::PathSeparator),
        c if c.is_whitespace() => Some(Problem::Whitespace),
        c if c.is_control() => Some(Problem::ControlCharacter),
        c if !c.is_ascii() => Some(Problem::NonAscii),
        c if kind == Kind::Name && !(c.is_ascii_alphanumeric() || c == '_' || c == '-') => {
            Some(Problem::Disallowed(c))
        }
        _ => None,
    }
}

/// What is wrong with the `:command` part of a pattern, if it has one
/// (its characters already passed [`char_problem`]).
fn command_problem(pattern: &str) -> Option<Problem> {
    let (functions, command) = pattern.split_once(':')?;
    let Some(module) = command.strip_prefix("mod:") else {
        return Some(Problem::FilterCommand);
    };
    if functions.is_empty() || functions == "!" {
        return Some(Problem::ModuleFunctions);
    }
    let name = module.strip_prefix('!').unwrap_or(module);
    let valid = (1..=MAX_MODULE_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'*' | b'?'));
    (!valid).then_some(Problem::ModuleName)
}

fn check_list(
    list_field: Field,
    item_field: fn(usize) -> Field,
    values: &[String],
) -> Result<(), ValidationError> {
    if values.len() > MAX_PATTERNS {
        return Err(ValidationError {
            field: list_field,
            problem: Problem::TooMany {
                count: values.len(),
                max: MAX_PATTERNS,
            },
            value: String::new(),
        });
    }
    values
        .iter()
        .enumerate()
        .try_for_each(|(i, v)| check(item_field(i), v, Kind::Pattern))
}

/// A validated `TraceRequest`: safe to write into tracefs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSpec {
    tracer: String,
    function_filter: Vec<String>,
    graph_function_filter: Vec<String>,
}

impl TraceSpec {
    /// Validates a request (see the module docs for the rules). The first
    /// offending field, in the order tracer, function_filter,
    /// graph_function_filter, is reported.
    pub fn from_request(request: &debug::TraceRequest) -> Result<TraceSpec, ValidationError> {
        check(Field::Tracer, &request.tracer, Kind::Name)?;
        check_list(
            Field::FunctionFilters,
            Field::FunctionFilter,
            &request.function_filter,
        )?;
        check_list(
            Field::GraphFunctionFilters,
            Field::GraphFunctionFilter,
            &request.graph_function_filter,
        )?;
        Ok(TraceSpec {
            tracer: request.tracer.clone(),
            function_filter: request.function_filter.clone(),
            graph_function_filter: request.graph_function_filter.clone(),
        })
    }

    /// The tracer name.
    pub fn tracer(&self) -> &str {
        &self.tracer
    }

    /// The function filter patterns; empty means every function.
    pub fn function_filter(&self) -> &[String] {
        &self.function_filter
    }

    /// The graph function filter patterns; empty means set_graph_function
    /// is left alone.
    pub fn graph_function_filter(&self) -> &[String] {
        &self.graph_function_filter
    }
}

/// A validated tracefs instance name: `[A-Za-z0-9_-]`, 1 to
/// [`MAX_NAME_LEN`] bytes, so `instances/<name>` is always one directory
/// right below `instances/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceName(String);

impl InstanceName {
    /// Validates an instance name; errors name [`Field::Instance`].
    pub fn new(name: &str) -> Result<InstanceName, ValidationError> {
        check(Field::Instance, name, Kind::Name)?;
        Ok(InstanceName(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
