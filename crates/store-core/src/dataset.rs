//! The one place datasets are opened and created.
//!
//! Every open of the base table — the first open, the refresh before a read, the
//! reopen after a writer is re-claimed — goes through [`Opener`], which carries
//! the store's storage options. Lance passes the same object-store parameters on
//! to every WAL generation it opens from that dataset, so the options reach the
//! whole LSM tree. Nothing else in the crate calls `Dataset::open`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchIterator};
use arrow_schema::SchemaRef;
use lance::Dataset;
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{WriteMode, WriteParams};
use lance::io::{ObjectStore, ObjectStoreParams, ObjectStoreRegistry, StorageOptionsAccessor};

use crate::error::{Error, LanceResultExt, Result};

/// Which version of a note was written (the object store's e-tag and
/// version), for a conditional write over it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NoteVersion {
    e_tag: Option<String>,
    version: Option<String>,
}

/// What a conditional note write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteWrite {
    /// Written (over the expected version, when one was given).
    Written(NoteVersion),
    /// Not written: the note is not the version expected (someone else
    /// wrote it since; a note deleted since is written afresh).
    Conflict,
    /// Written over whatever was there: the object store cannot replace
    /// conditionally (a local directory).
    Unconditional(NoteVersion),
}

/// Opens and creates the dataset at one URI with one set of storage options.
#[derive(Clone)]
pub(crate) struct Opener {
    uri: String,
    storage_options: HashMap<String, String>,
    /// Time travel: every open is of this version, and it never refreshes.
    version: Option<u64>,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Storage options hold secrets: print only their keys.
        let mut keys: Vec<&String> = self.storage_options.keys().collect();
        keys.sort();
        f.debug_struct("Opener")
            .field("uri", &self.uri)
            .field("storage_option_keys", &keys)
            .field("version", &self.version)
            .finish()
    }
}

impl Opener {
    pub fn new(uri: &str, storage_options: &HashMap<String, String>) -> Self {
        Self {
            uri: uri.to_string(),
            storage_options: storage_options.clone(),
            version: None,
        }
    }

    /// Open `version` instead of the latest, and never refresh (time travel).
    pub fn at_version(mut self, version: Option<u64>) -> Self {
        self.version = version;
        self
    }

    /// Whether this opener is pinned to one version (time travel).
    pub fn is_pinned(&self) -> bool {
        self.version.is_some()
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn store_params(&self) -> ObjectStoreParams {
        ObjectStoreParams {
            storage_options_accessor: (!self.storage_options.is_empty()).then(|| {
                Arc::new(StorageOptionsAccessor::with_static_options(
                    self.storage_options.clone(),
                ))
            }),
            ..Default::default()
        }
    }

    /// Open the latest version. A missing dataset is [`Error::NotFound`].
    pub async fn open(&self) -> Result<Dataset> {
        let mut builder =
            DatasetBuilder::from_uri(&self.uri).with_storage_options(self.storage_options.clone());
        if let Some(version) = self.version {
            builder = builder.with_version(version);
        }
        builder.load().await.map_err(|e| {
            if let Some(version) = self.version
                && (e.is_not_found()
                    || matches!(
                        e,
                        lance::Error::DatasetNotFound { .. } | lance::Error::VersionNotFound { .. }
                    ))
            {
                Error::NotFound {
                    what: format!("version {version} of the dataset at {}", self.uri),
                }
            } else if e.is_not_found() || matches!(e, lance::Error::DatasetNotFound { .. }) {
                Error::NotFound {
                    what: format!("dataset at {}", self.uri),
                }
            } else {
                Error::from_lance(format!("opening {}", self.uri), None, e)
            }
        })
    }

    /// The newest version of `current`, or `current` itself when nothing newer
    /// was committed. Keeps the storage options `current` was opened with.
    pub async fn refresh(&self, current: &Arc<Dataset>) -> Result<Arc<Dataset>> {
        if self.is_pinned() {
            return Ok(current.clone());
        }
        let latest = current
            .latest_version_id()
            .await
            .ctx("checking for a newer dataset version")?;
        if latest == current.version().version {
            return Ok(current.clone());
        }
        let mut fresh = current.as_ref().clone();
        fresh
            .checkout_latest()
            .await
            .ctx("loading the newest dataset version")?;
        Ok(Arc::new(fresh))
    }

    /// Open one of this dataset's WAL generations (a Lance dataset under
    /// `_mem_wal/<shard>/<dir>`) with the same storage options and session.
    pub async fn open_generation(
        &self,
        base: &Dataset,
        shard: &uuid::Uuid,
        dir: &str,
    ) -> Result<Dataset> {
        let uri = format!(
            "{}/_mem_wal/{shard}/{dir}",
            base.uri().trim_end_matches('/')
        );
        DatasetBuilder::from_uri(&uri)
            .with_store_params(self.store_params())
            .with_session(base.session())
            .load()
            .await
            .map_err(|e| Error::from_lance(format!("opening WAL generation {uri}"), None, e))
    }

    /// The object store of the URI and the dataset's path in it.
    async fn object_store(&self) -> Result<(Arc<ObjectStore>, object_store::path::Path)> {
        ObjectStore::from_uri_and_params(
            Arc::new(ObjectStoreRegistry::default()),
            &self.uri,
            &self.store_params(),
        )
        .await
        .ctx("resolving the dataset's object store")
    }

    /// What is at the URI: nothing, a Lance dataset, or something else.
    pub async fn probe(&self) -> Result<Location> {
        let (store, path) = self.object_store().await?;
        let entries = match store.read_dir(path).await {
            Ok(entries) => entries,
            Err(e) if e.is_not_found() => return Ok(Location::Empty),
            Err(e) => return Err(Error::from_lance(format!("listing {}", self.uri), None, e)),
        };
        Ok(if entries.is_empty() {
            Location::Empty
        } else if entries
            .iter()
            .any(|e| e.trim_end_matches('/') == "_versions")
        {
            Location::Dataset
        } else {
            Location::Other
        })
    }

    /// The file `_lance_context/<name>` under the URI: its bytes, or `None`
    /// when there is none.
    pub async fn read_note(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let (store, path) = self.object_store().await?;
        match store.read_one_all(&Self::note_path(&path, name)).await {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Error::from_lance(format!("reading {name}"), None, e)),
        }
    }

    /// Write `_lance_context/<name>` under the URI (replacing it).
    pub async fn write_note(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_note_if(name, bytes, None).await.map(|_| ())
    }

    /// The path of note `name` (`a/b.json`: one part per `/`).
    fn note_path(base: &object_store::path::Path, name: &str) -> object_store::path::Path {
        name.split('/')
            .filter(|p| !p.is_empty())
            .fold(base.clone().join("_lance_context"), |path, part| {
                path.join(part)
            })
    }

    /// Write note `name` and say which version of it was written. With
    /// `expected`, only over that version (a conditional write: another
    /// writer's version in between is [`NoteWrite::Conflict`]); where the
    /// object store has no conditional replace (a local directory), the
    /// note is replaced and the answer says so ([`NoteWrite::Unconditional`]).
    pub async fn write_note_if(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<&NoteVersion>,
    ) -> Result<NoteWrite> {
        use object_store::{ObjectStoreExt as _, PutMode, PutOptions, UpdateVersion};
        let (store, base) = self.object_store().await?;
        let path = Self::note_path(&base, name);
        let payload = object_store::PutPayload::from(bytes.to_vec());
        let written = |r: object_store::PutResult| NoteVersion {
            e_tag: r.e_tag,
            version: r.version,
        };
        let plain = |store: Arc<ObjectStore>, path, payload| async move {
            store
                .inner
                .put(&path, payload)
                .await
                .map_err(|e| Error::from_lance(format!("writing {name}"), None, e.into()))
        };
        let Some(expected) = expected else {
            return Ok(NoteWrite::Written(written(
                plain(store, path, payload).await?,
            )));
        };
        let options = PutOptions {
            mode: PutMode::Update(UpdateVersion {
                e_tag: expected.e_tag.clone(),
                version: expected.version.clone(),
            }),
            ..Default::default()
        };
        match store.inner.put_opts(&path, payload.clone(), options).await {
            Ok(r) => Ok(NoteWrite::Written(written(r))),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Ok(NoteWrite::Conflict),
            // Deleted since (by a peer clearing expired records): written
            // afresh.
            Err(object_store::Error::NotFound { .. }) => Ok(NoteWrite::Written(written(
                plain(store, path, payload).await?,
            ))),
            Err(object_store::Error::NotImplemented { .. })
            | Err(object_store::Error::NotSupported { .. }) => Ok(NoteWrite::Unconditional(
                written(plain(store, path, payload).await?),
            )),
            Err(e) => Err(Error::from_lance(format!("writing {name}"), None, e.into())),
        }
    }

    /// The notes under `_lance_context/<dir>/` whose file name ends with
    /// `suffix` and that are at most `max_bytes` long, at most `max_notes`
    /// of them (the first by name): file name and bytes, sorted by name; a
    /// note deleted while listed is left out. Read several at a time.
    pub async fn list_notes(
        &self,
        dir: &str,
        suffix: &str,
        max_bytes: u64,
        max_notes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        use futures::{StreamExt as _, TryStreamExt as _};
        use object_store::ObjectStoreExt as _;
        let (store, base) = self.object_store().await?;
        let prefix = Self::note_path(&base, dir);
        let mut listed: Vec<(String, object_store::path::Path)> = store
            .inner
            .list(Some(&prefix))
            .try_filter_map(|meta| async move {
                let file = meta.location.filename().map(str::to_string);
                Ok(file
                    .filter(|f| f.ends_with(suffix) && meta.size <= max_bytes)
                    .map(|f| (f, meta.location)))
            })
            .try_collect()
            .await
            .map_err(|e| Error::from_lance(format!("listing {dir}"), None, e.into()))?;
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        listed.truncate(max_notes);
        let store = &store;
        let read = futures::stream::iter(listed)
            .map(|(file, location)| async move {
                let got = match store.inner.get(&location).await {
                    Ok(got) => got.bytes().await,
                    Err(e) => Err(e),
                };
                match got {
                    // Grown since it was listed: left out like a larger one.
                    Ok(bytes) if bytes.len() as u64 > max_bytes => Ok(None),
                    Ok(bytes) => Ok(Some((file, bytes.to_vec()))),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(Error::from_lance(format!("reading {file}"), None, e.into())),
                }
            })
            .buffer_unordered(16)
            .try_filter_map(|note| async move { Ok(note) });
        let mut notes: Vec<(String, Vec<u8>)> = read.try_collect().await?;
        notes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(notes)
    }

    /// Delete note `name` (gone already: fine).
    pub async fn remove_note(&self, name: &str) -> Result<()> {
        use object_store::ObjectStoreExt as _;
        let (store, base) = self.object_store().await?;
        match store.inner.delete(&Self::note_path(&base, name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::from_lance(
                format!("removing {name}"),
                None,
                e.into(),
            )),
        }
    }

    /// Delete everything under the URI: every version, index, WAL shard and
    /// generation. Irreversible.
    pub async fn remove(&self) -> Result<()> {
        let (store, path) = self.object_store().await?;
        store
            .remove_dir_all(path)
            .await
            .map_err(|e| Error::from_lance(format!("removing {}", self.uri), None, e))
    }

    /// Create an empty dataset with `schema` and initialise its MemWAL.
    /// An existing dataset is [`Error::AlreadyExists`].
    pub async fn create(&self, schema: SchemaRef) -> Result<Dataset> {
        self.create_sharded(schema, None).await
    }

    /// [`Self::create`], with the MemWAL's bucket sharding spec on
    /// `(key column, buckets)` when given.
    pub async fn create_sharded(
        &self,
        schema: SchemaRef,
        buckets: Option<(&str, u32)>,
    ) -> Result<Dataset> {
        let empty = RecordBatchIterator::new(
            std::iter::empty::<std::result::Result<RecordBatch, arrow_schema::ArrowError>>(),
            schema,
        );
        let params = WriteParams {
            mode: WriteMode::Create,
            store_params: Some(self.store_params()),
            ..Default::default()
        };
        let mut dataset = Dataset::write(empty, self.uri.as_str(), Some(params))
            .await
            .map_err(|e| Error::from_lance(format!("creating {}", self.uri), None, e))?;
        ensure_mem_wal(&mut dataset, buckets).await?;
        Ok(dataset)
    }
}

/// What a URI holds (see [`crate::Store::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Nothing (or not there at all).
    Empty,
    /// A Lance dataset (it has `_versions/`).
    Dataset,
    /// Something that is not a Lance dataset.
    Other,
}

/// The directory beside the dataset where the engine keeps its own small
/// files (the merge ledger, the shared visible count): `_lance_context/`.
pub(crate) fn engine_dir(dataset: &Dataset) -> object_store::path::Path {
    dataset.branch_location().path.join("_lance_context")
}

/// Have the MemWAL's maintained indexes be the key index (`key_index`,
/// which must exist) alone, where they were every index of the table.
///
/// A writer keeping an index in memory builds it on every add and writes it
/// into every generation it flushes (a dataset open, an index and a
/// manifest per flush). No read of the engine uses them — keyed reads hold
/// the generations in memory or scan them, vector search ranks the unmerged
/// tier exactly, and the key sidecar each generation carries (which reads
/// do use) is written whatever the set. The key index stays in this
/// store-wide set for writers of earlier builds of this engine, which make
/// their flushes wait for the sidecar that way; this build's writers drop
/// it from their own memtables once they have claimed the shard and make
/// every freeze themselves instead (`crate::writer`).
///
/// A commit, once per store (a no-op when already so). Losing the commit to
/// another handle's is not an error: the writers keep the wider set until a
/// later open narrows it, which costs time, never rows.
pub(crate) async fn narrow_maintained_indexes(dataset: &mut Dataset, key_index: &str) {
    let wanted = vec![key_index.to_string()];
    match dataset.mem_wal_index_details().await {
        Ok(Some(details))
            if !details.maintain_all_indexes && details.maintained_indexes == wanted => {}
        Ok(Some(_)) => {
            if let Err(e) = dataset
                .update_mem_wal_maintained_indexes(Some(wanted))
                .await
            {
                tracing::warn!(
                    "the MemWAL writers keep every index in memory (narrowing to {key_index} \
                     failed: {e}); a later open tries again"
                );
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!("reading the MemWAL's maintained indexes: {e}"),
    }
}

/// Initialise the MemWAL if it is not (a create that crashed between its two
/// commits leaves a dataset without one). Manual sharding: each instance writes
/// its own shard, named by its instance id; with `buckets` (key column,
/// count), Lance's bucket sharding spec, each bucket written through its own
/// shard (see [`crate::StoreConfig::with_buckets`]).
pub(crate) async fn ensure_mem_wal(
    dataset: &mut Dataset,
    buckets: Option<(&str, u32)>,
) -> Result<()> {
    if dataset
        .mem_wal_index_details()
        .await
        .ctx("reading the MemWAL index")?
        .is_some()
    {
        return Ok(());
    }
    let builder = match buckets {
        Some((key, count)) => dataset.initialize_mem_wal().bucket_sharding(key, count),
        None => dataset.initialize_mem_wal(),
    };
    match builder.execute().await {
        Ok(()) => Ok(()),
        // A concurrent opener initialised it first.
        Err(e) => {
            dataset
                .checkout_latest()
                .await
                .ctx("reloading after MemWAL initialisation")?;
            if dataset
                .mem_wal_index_details()
                .await
                .ctx("reading the MemWAL index")?
                .is_some()
            {
                Ok(())
            } else {
                Err(Error::from_lance("initialising the MemWAL", None, e))
            }
        }
    }
}
