//! The direct side of the etcd scenarios (`update-etcd`,
//! `heartbeat-etcd`): closed loops sending the fenced compare-and-swap
//! transaction the curator sends for one record update straight to etcd
//! with `etcd-client` (compare the record key's mod revision and the
//! leader's election key's create revision, put the record; on a lost race
//! the failure branch reads the key and the loop tries again with what it
//! read, as the curator does, but without the curator's read before the
//! first attempt: each loop keeps the revision its last transaction
//! returned). That is etcd's own rate for fenced updates of the same keys
//! at the same concurrency. And the report comparing the two sides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client as ec;
use etcd_client::proto::PbTxnOpResponse;

use super::rounds::{self, ClientOutcome, Totals, Window};
use super::util::{Context, RPC_TIMEOUT, Result, ms, print_table, row};

/// The daemon's default election prefix (`--election-prefix`).
const ELECTION_PREFIX: &str = "/metropolis/curator/leader/";

/// The flags of the alternating windows, shared by the etcd scenarios.
#[derive(clap::Args, Debug, Clone)]
pub struct WindowArgs {
    /// etcd clients (gRPC connections) the direct loops are spread over.
    #[arg(long, default_value_t = 8)]
    pub etcd_clients: usize,
    /// Measured duration of each window.
    #[arg(long, default_value_t = 4)]
    pub seconds: u64,
    /// Windows per side, alternating (curator, etcd, curator, ...).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured warm-up before each window.
    #[arg(long, default_value_t = 1)]
    pub warmup_seconds: u64,
    /// The daemon's --lease-ttl (seconds).
    #[arg(long, default_value_t = 10)]
    pub lease_ttl: u64,
}

/// What a direct loop writes: a record's key and its value as stored.
#[derive(Clone)]
pub struct Record {
    key: Vec<u8>,
    value: Vec<u8>,
}

/// The leader's election key and the revision it was created at.
#[derive(Clone)]
pub struct Election {
    key: Vec<u8>,
    create_revision: i64,
}

/// One closed loop of fenced compare-and-swap updates of `record`, straight
/// to etcd.
async fn etcd_loop(
    mut kv: ec::KvClient,
    record: Record,
    election: Election,
    from: Instant,
    until: Instant,
) -> ClientOutcome {
    let mut out = ClientOutcome::default();
    let mut known: Option<i64> = None;
    while Instant::now() < until {
        let start = Instant::now();
        let result = tokio::time::timeout(
            RPC_TIMEOUT,
            fenced_update(&mut kv, &record, &election, &mut known),
        )
        .await;
        let end = Instant::now();
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no answer within {RPC_TIMEOUT:?}")),
        };
        if out.record(start, end, from, until, failure) {
            break;
        }
    }
    out
}

/// One update: fenced compare-and-swap transactions until one succeeds
/// (a lost race reads the key's revision in the failure branch). `known`
/// is the key's mod revision as last seen, read first when unknown.
async fn fenced_update(
    kv: &mut ec::KvClient,
    record: &Record,
    election: &Election,
    known: &mut Option<i64>,
) -> std::result::Result<(), String> {
    if known.is_none() {
        let got = kv
            .get(record.key.clone(), None)
            .await
            .map_err(|e| e.to_string())?;
        *known = got.0.kvs.first().map(|kv| kv.mod_revision);
    }
    for _ in 0..1000 {
        let revision = known.ok_or("the record's key is gone")?;
        let txn = ec::Txn::new()
            .when([
                ec::Compare::mod_revision(record.key.clone(), ec::CompareOp::Equal, revision),
                ec::Compare::create_revision(
                    election.key.clone(),
                    ec::CompareOp::Equal,
                    election.create_revision,
                ),
            ])
            .and_then([ec::TxnOp::put(
                record.key.clone(),
                record.value.clone(),
                None,
            )])
            .or_else([
                ec::TxnOp::get(record.key.clone(), None),
                ec::TxnOp::get(election.key.clone(), None),
            ]);
        let response = kv.txn(txn).await.map_err(|e| e.to_string())?.0;
        if response.succeeded {
            *known = response.header.map(|h| h.revision);
            return Ok(());
        }
        let mut ranges = response.responses.into_iter().map(|r| match r.response {
            Some(PbTxnOpResponse::ResponseRange(range)) => Ok(range.kvs),
            _ => Err("the failure branch returned no range".to_string()),
        });
        let record_kvs = ranges.next().ok_or("no result for the record's key")??;
        let election_kvs = ranges.next().ok_or("no result for the election key")??;
        if !election_kvs
            .iter()
            .any(|kv| kv.create_revision == election.create_revision)
        {
            return Err("the fence failed: the election key changed".into());
        }
        *known = record_kvs.first().map(|kv| kv.mod_revision);
    }
    Err("1000 lost races in a row".into())
}

/// The leader's election key: the oldest key under the election prefix.
pub async fn leader_key(kv: &mut ec::KvClient) -> Result<Election> {
    let got = kv
        .get(
            ELECTION_PREFIX,
            Some(
                ec::GetOptions::new()
                    .with_prefix()
                    .with_sort(ec::SortTarget::Create, ec::SortOrder::Ascend),
            ),
        )
        .await
        .context(|| "reading the election prefix".into())?;
    let first = got
        .0
        .kvs
        .first()
        .ok_or("no election key: the daemon does not lead")?;
    Ok(Election {
        key: first.key.clone(),
        create_revision: first.create_revision,
    })
}

/// Each key's value as stored; `what(i)` names key i in errors.
pub async fn stored(
    kv: &mut ec::KvClient,
    keys: Vec<Vec<u8>>,
    what: impl Fn(usize) -> String,
) -> Result<Vec<Record>> {
    let mut records = Vec::with_capacity(keys.len());
    for (i, key) in keys.into_iter().enumerate() {
        let got = kv
            .get(key.clone(), None)
            .await
            .context(|| format!("reading {}", what(i)))?;
        let value = got
            .0
            .kvs
            .first()
            .map(|kv| kv.value.clone())
            .ok_or_else(|| format!("{} is not in etcd", what(i)))?;
        records.push(Record { key, value });
    }
    Ok(records)
}

/// `n` etcd clients (gRPC connections) to `url`.
pub async fn connect(url: &str, n: usize) -> Result<Vec<ec::KvClient>> {
    let mut clients = Vec::new();
    for _ in 0..n.max(1) {
        let client = ec::Client::connect([url.to_string()], None)
            .await
            .context(|| format!("connecting to etcd at {url}"))?;
        clients.push(client.kv_client());
    }
    Ok(clients)
}

/// One direct window: loop i updates record i mod N on etcd client
/// i mod M. CPU is etcd's.
pub async fn etcd_window(
    kvs: &[ec::KvClient],
    records: &Arc<Vec<Record>>,
    election: &Election,
    clients: usize,
    warmup: Duration,
    seconds: Duration,
    etcd_pid: u32,
) -> Result<Window> {
    rounds::measure(warmup, seconds, etcd_pid, |from, until| async move {
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let kv = kvs[i % kvs.len()].clone();
                let record = records[i % records.len()].clone();
                tokio::spawn(etcd_loop(kv, record, election.clone(), from, until))
            })
            .collect();
        rounds::join(tasks, "an etcd loop").await
    })
    .await
}

/// What the two sides of a run measured, and how to name them.
pub struct Comparison<'a> {
    /// The scenario's name, first word of the RESULT line.
    pub scenario: &'a str,
    /// What is counted, e.g. "updates/s".
    pub unit: &'a str,
    /// The table's title.
    pub title: String,
    /// `key=value` fields of the RESULT line after the scenario's name.
    pub settings: String,
    /// The curator's windows.
    pub curator: Vec<Window>,
    /// The direct windows.
    pub etcd: Vec<Window>,
}

impl Comparison<'_> {
    /// Prints the table and the RESULT line; fails when a side completed
    /// nothing.
    pub fn report(self) -> Result<()> {
        let (ratios, median) = rounds::round_ratios(&self.curator, &self.etcd);
        let (c, e) = (Totals::of(self.curator), Totals::of(self.etcd));
        let unit = self.unit;
        let mut rows = Vec::new();
        rounds::server_rows(&mut rows, "curator", unit, &c);
        rounds::server_rows(&mut rows, "etcd direct", unit, &e);
        rows.push(row(
            &format!("curator/etcd {unit}"),
            format!("{:.3}", rounds::ratio(c.rps, e.rps)),
        ));
        rows.push(row(
            "curator/etcd per round",
            rounds::format_ratios(&ratios),
        ));
        rows.push(row("curator/etcd, median round", format!("{median:.3}")));
        rows.push(row(
            "curator p99 / etcd p99",
            format!("{:.2}", rounds::ratio(c.p99_us as f64, e.p99_us as f64)),
        ));
        print_table(&self.title, &rows);
        for (name, s) in [("curator", &c), ("etcd direct", &e)] {
            if let Some(why) = &s.first_error {
                println!("  {name}: first error: {why}");
            }
        }
        println!(
            "RESULT {} {} curator_rps={:.0} curator_p50_ms={} curator_p99_ms={} \
             curator_errors={} etcd_rps={:.0} etcd_p50_ms={} etcd_p99_ms={} etcd_errors={} \
             ratio_rps={:.3} ratio_median={median:.3} ratio_p99={:.2} daemon_cpu_cores={:.2} \
             etcd_cpu_cores_direct={:.2}",
            self.scenario,
            self.settings,
            c.rps,
            ms(c.p50_us),
            ms(c.p99_us),
            c.errors,
            e.rps,
            ms(e.p50_us),
            ms(e.p99_us),
            e.errors,
            rounds::ratio(c.rps, e.rps),
            rounds::ratio(c.p99_us as f64, e.p99_us as f64),
            c.server_cores,
            e.server_cores,
        );
        if c.requests == 0 || e.requests == 0 {
            return Err("a side completed no update in its windows".into());
        }
        Ok(())
    }
}

/// Prints one round's figures.
pub fn print_round(round: usize, unit: &str, curator: &Window, etcd: &Window) {
    println!(
        "  round {round}: curator {:.0} {unit}, etcd {:.0} {unit}, ratio {:.3}",
        curator.rps(),
        etcd.rps(),
        rounds::ratio(curator.rps(), etcd.rps())
    );
}
