//! `metroctl logs | trace | load-image | kubeconfig`: clients of a node's
//! NodeDebugService (plain HTTP/2 on `--debug-endpoint`, no credentials).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::StreamExt;
use metropolis_proto::prelude::common::{self, log_entry, log_filter};
use metropolis_proto::prelude::debug::{self, node_debug_service_client::NodeDebugServiceClient};
use metropolis_transport::grpc::Channel;
use tokio::io::AsyncReadExt;

mod images;
mod rename;

pub use images::{ImagesArgs, images};

use super::exit::usage;
use super::output::{Format, emit, render};
use super::{CliError, status_error};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;

/// Largest `--chunk-size`: the server accepts messages up to 4 MiB.
pub const MAX_CHUNK_SIZE: usize = 4 * 1024 * 1024 - 1024;

/// `metroctl logs`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    metroctl logs                      every entry of the node, all DNs\n  \
    metroctl logs --list               the DNs that hold entries, with counts\n  \
    metroctl logs root.curator -f      the curator's entries, then new ones\n  \
    metroctl logs root -r --min-severity warning")]
pub struct LogsArgs {
    /// The DN to read, e.g. `root` or `root.curator` (see --list). Omitted:
    /// the whole tree, every DN. A DN nothing has logged to yet is empty
    /// (with -f, its first entries are shown as they come).
    dn: Option<String>,
    /// Include the DN's children (the whole subtree). Implied without a DN.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// List the DNs that hold entries (each with its number of entries)
    /// instead of printing entries.
    #[arg(long, conflicts_with_all = ["follow", "tail", "json", "raw", "leveled", "min_severity"])]
    list: bool,
    /// Only the last N entries of the backlog (0: none). Default: all.
    #[arg(long, value_name = "N")]
    tail: Option<u64>,
    /// Keep streaming new entries until interrupted.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only leveled entries at this severity or above.
    #[arg(long, value_enum, value_name = "S")]
    min_severity: Option<SeverityArg>,
    /// Only raw entries (unstructured output lines).
    #[arg(long, conflicts_with_all = ["leveled", "min_severity"])]
    raw: bool,
    /// Only leveled entries.
    #[arg(long)]
    leveled: bool,
    /// One JSON object per entry and line.
    #[arg(long)]
    json: bool,
}

impl LogsArgs {
    /// Whether it streams new entries until interrupted (`-f`).
    pub fn follows(&self) -> bool {
        self.follow
    }
}

/// A minimum severity.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SeverityArg {
    /// INFO and above (everything).
    Info,
    /// WARNING and above.
    Warning,
    /// ERROR and above.
    Error,
    /// FATAL only.
    Fatal,
}

impl SeverityArg {
    fn proto(self) -> common::LeveledLogSeverity {
        match self {
            SeverityArg::Info => common::LeveledLogSeverity::Info,
            SeverityArg::Warning => common::LeveledLogSeverity::Warning,
            SeverityArg::Error => common::LeveledLogSeverity::Error,
            SeverityArg::Fatal => common::LeveledLogSeverity::Fatal,
        }
    }
}

/// `metroctl trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The kernel tracer (see the node's tracefs available_tracers), e.g.
    /// `nop`, `function`, `function_graph`.
    #[arg(long)]
    tracer: String,
    /// Function filter pattern (`*` wildcards; `PATTERN:mod:MODULE` for
    /// the functions of one kernel module; repeatable). None: all.
    #[arg(long = "filter", value_name = "PATTERN")]
    filters: Vec<String>,
    /// Graph function filter for function_graph (repeatable).
    #[arg(long = "graph", value_name = "PATTERN")]
    graph: Vec<String>,
}

/// `metroctl load-image`.
#[derive(Args, Debug)]
pub struct LoadImageArgs {
    /// An uncompressed image tarball (Docker v1.1/v1.2 archive or OCI image
    /// layout), or `-` for standard input. A compressed one (gzip, zstd,
    /// xz, bzip2) is refused before anything is sent: decompress it first.
    /// Prints the names of the images loaded, as the archive names them
    /// (RepoTags, or the OCI index's annotations), normalised.
    file: String,
    /// Bytes per streamed message.
    #[arg(long, default_value_t = 1024 * 1024, value_name = "BYTES")]
    chunk_size: usize,
    /// Name the images of an OCI layout that its index.json leaves
    /// unnamed (org.opencontainers.image.ref.name a bare tag such as v2,
    /// or none), as `ctr images import --base-name` does: REPOSITORY
    /// names each REPOSITORY:<its tag> (latest without one);
    /// REPOSITORY:TAG names the one unnamed image. Images with a full
    /// name keep it.
    #[arg(long, value_name = "REF")]
    name: Option<String>,
}

/// `metroctl kubeconfig`.
#[derive(Args, Debug)]
pub struct KubeconfigArgs {
    /// The Kubernetes user (the certificate's common name).
    #[arg(long)]
    id: String,
    /// A Kubernetes group (an organization of the certificate; repeatable).
    #[arg(long = "group", value_name = "G")]
    groups: Vec<String>,
    /// Write the kubeconfig to FILE (mode 0600: it holds a private key)
    /// instead of standard output (where `-o json` prints it as JSON).
    /// FILE must not exist yet; it is written once the node answered.
    #[arg(short = 'f', long, value_name = "FILE")]
    file: Option<PathBuf>,
}

/// `result` of a debug command, its failure explained when `endpoint`
/// turns out to speak TLS: a curator port (`--listen`, `--agent-listen`)
/// given as `--debug-endpoint`, which answers plain HTTP/2 with TLS
/// records that the client reads as a broken connection or a bad frame.
/// Asked only after a failure, with one connection and one read.
pub async fn on_a_tls_port(endpoint: &str, result: Result<(), CliError>) -> Result<(), CliError> {
    let Err(e) = result else {
        return Ok(());
    };
    let exit = super::exit::exit_of(e.as_ref());
    if !matches!(exit, super::Exit::Failure | super::Exit::Unavailable)
        || !speaks_tls(endpoint).await
    {
        return Err(e);
    }
    Err(super::failed(
        super::Exit::Unavailable,
        format!(
            "{endpoint} speaks TLS: it is a curator port (metropolisd --listen or \
             --agent-listen), not the debug service; give --debug-endpoint the daemon's \
             --debug-listen address (default 127.0.0.1:7837) ({e})"
        ),
    ))
}

/// Whether the server at `endpoint` answers the HTTP/2 preface with a
/// TLS record (an alert or a handshake: content type 21 or 22, version
/// 3.x), within 2 s.
async fn speaks_tls(endpoint: &str) -> bool {
    use tokio::io::AsyncWriteExt;
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(endpoint).await.ok()?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        Some(matches!(head, [21 | 22, 3]))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Some(true))
    )
}

/// A channel to the debug listener at `endpoint` (plain HTTP/2).
async fn channel(endpoint: &str) -> Result<Channel, CliError> {
    connect::plain(&TokioRuntime::shared(), endpoint)
        .await
        .map_err(|e| {
            super::failed(
                super::Exit::Unavailable,
                format!("{e} (is metropolisd running with --debug-listen {endpoint}?)"),
            )
        })
}

async fn client(endpoint: &str) -> Result<NodeDebugServiceClient<Channel>, CliError> {
    let channel = channel(endpoint).await?;
    Ok(
        NodeDebugServiceClient::with_origin(channel, Channel::origin())
            .max_decoding_message_size(8 * 1024 * 1024),
    )
}

/// The request `metroctl logs` sends.
pub fn logs_request(args: &LogsArgs) -> debug::GetLogsRequest {
    use debug::get_logs_request::{BacklogMode, StreamMode};
    let mut filters = Vec::new();
    let mut filter = |f| filters.push(common::LogFilter { filter: Some(f) });
    if args.recursive || args.dn.is_none() || args.list {
        filter(log_filter::Filter::WithChildren(Default::default()));
    }
    if args.raw {
        filter(log_filter::Filter::OnlyRaw(Default::default()));
    }
    if args.leveled {
        filter(log_filter::Filter::OnlyLeveled(Default::default()));
    }
    if let Some(s) = args.min_severity {
        filter(log_filter::Filter::LeveledWithMinimumSeverity(
            log_filter::LeveledWithMinimumSeverity {
                minimum: s.proto() as i32,
            },
        ));
    }
    let (backlog_mode, backlog_count) = match args.tail {
        None => (BacklogMode::BacklogAll, 0),
        Some(0) => (BacklogMode::BacklogDisable, 0),
        Some(n) => (
            BacklogMode::BacklogCount,
            i64::try_from(n).unwrap_or(i64::MAX),
        ),
    };
    debug::GetLogsRequest {
        // Empty: the root of the tree.
        dn: args.dn.clone().unwrap_or_default(),
        filters,
        backlog_mode: backlog_mode as i32,
        backlog_count,
        stream_mode: if args.follow {
            StreamMode::StreamUnbuffered
        } else {
            StreamMode::StreamDisable
        } as i32,
    }
}

/// RFC 3339 UTC time of a protobuf timestamp, microsecond precision.
pub fn rfc3339(ts: &prost_types::Timestamp) -> String {
    let days = ts.seconds.div_euclid(86_400);
    let secs = ts.seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ts.nanos / 1000
    )
}

fn severity_letter(s: i32) -> &'static str {
    match common::LeveledLogSeverity::try_from(s) {
        Ok(common::LeveledLogSeverity::Info) => "I",
        Ok(common::LeveledLogSeverity::Warning) => "W",
        Ok(common::LeveledLogSeverity::Error) => "E",
        Ok(common::LeveledLogSeverity::Fatal) => "F",
        _ => "?",
    }
}

/// One entry as text lines (leveled: one per message line) or one JSON
/// object.
pub fn format_entry(entry: &common::LogEntry, format: Format) -> String {
    let value = match (&entry.kind, format.structured()) {
        (Some(log_entry::Kind::Leveled(l)), false) => {
            let ts = l.timestamp.as_ref().map(rfc3339).unwrap_or_default();
            let prefix = format!(
                "{ts} {} {} {}]",
                severity_letter(l.severity),
                entry.dn,
                l.location
            );
            let lines: Vec<String> = l
                .lines
                .iter()
                .map(|line| format!("{prefix} {line}"))
                .collect();
            return lines.join("\n");
        }
        (Some(log_entry::Kind::Raw(r)), false) => return format!("{} R] {}", entry.dn, r.data),
        (Some(log_entry::Kind::Leveled(l)), true) => serde_json::json!({
            "dn": entry.dn,
            "kind": "leveled",
            "timestamp": l.timestamp.as_ref().map(rfc3339).unwrap_or_default(),
            "severity": common::LeveledLogSeverity::try_from(l.severity)
                .map(|s| s.as_str_name())
                .unwrap_or("INVALID"),
            "location": l.location,
            "lines": l.lines,
        }),
        (Some(log_entry::Kind::Raw(r)), true) => serde_json::json!({
            "dn": entry.dn,
            "kind": "raw",
            "data": r.data,
            "original_length": r.original_length,
        }),
        (None, false) => return format!("{} ?] (entry without payload)", entry.dn),
        (None, true) => serde_json::json!({ "dn": entry.dn, "kind": null }),
    };
    render(&value, format)
}

/// `metroctl logs`.
pub async fn logs(endpoint: &str, args: LogsArgs, format: Format) -> Result<(), CliError> {
    if args.list {
        return list_dns(endpoint, &args, format).await;
    }
    let request = logs_request(&args);
    let mut stream = client(endpoint)
        .await?
        .get_logs(request)
        .await
        .map_err(status_error)?
        .into_inner();
    while let Some(response) = stream.next().await {
        let response = response.map_err(status_error)?;
        for entry in response
            .backlog_entries
            .iter()
            .chain(&response.stream_entries)
        {
            outln!("{}", format_entry(entry, format.or_json(args.json)));
        }
    }
    Ok(())
}

/// `metroctl logs --list`: the DNs holding entries (in the subtree of the
/// DN given, else in the whole tree), each with its number of entries,
/// from one backlog read.
async fn list_dns(endpoint: &str, args: &LogsArgs, format: Format) -> Result<(), CliError> {
    let mut stream = client(endpoint)
        .await?
        .get_logs(logs_request(args))
        .await
        .map_err(status_error)?
        .into_inner();
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    while let Some(response) = stream.next().await {
        for entry in response.map_err(status_error)?.backlog_entries {
            *counts.entry(entry.dn).or_default() += 1;
        }
    }
    if format.structured() {
        let list: Vec<_> = counts
            .iter()
            .map(|(dn, n)| serde_json::json!({ "dn": dn, "entries": n }))
            .collect();
        emit(&serde_json::Value::Array(list), format);
    } else {
        let rows: Vec<Vec<String>> = counts
            .iter()
            .map(|(dn, n)| vec![dn.clone(), n.to_string()])
            .collect();
        super::output::print_table(&["DN", "ENTRIES"], &rows);
    }
    Ok(())
}

/// `metroctl trace`: prints lines until Ctrl-C, then cancels the call (the
/// server restores tracefs).
pub async fn trace(endpoint: &str, args: TraceArgs) -> Result<(), CliError> {
    let request = debug::TraceRequest {
        tracer: args.tracer,
        function_filter: args.filters,
        graph_function_filter: args.graph,
    };
    let busy = |status: tonic::Status| {
        // Older nodes do not name the flag themselves.
        let hint = status.code() == tonic::Code::FailedPrecondition
            && status.message().contains("already in progress")
            && !status.message().contains("--trace-instances");
        let e = status_error(status);
        if !hint {
            return e;
        }
        super::failed(
            super::exit::exit_of(e.as_ref()),
            format!(
                "{e} (the kernel's global trace buffer is taken by another trace: wait for it \
                 to end, or restart metropolisd with --trace-instances so that each trace gets \
                 a tracefs instance of its own)"
            ),
        )
    };
    let mut stream = client(endpoint)
        .await?
        .trace(request)
        .await
        .map_err(busy)?
        .into_inner();
    eprintln!("tracing; Ctrl-C stops (the node then restores tracefs)");
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(event)) => outln!("{}", event.raw_line),
                Some(Err(status)) => return Err(busy(status)),
                None => return Ok(()),
            },
            _ = &mut ctrl_c => {
                drop(stream);
                // Let the connection send the cancellation before exiting.
                tokio::time::sleep(Duration::from_millis(200)).await;
                eprintln!("trace stopped");
                return Ok(());
            }
        }
    }
}

/// Progress of an upload on standard error (indicatif): bytes, rate and,
/// with a known total, a bar, percentage and ETA. Drawn only when stderr
/// is a terminal; scripts and logs get the final line on stdout only.
fn progress_bar(total: Option<u64>) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = match total {
        Some(_) => "{bar:30} {bytes}/{total_bytes} ({percent}%), {binary_bytes_per_sec}, ETA {eta}",
        None => "{spinner} {bytes}, {binary_bytes_per_sec}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// The compression whose magic number `head` (the first bytes of a file)
/// starts with, and the command that undoes it.
pub fn compression_of(head: &[u8]) -> Option<(&'static str, &'static str)> {
    const MAGICS: [(&[u8], &str, &str); 4] = [
        (&[0x1f, 0x8b], "gzip", "gunzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", "unzstd"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz", "unxz"),
        (b"BZh", "bzip2", "bunzip2"),
    ];
    MAGICS
        .iter()
        .find(|(magic, _, _)| head.starts_with(magic))
        .map(|&(_, name, tool)| (name, tool))
}

/// Reads up to `size` bytes (fewer only at the end of the input).
async fn read_chunk(
    reader: &mut (dyn tokio::io::AsyncRead + Unpin + Send),
    size: usize,
) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size];
    let mut filled = 0;
    while filled < size {
        match reader.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The names of the images of an archive, read while it streams (by the
/// same validator the node runs): normalised, once each, in archive
/// order. None if the archive is not one the validator accepts (the
/// node then says why).
struct ImageNames(Option<metropolis_archive::ArchiveValidator>);

impl ImageNames {
    fn new() -> ImageNames {
        ImageNames(Some(metropolis_archive::ArchiveValidator::new(
            Default::default(),
        )))
    }

    fn feed(&mut self, chunk: bytes::Bytes) {
        if let Some(v) = self.0.as_mut() {
            if v.handle_data(chunk).is_err() {
                self.0 = None;
                return;
            }
            while v.poll_output().is_some() {}
        }
    }

    fn finish(self) -> Option<Vec<String>> {
        let plan = self.0?.handle_eof().ok()?;
        let mut names: Vec<String> = Vec::new();
        for name in plan.images.into_iter().filter_map(|i| i.name) {
            let name = metropolis_archive::normalize_reference(&name).unwrap_or(name);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Some(names)
    }
}

/// `metroctl load-image`.
pub async fn load_image(
    endpoint: &str,
    args: LoadImageArgs,
    format: Format,
) -> Result<(), CliError> {
    if args.chunk_size == 0 || args.chunk_size > MAX_CHUNK_SIZE {
        return Err(usage(format!(
            "--chunk-size: {} is out of range 1..={MAX_CHUNK_SIZE}",
            args.chunk_size
        )));
    }
    let mut renamer = args
        .name
        .as_deref()
        .map(rename::NameArg::parse)
        .transpose()?
        .map(rename::Renamer::new);
    let (mut reader, total): (Box<dyn tokio::io::AsyncRead + Unpin + Send>, Option<u64>) =
        if args.file == "-" {
            (Box::new(tokio::io::stdin()), None)
        } else {
            let path = Path::new(&args.file);
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| usage(format!("FILE {}: {e}", path.display())))?;
            let len = file.metadata().await.ok().map(|m| m.len());
            (Box::new(file), len)
        };
    let name = args.file.clone();
    // The first chunk is read before connecting: a compressed tarball is
    // refused before anything is sent.
    let first = read_chunk(reader.as_mut(), args.chunk_size)
        .await
        .map_err(|e| usage(format!("FILE {name}: {e}")))?;
    if let Some((kind, tool)) = compression_of(&first) {
        let how = if name == "-" {
            format!("`{tool} -c FILE | metroctl load-image -`")
        } else {
            format!(
                "`{tool} -k {name}` and load the result, or `{tool} -c {name} | metroctl load-image -`"
            )
        };
        return Err(usage(format!(
            "FILE {name}: the archive is compressed ({kind}): decompress it first ({how}); the \
             node takes an uncompressed tarball"
        )));
    }
    let (tx, rx) = futures::channel::mpsc::channel::<debug::ImagePart>(4);
    let chunk_size = args.chunk_size;
    // The reader runs beside the call, so a refused upload ends the call
    // (and this loop) instead of waiting for the whole file.
    let reader_task = tokio::spawn(async move {
        let mut tx = tx;
        let mut names = ImageNames::new();
        let progress = progress_bar(total);
        let mut sent = 0u64;
        let mut next = Some(first);
        loop {
            let buf = match next.take() {
                Some(buf) => buf,
                None => read_chunk(reader.as_mut(), chunk_size)
                    .await
                    .map_err(|e| -> CliError { usage(format!("FILE {name}: {e}")) })?,
            };
            let eof = buf.is_empty();
            let len = buf.len() as u64;
            let buf = match renamer.as_mut() {
                // The end marker, held back until index.json was named.
                Some(r) if eof => {
                    let tail = r.finish()?;
                    if r.named == Some(0) {
                        eprintln!(
                            "metroctl: --name: every image of the archive has a full name \
                             already; --name named none"
                        );
                    }
                    tail
                }
                Some(r) => r.feed(&buf)?,
                None => buf,
            };
            if !buf.is_empty() {
                sent += buf.len() as u64;
                let data = bytes::Bytes::from(buf);
                names.feed(data.clone());
                use futures::SinkExt;
                if tx.send(debug::ImagePart { data_part: data }).await.is_err() {
                    // The call ended early; its status says why.
                    progress.abandon();
                    return Ok((sent, None));
                }
            }
            if eof {
                progress.finish();
                return Ok((sent, names.finish()));
            }
            progress.inc(len);
        }
    });
    let result = client(endpoint).await?.load_image(rx).await;
    let (sent, names) = match reader_task.await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(e),
        Err(e) => return Err(format!("reader task failed: {e}").into()),
    };
    result.map_err(|status| {
        // Older nodes do not name the flag themselves.
        let exists = status.code() == tonic::Code::AlreadyExists
            && !status.message().contains("--image-replace-tags");
        let e = status_error(status);
        if !exists {
            return e;
        }
        super::failed(
            super::exit::exit_of(e.as_ref()),
            format!(
                "{e} (the node keeps an image name's first image: to load over it, restart \
                 metropolisd with --image-replace-tags and run this again)"
            ),
        )
    })?;
    let names = names.unwrap_or_default();
    if format.structured() {
        emit(
            &serde_json::json!({ "loaded": true, "images": names, "bytes": sent }),
            format,
        );
    } else if names.is_empty() {
        outln!("image loaded ({sent} bytes)");
    } else {
        for name in &names {
            outln!("loaded {name}");
        }
        outln!("{} image(s) loaded ({sent} bytes)", names.len());
    }
    Ok(())
}

/// `metroctl kubeconfig`.
pub async fn kubeconfig(
    endpoint: &str,
    args: KubeconfigArgs,
    format: Format,
) -> Result<(), CliError> {
    // Checked before the call: the node issues (and logs) a credential
    // for every call, which a refused write would waste.
    if let Some(path) = &args.file {
        super::machines::check_new_file("-f/--file", path)?;
    }
    let response = client(endpoint)
        .await?
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: args.id,
            groups: args.groups,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    match args.file {
        Some(path) => {
            super::machines::write_private("-f/--file", &path, &response.debug_kubeconfig)?;
            eprintln!("kubeconfig written to {}", path.display());
        }
        // A kubeconfig is YAML already; as JSON it is one object, as
        // `kubectl config view -o json` prints one.
        None if format == Format::Json => {
            let value: serde_json::Value = serde_yaml_ng::from_str(&response.debug_kubeconfig)
                .map_err(|e| format!("the node sent a kubeconfig that is not YAML: {e}"))?;
            emit(&value, format);
        }
        None => {
            use std::io::Write as _;
            if std::io::stdout()
                .write_all(response.debug_kubeconfig.as_bytes())
                .is_err()
            {
                std::process::exit(0);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn compressed_archives_are_told_by_their_magic() {
        assert_eq!(
            compression_of(&[0x1f, 0x8b, 8, 0]),
            Some(("gzip", "gunzip"))
        );
        assert_eq!(
            compression_of(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Some(("zstd", "unzstd"))
        );
        assert_eq!(compression_of(b"BZh91AY"), Some(("bzip2", "bunzip2")));
        assert_eq!(compression_of(b"manifest.json\0\0"), None);
        assert_eq!(compression_of(&[]), None);
    }

    #[test]
    fn image_names_come_from_the_archive() {
        let archive = metropolis_testkit::archives::docker_archive("busybox", "hello");
        let mut names = ImageNames::new();
        for chunk in archive.chunks(700) {
            names.feed(bytes::Bytes::copy_from_slice(chunk));
        }
        assert_eq!(
            names.finish(),
            Some(vec!["docker.io/library/busybox:latest".to_string()])
        );
        let mut garbage = ImageNames::new();
        garbage.feed(bytes::Bytes::from_static(&[7u8; 1024]));
        assert_eq!(garbage.finish(), None);
    }

    #[test]
    fn timestamps_format_as_rfc3339() {
        let ts = |seconds, nanos| prost_types::Timestamp { seconds, nanos };
        assert_eq!(rfc3339(&ts(0, 0)), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(&ts(1_796_010_946, 123_456_789)),
            "2026-11-30T03:55:46.123456Z"
        );
        assert_eq!(rfc3339(&ts(951_782_400, 0)), "2000-02-29T00:00:00.000000Z");
        assert_eq!(rfc3339(&ts(-1, 0)), "1969-12-31T23:59:59.000000Z");
    }
}
