//! The compile cache: compiled plugins kept so that a second start does not
//! recompile (compiling a component takes ~1 s; loading a cached one, a few
//! milliseconds).
//!
//! Cached native code runs in the host process, so the cache must never run
//! code the store's pin (the sha256 of the component) did not approve. Two
//! things make sure of that:
//! - the cache lives in a **private per-user directory** (by default
//!   `$LANCE_CONTEXT_CACHE_DIR`, else `$XDG_CACHE_HOME/lance-context/plugins`,
//!   else `~/.cache/lance-context/plugins`), never under a data root: whoever
//!   can write a data root cannot reach it. A directory writable by group or
//!   others is refused.
//! - every entry is **authenticated**: named by the component's sha256, the
//!   engine's compatibility fingerprint and a MAC — BLAKE3 in its keyed mode
//!   — over (sha256, fingerprint, compiled bytes) under a random key kept in
//!   the same private directory (mode 0600). (BLAKE3's keyed hash is a MAC
//!   by design; over a 5 MB artifact it takes about a third of HMAC-SHA256's
//!   time, which a cached start pays in full.) An entry that does not verify
//!   — planted, swapped for another component's, truncated — is ignored and
//!   replaced by a fresh compile ([`CacheStats::rejected`] counts them).
//!
//! A cached start reads the entry once, streaming it through the MAC, then
//! (on Linux) lets wasmtime map that same open file — not the path again —
//! instead of copying 5 MB into fresh memory: the copy, and the page faults
//! of memory just allocated, were most of a cached start. The file is the
//! one verified: renaming another file over the path meanwhile does not
//! change what is mapped. Its contents stay mapped while the component
//! lives, so an entry is loaded only when no one but the cache's owner can
//! write it: a regular file of one link, the owner's, mode 0600 (as the
//! cache writes them; it never writes an entry in place). The owner can
//! change a running process's plugin code by writing an entry in place —
//! as they can forge entries with the key, which is theirs too: the cache
//! defends against other users and against files that are not its own,
//! not against the user whose cache it is. An entry that is not private
//! is removed with its own warning ("not private to the cache's owner"),
//! counted in [`CacheStats::rejected`] and [`CacheStats::not_private`].
//!
//! The cache is bounded: past [`crate::PluginLimits::cache_bytes`] (1 GiB by
//! default) the least recently used entries are removed (a hit marks an
//! entry used). Only components that compiled *and* described are kept.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

const KEY_FILE: &str = "cache.key";
/// The entries' extension. Entries of older builds (the MAC at the start of
/// the file, or HMAC-SHA256) do not parse as names of this build's entries:
/// they are not read, only evicted in their turn.
const EXTENSION: &str = "cwasm";

/// What the cache did since the runtime started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries loaded (verified).
    pub hits: usize,
    /// Components compiled because no entry existed.
    pub misses: usize,
    /// Entries refused and replaced: their MAC did not match, or they were
    /// not private to the cache's owner.
    pub rejected: usize,
    /// Of `rejected`, those refused for not being private to the cache's
    /// owner (not a regular file, linked elsewhere, another user's, or
    /// open to group or others).
    pub not_private: usize,
    /// Entries removed to keep the cache within its size.
    pub evicted: usize,
}

/// The default cache directory (see the module docs); `None` when no home
/// directory is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LANCE_CONTEXT_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("lance-context").join("plugins"))
}

/// Why the compile cache cannot be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheError {
    #[error("{path}: {source}", path = .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is writable by group or others; the compile cache must be private \
         (chmod 700 it, or set LANCE_CONTEXT_CACHE_DIR)",
        .0.display()
    )]
    DirectoryNotPrivate(PathBuf),
    #[error(
        "{} is readable or writable by others; the cache key must be private (0600)",
        .0.display()
    )]
    KeyNotPrivate(PathBuf),
    #[error("{}: not a 32-byte key", .0.display())]
    BadKey(PathBuf),
    #[error("generating a cache key: {0}")]
    Random(getrandom::Error),
}

impl CacheError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[derive(Debug)]
pub(crate) struct CompileCache {
    dir: PathBuf,
    key: [u8; 32],
    /// The user the key file belongs to: entries must be theirs alone.
    #[cfg(unix)]
    owner: u32,
    fingerprint: String,
    max_bytes: u64,
    hits: AtomicUsize,
    misses: AtomicUsize,
    rejected: AtomicUsize,
    not_private: AtomicUsize,
    evicted: AtomicUsize,
}

impl CompileCache {
    /// Open (creating) the cache at `dir` for `engine`.
    pub fn open(dir: &Path, engine: &Engine, max_bytes: u64) -> Result<Self, CacheError> {
        let dir = std::path::absolute(dir).map_err(|e| CacheError::io(dir, e))?;
        create_private_dir(&dir)?;
        let key_path = dir.join(KEY_FILE);
        let key = load_or_create_key(&key_path)?;
        #[cfg(unix)]
        let owner = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&key_path)
                .map_err(|e| CacheError::io(&key_path, e))?
                .uid()
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Self {
            dir,
            key,
            #[cfg(unix)]
            owner,
            fingerprint: format!("{:016x}", hasher.finish()),
            max_bytes,
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
            not_private: AtomicUsize::new(0),
            evicted: AtomicUsize::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            not_private: self.not_private.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    /// The start of the names of `sha256`'s entries (the MAC follows).
    fn prefix(&self, sha256: &str) -> String {
        format!("{sha256}-{}-", self.fingerprint)
    }

    fn entry(&self, sha256: &str, tag: &[u8; TAG_BYTES]) -> PathBuf {
        let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        self.dir
            .join(format!("{}{tag}.{EXTENSION}", self.prefix(sha256)))
    }

    /// The entries named for `sha256` on this engine, each with the MAC its
    /// name gives.
    fn entries_of(&self, sha256: &str) -> Vec<(PathBuf, [u8; TAG_BYTES])> {
        let prefix = self.prefix(sha256);
        let Ok(items) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        items
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name();
                let tag = name
                    .to_str()?
                    .strip_prefix(&prefix)?
                    .strip_suffix(EXTENSION)?
                    .strip_suffix('.')?;
                Some((e.path(), parse_tag(tag)?))
            })
            .collect()
    }

    /// The MAC of an entry: over (sha256, fingerprint, the compiled bytes
    /// `artifact` reads).
    fn tag(&self, sha256: &str, artifact: impl std::io::Read) -> std::io::Result<[u8; TAG_BYTES]> {
        keyed_mac(
            &self.key,
            &[sha256.as_bytes(), b"\0", self.fingerprint.as_bytes(), b"\0"],
            artifact,
        )
    }

    /// The cached component for `sha256`, if an entry exists and verifies.
    pub fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let entries = self.entries_of(sha256);
        if entries.is_empty() {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        for (path, tag) in entries {
            match self.load_entry(engine, sha256, &path, &tag) {
                Entry::Loaded(component) => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    // Used now: the last to be evicted.
                    if let Ok(file) = std::fs::File::options().write(true).open(&path) {
                        let _ = file.set_modified(std::time::SystemTime::now());
                    }
                    return Some(component);
                }
                Entry::Rejected => {
                    tracing::warn!(path = %path.display(), "compile cache entry failed verification (its MAC does not match: planted, swapped or damaged); recompiling");
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    let _ = std::fs::remove_file(&path);
                }
                Entry::NotPrivate => {
                    tracing::warn!(path = %path.display(), "compile cache entry is not private to the cache's owner (not a regular file, linked elsewhere, another user's, or open to group or others); removed, recompiling");
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    self.not_private.fetch_add(1, Ordering::Relaxed);
                    let _ = std::fs::remove_file(&path);
                }
                Entry::Unreadable(e) => {
                    // Gone meanwhile (evicted), or verified but from an
                    // incompatible build: recompile.
                    tracing::debug!(path = %path.display(), "compile cache entry not loadable: {e:#}");
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        None
    }

    /// Read the entry at `path` once, through the MAC; load it only if the
    /// MAC is `tag`.
    fn load_entry(
        &self,
        engine: &Engine,
        sha256: &str,
        path: &Path,
        tag: &[u8; TAG_BYTES],
    ) -> Entry {
        let mut options = std::fs::File::options();
        options.read(true);
        // Not through a link, and never waiting on a pipe planted there.
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        }
        let mut file = match options.open(path) {
            Ok(file) => file,
            Err(e) => return Entry::Unreadable(e.into()),
        };
        if !self.private_file(&file) {
            return Entry::NotPrivate;
        }
        // Where the open file can be mapped again by its descriptor, only
        // the MAC reads it (in small pieces) and wasmtime maps it;
        // elsewhere, or when the mapping fails, it is read into memory,
        // verified and loaded from there.
        if let Some(open) = open_file_path(&file) {
            if let Some(refused) = self.refuse_unless(sha256, tag, &mut file) {
                return refused;
            }
            if let Ok(component) = deserialize_verified_file(engine, &open) {
                return Entry::Loaded(component);
            }
        }
        let mut bytes = Vec::new();
        let read = std::io::Seek::rewind(&mut file)
            .and_then(|()| std::io::Read::read_to_end(&mut file, &mut bytes));
        if let Err(e) = read {
            return Entry::Unreadable(e.into());
        }
        if let Some(refused) = self.refuse_unless(sha256, tag, bytes.as_slice()) {
            return refused;
        }
        match deserialize_verified(engine, &bytes) {
            Ok(component) => Entry::Loaded(component),
            Err(e) => Entry::Unreadable(e),
        }
    }

    /// `None` when what `artifact` reads has the MAC `tag`; otherwise what
    /// the entry is (rejected, or unreadable).
    fn refuse_unless(
        &self,
        sha256: &str,
        tag: &[u8; TAG_BYTES],
        artifact: impl std::io::Read,
    ) -> Option<Entry> {
        match self.tag(sha256, artifact) {
            Ok(computed) if constant_time_eq(&computed, tag) => None,
            Ok(_) => Some(Entry::Rejected),
            Err(e) => Some(Entry::Unreadable(e.into())),
        }
    }

    /// Whether `file` is an entry as [`Self::store`] writes them: a regular
    /// file of one name, the cache owner's and no one else's (mode 0600),
    /// within the cache's size. The code it holds is mapped, not copied, so
    /// nobody else may be able to write it in place.
    fn private_file(&self, file: &std::fs::File) -> bool {
        let Ok(meta) = file.metadata() else {
            return false;
        };
        let plain = meta.file_type().is_file() && meta.len() > 0 && meta.len() <= self.max_bytes;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            plain && meta.uid() == self.owner && meta.mode() & 0o077 == 0 && meta.nlink() == 1
        }
        #[cfg(not(unix))]
        {
            plain
        }
    }

    /// Keep `component` (compiled from bytes hashing to `sha256`). Best
    /// effort: a failure only costs a recompile later.
    pub fn store(&self, sha256: &str, component: &Component) {
        let Ok(artifact) = component.serialize() else {
            return;
        };
        let Ok(tag) = self.tag(sha256, artifact.as_slice()) else {
            return;
        };
        let path = self.entry(sha256, &tag);
        let tmp = temporary_name(&path);
        let written = (|| -> std::io::Result<()> {
            let mut options = std::fs::File::options();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut file = options.open(&tmp)?;
            file.write_all(&artifact)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            tracing::debug!(path = %path.display(), "could not write a compile cache entry: {e}");
            let _ = std::fs::remove_file(&tmp);
        }
        self.evict();
    }

    /// Remove the least recently used entries until the cache is within
    /// its size (entries of other engine builds count too).
    fn evict(&self) {
        let Ok(items) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = items
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!(".{EXTENSION}"))
            })
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Load a compiled component whose bytes were authenticated by the cache's
/// MAC: they are exactly what `Component::serialize` wrote for this
/// component on an engine with the same compatibility fingerprint.
#[allow(unsafe_code)]
fn deserialize_verified(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime requires that the bytes come from `Component::serialize`
    // (or `Engine::precompile_component`) of a trusted source. These bytes
    // were written by `CompileCache::store` from our own compile and carry a
    // MAC under a key only this user can read; `load_entry` checked it before
    // this call, so they are our own output, unmodified. wasmtime itself checks the
    // engine configuration and version recorded in the artifact.
    unsafe { Component::deserialize(engine, artifact) }
}

/// What reading one entry found.
enum Entry {
    Loaded(Component),
    /// The MAC does not match: planted, swapped or damaged.
    Rejected,
    /// Not a private regular file of the cache's owner (see
    /// `CompileCache::private_file`): never read.
    NotPrivate,
    /// Not readable, or verified but not loadable by this engine.
    Unreadable(wasmtime::Error),
}

/// The length of an entry's MAC.
const TAG_BYTES: usize = 32;

fn parse_tag(hex: &str) -> Option<[u8; TAG_BYTES]> {
    if hex.len() != TAG_BYTES * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut tag = [0u8; TAG_BYTES];
    for (i, byte) in tag.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(tag)
}

/// A path that opens `file` itself — the open file, whatever its name
/// names now — where the system has one (`/proc/self/fd` on Linux).
fn open_file_path(file: &std::fs::File) -> Option<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        path.exists().then_some(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// [`deserialize_verified`] for an entry's open file (see
/// [`open_file_path`]): wasmtime maps it instead of copying it.
#[allow(unsafe_code)]
fn deserialize_verified_file(engine: &Engine, open: &Path) -> wasmtime::Result<Component> {
    // SAFETY: as for `deserialize_verified`: `open` names the file whose
    // every byte `load_entry` has just read through the cache's MAC (under
    // a key only this user can read), and it is still open, so it is that
    // file — not whatever the entry's name points at now — that wasmtime
    // maps. The file lives in the cache's private directory and is
    // writable only by this user; the cache never writes an entry in place
    // (a new one is renamed over it). wasmtime checks the engine
    // configuration and version recorded in the artifact.
    unsafe { Component::deserialize_file(engine, open) }
}

/// Create `dir` (mode 0700 where it is new) and refuse it when group or
/// others may write it.
fn create_private_dir(dir: &Path) -> Result<(), CacheError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|e| CacheError::io(dir, e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(dir).map_err(|e| CacheError::io(dir, e))?;
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(CacheError::DirectoryNotPrivate(dir.to_path_buf()));
        }
    }
    Ok(())
}

/// A name beside `path` no other writer uses, in this process or another.
fn temporary_name(path: &Path) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    path.with_extension(format!(
        "tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn load_or_create_key(path: &Path) -> Result<[u8; 32], CacheError> {
    if let Ok(bytes) = std::fs::read(path) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(|e| CacheError::io(path, e))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(CacheError::KeyNotPrivate(path.to_path_buf()));
            }
        }
        return bytes
            .try_into()
            .map_err(|_| CacheError::BadKey(path.to_path_buf()));
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(CacheError::Random)?;
    let tmp = temporary_name(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(|e| CacheError::io(&tmp, e))?;
    file.write_all(&key)
        .and_then(|()| file.sync_all())
        .map_err(|e| CacheError::io(&tmp, e))?;
    // Another process may have created the key meanwhile: keep the first.
    match std::fs::hard_link(&tmp, path) {
        Ok(()) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(key)
        }
        Err(_) => {
            let _ = std::fs::remove_file(&tmp);
            let bytes = std::fs::read(path).map_err(|e| CacheError::io(path, e))?;
            bytes
                .try_into()
                .map_err(|_| CacheError::BadKey(path.to_path_buf()))
        }
    }
}

/// BLAKE3's keyed hash (its MAC mode) of the concatenated `parts`, then
/// what `rest` reads, under `key`.
fn keyed_mac(
    key: &[u8; 32],
    parts: &[&[u8]],
    rest: impl std::io::Read,
) -> std::io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new_keyed(key);
    for part in parts {
        hasher.update(part);
    }
    hasher.update_reader(rest)?;
    Ok(hasher.finalize().into())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_matches_the_blake3_keyed_vectors() {
        // BLAKE3's official test vectors (keyed_hash): the key is
        // "whats the Elvish word for friend", input byte i is i % 251.
        let key = *b"whats the Elvish word for friend";
        let hex = |tag: [u8; 32]| -> String { tag.iter().map(|b| format!("{b:02x}")).collect() };
        assert_eq!(
            hex(keyed_mac(&key, &[], std::io::empty()).unwrap()),
            "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"
        );
        let input: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        // Given in parts, as the cache gives (sha256, fingerprint, then the
        // artifact read from its file).
        let (a, rest) = input.split_at(7);
        let (b, c) = rest.split_at(600);
        let mac = |key: &[u8; 32]| keyed_mac(key, &[a, b], c).unwrap();
        assert_eq!(
            hex(mac(&key)),
            "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4"
        );
        let mut other = key;
        other[0] ^= 1;
        assert_ne!(mac(&other), mac(&key));
    }
}
