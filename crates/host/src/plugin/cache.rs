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
//! - every entry is **authenticated**: named by the component's sha256 and
//!   the engine's compatibility fingerprint, and prefixed with a MAC — BLAKE3
//!   in its keyed mode — over (sha256, fingerprint, compiled bytes) under a
//!   random key kept in the same private directory (mode 0600). (BLAKE3's
//!   keyed hash is a MAC by design; over a 5 MB artifact it takes about a
//!   third of HMAC-SHA256's time, which a cached start pays in full.) An
//!   entry that does not verify —
//!   planted, swapped for another component's, truncated — is ignored and
//!   replaced by a fresh compile ([`CacheStats::rejected`] counts them).
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
const TAG_BYTES: usize = 32;
/// The MAC in each entry's name: an entry written with another MAC (an
/// older build's HMAC-SHA256) is not read, only evicted in its turn.
const MAC: &str = "b3";

/// What the cache did since the runtime started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries loaded (verified).
    pub hits: usize,
    /// Components compiled because no entry existed.
    pub misses: usize,
    /// Entries that failed verification and were replaced.
    pub rejected: usize,
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
    fingerprint: String,
    max_bytes: u64,
    hits: AtomicUsize,
    misses: AtomicUsize,
    rejected: AtomicUsize,
    evicted: AtomicUsize,
}

impl CompileCache {
    /// Open (creating) the cache at `dir` for `engine`.
    pub fn open(dir: &Path, engine: &Engine, max_bytes: u64) -> Result<Self, CacheError> {
        let dir = std::path::absolute(dir).map_err(|e| CacheError::io(dir, e))?;
        create_private_dir(&dir)?;
        let key = load_or_create_key(&dir.join(KEY_FILE))?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Self {
            dir,
            key,
            fingerprint: format!("{:016x}", hasher.finish()),
            max_bytes,
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
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
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    fn entry(&self, sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{sha256}-{}-{MAC}.cwasm", self.fingerprint))
    }

    fn tag(&self, sha256: &str, artifact: &[u8]) -> [u8; TAG_BYTES] {
        keyed_mac(
            &self.key,
            &[
                sha256.as_bytes(),
                b"\0",
                self.fingerprint.as_bytes(),
                b"\0",
                artifact,
            ],
        )
    }

    /// The cached component for `sha256`, if an entry exists and verifies.
    pub fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let path = self.entry(sha256);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(_) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let verified = bytes.len() > TAG_BYTES && {
            let (tag, artifact) = bytes.split_at(TAG_BYTES);
            constant_time_eq(tag, &self.tag(sha256, artifact))
        };
        if !verified {
            tracing::warn!(path = %path.display(), "compile cache entry failed verification; recompiling");
            self.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = std::fs::remove_file(&path);
            return None;
        }
        match deserialize_verified(engine, &bytes[TAG_BYTES..]) {
            Ok(component) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                // Used now: the last to be evicted.
                if let Ok(file) = std::fs::File::options().write(true).open(&path) {
                    let _ = file.set_modified(std::time::SystemTime::now());
                }
                Some(component)
            }
            Err(e) => {
                // Verified but from an incompatible build: recompile.
                tracing::debug!(path = %path.display(), "compile cache entry not loadable: {e:#}");
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keep `component` (compiled from bytes hashing to `sha256`). Best
    /// effort: a failure only costs a recompile later.
    pub fn store(&self, sha256: &str, component: &Component) {
        let Ok(artifact) = component.serialize() else {
            return;
        };
        let path = self.entry(sha256);
        let tmp = temporary_name(&path);
        let written = (|| -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&self.tag(sha256, &artifact))?;
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
            .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
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
/// HMAC: they are exactly what `Component::serialize` wrote for this
/// component on an engine with the same compatibility fingerprint.
#[allow(unsafe_code)]
fn deserialize_verified(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime requires that the bytes come from `Component::serialize`
    // (or `Engine::precompile_component`) of a trusted source. These bytes
    // were written by `CompileCache::store` from our own compile and carry an
    // HMAC under a key only this user can read; `load` checked it before this
    // call, so they are our own output, unmodified. wasmtime itself checks the
    // engine configuration and version recorded in the artifact.
    unsafe { Component::deserialize(engine, artifact) }
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

/// BLAKE3's keyed hash (its MAC mode) of the concatenated `parts` under
/// `key`.
fn keyed_mac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
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
            hex(keyed_mac(&key, &[])),
            "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"
        );
        let input: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        // Given in parts, as the cache gives (sha256, fingerprint, artifact).
        let (a, rest) = input.split_at(7);
        let (b, c) = rest.split_at(600);
        assert_eq!(
            hex(keyed_mac(&key, &[a, b, c])),
            "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4"
        );
        let mut other = key;
        other[0] ^= 1;
        assert_ne!(keyed_mac(&other, &[a, b, c]), keyed_mac(&key, &[a, b, c]));
    }
}
