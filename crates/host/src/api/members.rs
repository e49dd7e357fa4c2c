//! Scale-out membership: which instance writes which buckets of a bucketed
//! store, and at which address — so that any instance answers any request,
//! reading locally and sending each write's rows to their bucket's owner.
//!
//! Each instance serving a bucketed store keeps one record with the store's
//! data, `_lance_context/members/<instance>.json` (format in
//! docs/operations.md): its address, the buckets it holds with the epoch of
//! each bucket's shard, when it last renewed the record and for how long a
//! renewal holds (the lease). It is written when the store opens, renewed
//! every third of the lease by a conditional write over the version it wrote
//! last (on object stores that have conditional writes: S3, GCS, Azure; a
//! local directory has none and is overwritten), and deleted when the store
//! closes. A renewal that finds another version (another process publishing
//! under the same instance name) stops publishing and logs an error.
//!
//! The owner of a bucket is the live record (renewed within its lease) that
//! holds it at the highest epoch: a claim of a bucket's shard fences every
//! earlier holder, so the highest epoch is the holder that can still write.
//! The records route; the epochs guarantee: a write sent to an instance
//! that lost the bucket meanwhile is refused there (`not_owner` or
//! `fenced`), never written to the wrong shard.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use lance_context_client::{Added, DeleteMany, Deleted, DeletedMany, ErrorBody};
use lance_context_store::{NoteVersion, NoteWrite};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::OpenStore;
use super::error::{ApiError, status};

/// The notes directory of the records.
const DIR: &str = "members";

/// The header of a request one instance sends another: the receiver writes
/// it locally or refuses it, never sends it on (no loops).
pub const FORWARDED_HEADER: &str = "x-lance-context-forwarded";

/// `--advertise auto`: the server's own listening address.
pub const AUTO_ADDRESS: &str = "auto";

/// The header carrying the sending instance's time (microseconds since the
/// Unix epoch) with rows it sends: the owner's plugin takes it for its
/// defaults, so one request has one time.
pub const NOW_HEADER: &str = "x-lance-context-now";

/// How far the sender's time may be from the receiver's to be taken.
pub(crate) const NOW_SKEW_MICROS: i64 = 10 * 60 * 1_000_000;

/// Records larger than this are not read (a record is a few hundred bytes).
const MAX_RECORD_BYTES: u64 = 64 << 10;
/// Records read at most (instances of one store).
const MAX_RECORDS: usize = 1024;
/// Longest lease a record may claim.
const MAX_LEASE_MS: u64 = 3_600_000;
/// A record whose lease ran out this many leases ago is deleted by the
/// instance that reads it (an instance gone for good: a pod renamed, a
/// host replaced).
const EXPIRED_LEASES: u64 = 20;
/// Largest answer read from a peer.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// How an instance takes part in scale-out (`serve --advertise`).
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The instance's name, unique among the instances of a store (a
    /// Kubernetes pod's name); its record's file name.
    pub instance: String,
    /// Where the other instances reach this one (`http://host:port`).
    pub address: String,
    /// How long a record holds without renewal; renewed every third of it.
    pub lease: Duration,
}

/// Why a scale-out configuration is refused (kind: invalid input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerConfigError {
    /// The instance name is not one.
    #[error(
        "instance name '{0}': use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'"
    )]
    InstanceName(String),
    /// The advertised address is not `http://HOST:PORT`.
    #[error("advertised address '{0}': give http://HOST:PORT, without a path")]
    Address(String),
    /// The lease is under a second.
    #[error("the lease must be at least 1 s")]
    Lease,
}

impl PeerConfig {
    /// Check the name (letters, digits, `.`, `_`, `-`; at most 128) and the
    /// address (`http://HOST:PORT`, no path).
    pub fn new(instance: &str, address: &str, lease: Duration) -> Result<Self, PeerConfigError> {
        if instance.is_empty()
            || instance.len() > 128
            || instance.starts_with('.')
            || !instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(PeerConfigError::InstanceName(instance.to_string()));
        }
        // Instances talk plain HTTP to each other (inside a cluster's
        // network; the tokens are the same as a client's). `auto`: the
        // address the server listens on ([`AUTO_ADDRESS`]).
        match address.strip_prefix("http://") {
            _ if address == AUTO_ADDRESS => {}
            Some(host) if !host.is_empty() && !host.contains('/') => {}
            _ => return Err(PeerConfigError::Address(address.to_string())),
        }
        if lease < Duration::from_secs(1) {
            return Err(PeerConfigError::Lease);
        }
        Ok(Self {
            instance: instance.to_string(),
            address: address.to_string(),
            lease,
        })
    }
}

/// One instance's record (`_lance_context/members/<instance>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Record format (1).
    pub format: u32,
    /// The instance's name (`serve --instance`).
    pub instance: String,
    /// Where it is reached (`serve --advertise`).
    pub address: String,
    /// The store's bucket count.
    pub buckets_total: u32,
    /// The buckets this instance holds, each with its shard's epoch.
    pub buckets: Vec<MemberBucket>,
    /// When the record was written, milliseconds since the Unix epoch.
    pub renewed_at_ms: u64,
    /// How long it holds from then.
    pub lease_ms: u64,
}

/// A bucket an instance holds, and the epoch of its shard's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberBucket {
    /// The bucket.
    pub bucket: u32,
    /// The epoch at which the instance claimed the bucket's shard.
    pub epoch: u64,
}

impl MemberRecord {
    /// Renewed within its lease at `now_ms`, and not renewed in the future
    /// (beyond a minute of clock skew: such a record would never expire).
    fn live_at(&self, now_ms: u64) -> bool {
        self.renewed_at_ms.saturating_add(self.lease_ms) >= now_ms
            && self.renewed_at_ms <= now_ms.saturating_add(60_000)
    }

    /// A record as written by an instance of this build, kept in the file
    /// its instance name gives: anything else is not routed to.
    fn well_formed(&self, file: &str) -> bool {
        self.format == 1
            && file.strip_suffix(".json") == Some(self.instance.as_str())
            && PeerConfig::new(&self.instance, &self.address, Duration::from_secs(1)).is_ok()
            && self.address != AUTO_ADDRESS
            && (1..=MAX_LEASE_MS).contains(&self.lease_ms)
            && (1..=1024).contains(&self.buckets_total)
            && self.buckets.len() <= self.buckets_total as usize
            && self.buckets.iter().all(|b| b.bucket < self.buckets_total)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The owner of each bucket among `records` live at `now_ms`: the holder
/// at the highest epoch (ties: the later renewal).
pub fn owners(records: &[MemberRecord], now_ms: u64) -> BTreeMap<u32, MemberRecord> {
    let mut best: BTreeMap<u32, (u64, u64, &MemberRecord)> = BTreeMap::new();
    for record in records.iter().filter(|r| r.live_at(now_ms)) {
        for held in &record.buckets {
            let rank = (held.epoch, record.renewed_at_ms);
            match best.get(&held.bucket) {
                Some((epoch, renewed, _)) if (*epoch, *renewed) >= rank => {}
                _ => {
                    best.insert(held.bucket, (rank.0, rank.1, record));
                }
            }
        }
    }
    best.into_iter()
        .map(|(bucket, (_, _, record))| (bucket, record.clone()))
        .collect()
}

/// A store's membership on this instance: the renewal task, and the other
/// instances' records as last read.
#[derive(Debug)]
pub(crate) struct Membership {
    config: PeerConfig,
    stop: CancellationToken,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The records read last, and when (re-read after a second, or at once
    /// when a send failed).
    seen: tokio::sync::Mutex<Option<(tokio::time::Instant, Vec<MemberRecord>)>>,
    http: reqwest::Client,
}

/// How long the records read are used before they are read again.
const SEEN_FOR: Duration = Duration::from_secs(1);

impl Membership {
    /// Publish this instance's record for `store` now, then renew it in
    /// the background until [`Self::leave`].
    pub(crate) async fn start(
        config: PeerConfig,
        http: reqwest::Client,
        store: &Arc<OpenStore>,
    ) -> Arc<Self> {
        let membership = Arc::new(Self {
            config,
            stop: CancellationToken::new(),
            task: std::sync::Mutex::new(None),
            seen: tokio::sync::Mutex::new(None),
            http,
        });
        let mut version = None;
        publish(&membership.config, store, &mut version).await;
        let weak: Weak<OpenStore> = Arc::downgrade(store);
        let (stop, config) = (membership.stop.clone(), membership.config.clone());
        let task = tokio::spawn(async move {
            let every = config.lease / 3;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let Some(store) = weak.upgrade() else { return };
                if !publish(&config, &store, &mut version).await {
                    return;
                }
            }
        });
        *membership.task.lock().expect("membership task lock") = Some(task);
        membership
    }

    /// Stop renewing and delete this instance's record (the store closes).
    pub(crate) async fn leave(&self, store: &OpenStore) {
        self.stop.cancel();
        let task = self.task.lock().expect("membership task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let name = record_name(&self.config.instance);
        if let Err(e) = store.named.engine().remove_note(&name).await {
            tracing::warn!(store = store.named.name(), error = %e, "removing the membership record");
        }
    }

    /// Every record of the store (this instance's included), as read at
    /// most a second ago (`fresh`: read now).
    pub(crate) async fn records(
        &self,
        store: &OpenStore,
        fresh: bool,
    ) -> Result<Vec<MemberRecord>, ApiError> {
        let mut seen = self.seen.lock().await;
        if !fresh
            && let Some((at, records)) = seen.as_ref()
            && at.elapsed() < SEEN_FOR
        {
            return Ok(records.clone());
        }
        let engine = store.named.engine();
        let notes = engine
            .list_notes(DIR, ".json", MAX_RECORD_BYTES, MAX_RECORDS)
            .await
            .map_err(|e| {
                ApiError::from_error(&e).with_details(json!({"reading": "membership records"}))
            })?;
        let now = now_ms();
        let mut records = Vec::with_capacity(notes.len());
        for (file, bytes) in notes {
            // Another build's or a hand-made file: not routed to.
            let Ok(record) = serde_json::from_slice::<MemberRecord>(&bytes) else {
                continue;
            };
            if !record.well_formed(&file) {
                continue;
            }
            let gone_since = record
                .renewed_at_ms
                .saturating_add(record.lease_ms.saturating_mul(EXPIRED_LEASES));
            if gone_since < now && record.instance != self.config.instance {
                // Best effort: a live instance writes its record afresh.
                let _ = engine.remove_note(&record_name(&record.instance)).await;
                continue;
            }
            records.push(record);
        }
        *seen = Some((tokio::time::Instant::now(), records.clone()));
        Ok(records)
    }

    /// The live owner of `bucket` other than this instance.
    async fn owner_of(
        &self,
        store: &OpenStore,
        bucket: u32,
        fresh: bool,
    ) -> Result<MemberRecord, ApiError> {
        let records = self.records(store, fresh).await?;
        match owners(&records, now_ms()).remove(&bucket) {
            Some(owner) if owner.instance != self.config.instance => Ok(owner),
            _ => Err(no_owner(store, bucket)),
        }
    }

    /// Every bucket of `buckets` has a live owner (else the error naming
    /// the first that has none): checked before anything of a request is
    /// written.
    pub(crate) async fn check_owners(
        &self,
        store: &OpenStore,
        buckets: impl IntoIterator<Item = u32>,
    ) -> Result<(), ApiError> {
        for bucket in buckets {
            self.owner_of(store, bucket, false).await?;
        }
        Ok(())
    }

    /// Send the input rows `rows` of an add to `bucket`'s owner, as Arrow
    /// IPC; what it added. Tried twice: a failed send reads the records
    /// again (the bucket may have moved).
    pub(crate) async fn send_add(
        &self,
        store: &OpenStore,
        bucket: u32,
        arrow: Vec<u8>,
        auth: Option<&str>,
        now_micros: i64,
    ) -> Result<usize, Sent> {
        let added: Added = self
            .send(store, bucket, "records", auth, |request| {
                request
                    .header("content-type", "application/vnd.apache.arrow.stream")
                    .header(NOW_HEADER, now_micros.to_string())
                    .body(arrow.clone())
            })
            .await?;
        Ok(added.added)
    }

    /// Send deletes of `keys` (all of `bucket`) to its owner.
    pub(crate) async fn send_delete(
        &self,
        store: &OpenStore,
        bucket: u32,
        keys: Vec<String>,
        auth: Option<&str>,
    ) -> Result<Vec<Deleted>, Sent> {
        let body = DeleteMany { keys };
        let deleted: DeletedMany = self
            .send(store, bucket, "delete", auth, |request| request.json(&body))
            .await?;
        Ok(deleted.deleted)
    }

    /// POST to `bucket`'s owner at `/api/v1/stores/{store}/{route}` (the
    /// body set by `body`); its answer. Tried twice: a failed send reads
    /// the records again (the bucket may have moved).
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        store: &OpenStore,
        bucket: u32,
        route: &str,
        auth: Option<&str>,
        body: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<T, Sent> {
        let mut fresh = false;
        loop {
            let owner = self
                .owner_of(store, bucket, fresh)
                .await
                .map_err(Sent::Here)?;
            let url = format!(
                "{}/api/v1/stores/{}/{route}",
                owner.address,
                store.named.name()
            );
            let request = body(self.request(self.http.post(&url), auth));
            match self.answer::<T>(request, &owner, bucket).await {
                Err(Sent::Unreached(_)) | Err(Sent::Moved(_)) if !fresh => fresh = true,
                other => return other,
            }
        }
    }

    fn request(
        &self,
        request: reqwest::RequestBuilder,
        auth: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = request.header(FORWARDED_HEADER, &self.config.instance);
        match auth {
            Some(auth) => request.header("authorization", auth),
            None => request,
        }
    }

    async fn answer<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        owner: &MemberRecord,
        bucket: u32,
    ) -> Result<T, Sent> {
        let about = |e: ApiError| {
            let mut e = e;
            e.message = format!(
                "bucket {bucket}'s owner {} ({}): {}",
                owner.instance, owner.address, e.message
            );
            e
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                return Err(Sent::Unreached(about(
                    ApiError::new(
                        status::SERVICE_UNAVAILABLE,
                        "owner_unavailable",
                        format!("not reached: {e}"),
                    )
                    .with_details(owner_details(owner, bucket)),
                )));
            }
        };
        let code = response.status().as_u16();
        let bytes = bounded(response).await.map_err(|message| {
            Sent::Unreached(about(
                ApiError::new(status::SERVICE_UNAVAILABLE, "owner_unavailable", message)
                    .with_details(owner_details(owner, bucket)),
            ))
        })?;
        if (200..300).contains(&code) {
            return serde_json::from_slice(&bytes).map_err(|e| {
                Sent::There(about(ApiError::new(
                    status::BAD_GATEWAY,
                    "owner_unavailable",
                    format!("its answer is not what a server answers: {e}"),
                )))
            });
        }
        let error = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => ApiError {
                status: code,
                code: body.error.code,
                message: body.error.message,
                details: body.error.details,
                fenced: false,
            },
            Err(_) => ApiError::new(
                status::BAD_GATEWAY,
                "owner_unavailable",
                format!("answered {code} without an error body"),
            )
            .with_details(owner_details(owner, bucket)),
        };
        // The owner lost the bucket since its record was read (`not_owner`;
        // `conflict`: its writer of the bucket was fenced by a newer
        // owner): read the records again. Sending again is safe: a bucketed
        // store has no unique keys, a key's newest write wins.
        if matches!(error.code.as_str(), "not_owner" | "conflict") {
            return Err(Sent::Moved(about(error)));
        }
        Err(Sent::There(about(error)))
    }
}

/// A peer's answer, at most [`MAX_ANSWER_BYTES`].
async fn bounded(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(format!("its answer is over {} MiB", MAX_ANSWER_BYTES >> 20));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(format!("the answer was cut: {e}")),
        }
    }
}

/// Why a send did not add.
#[derive(Debug)]
pub(crate) enum Sent {
    /// Nothing was sent: no live owner, or the records unreadable.
    Here(ApiError),
    /// The owner was not reached (nothing it acknowledged).
    Unreached(ApiError),
    /// The owner no longer owns the bucket.
    Moved(ApiError),
    /// The owner answered with an error.
    There(ApiError),
}

impl Sent {
    pub(crate) fn into_error(self) -> ApiError {
        match self {
            Self::Here(e) | Self::Unreached(e) | Self::Moved(e) | Self::There(e) => e,
        }
    }
}

fn owner_details(owner: &MemberRecord, bucket: u32) -> Value {
    json!({"bucket": bucket, "owner": owner.instance, "address": owner.address})
}

fn no_owner(store: &OpenStore, bucket: u32) -> ApiError {
    ApiError::new(
        status::SERVICE_UNAVAILABLE,
        "owner_unavailable",
        format!(
            "no live instance owns bucket {bucket} of store '{}' (none has a membership record holding it renewed within its lease); start one with --owns covering it, then retry",
            store.named.name()
        ),
    )
    .with_details(json!({"bucket": bucket, "buckets": store.named.bucket_count()}))
}

fn record_name(instance: &str) -> String {
    format!("{DIR}/{instance}.json")
}

/// Write this instance's record; `false` once it must stop (another
/// process writes under the same name).
async fn publish(
    config: &PeerConfig,
    store: &OpenStore,
    version: &mut Option<NoteVersion>,
) -> bool {
    let held = store
        .named
        .bucket_epochs()
        .into_iter()
        .filter_map(|(bucket, epoch)| epoch.map(|epoch| MemberBucket { bucket, epoch }))
        .collect();
    let record = MemberRecord {
        format: 1,
        instance: config.instance.clone(),
        address: config.address.clone(),
        buckets_total: store.named.bucket_count().unwrap_or(1),
        buckets: held,
        renewed_at_ms: now_ms(),
        lease_ms: config.lease.as_millis() as u64,
    };
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    let name = record_name(&config.instance);
    match store
        .named
        .engine()
        .write_note_if(&name, &bytes, version.as_ref())
        .await
    {
        Ok(NoteWrite::Written(v) | NoteWrite::Unconditional(v)) => {
            *version = Some(v);
            true
        }
        Ok(NoteWrite::Conflict) => {
            // Our own write, retried by the object store's client after it
            // landed, reads back as what we wrote: go on (the next renewal
            // replaces it plainly, then conditionally again).
            let back = store.named.engine().read_own_note(&name).await;
            if let Ok(Some(bytes)) = back
                && bytes == serde_json::to_vec(&record).unwrap_or_default()
            {
                *version = None;
                return true;
            }
            tracing::error!(
                store = store.named.name(),
                instance = %config.instance,
                "another process wrote this instance's membership record: two instances run under one name; this one stops publishing (give each a name of its own with --instance)"
            );
            false
        }
        Err(e) => {
            // Kept trying: the next renewal may succeed within the lease.
            tracing::warn!(store = store.named.name(), error = %e, "renewing the membership record");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(instance: &str, renewed: u64, held: &[(u32, u64)]) -> MemberRecord {
        MemberRecord {
            format: 1,
            instance: instance.into(),
            address: format!("http://{instance}:1"),
            buckets_total: 4,
            buckets: held
                .iter()
                .map(|(bucket, epoch)| MemberBucket {
                    bucket: *bucket,
                    epoch: *epoch,
                })
                .collect(),
            renewed_at_ms: renewed,
            lease_ms: 100,
        }
    }

    #[test]
    fn the_owner_is_the_live_holder_at_the_highest_epoch() {
        let records = vec![
            record("a", 1_000, &[(0, 3), (1, 2)]),
            record("b", 1_050, &[(0, 4)]),
            // expired: its bucket 2 has no owner
            record("c", 500, &[(2, 9)]),
        ];
        let owners = owners(&records, 1_090);
        assert_eq!(owners[&0].instance, "b");
        assert_eq!(owners[&1].instance, "a");
        assert!(!owners.contains_key(&2));
        // a's lease ran out, b's holds
        let owners_then = super::owners(&records, 1_120);
        assert_eq!(owners_then[&0].instance, "b");
        assert!(!owners_then.contains_key(&1));
        assert!(super::owners(&records, 1_151).is_empty());
    }

    #[test]
    fn names_and_addresses_are_checked() {
        let lease = Duration::from_secs(15);
        assert!(PeerConfig::new("lc-0", "http://lc-0.lc:8080", lease).is_ok());
        assert!(PeerConfig::new("../x", "http://a:1", lease).is_err());
        assert!(PeerConfig::new("", "http://a:1", lease).is_err());
        assert!(PeerConfig::new("a", "a:1", lease).is_err());
        assert!(PeerConfig::new("a", "http://a:1/x", lease).is_err());
        assert!(PeerConfig::new("a", "https://a:1", lease).is_err());
        assert!(PeerConfig::new("a", "http://a:1", Duration::from_millis(10)).is_err());
    }
}
