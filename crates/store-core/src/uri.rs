//! Where Lance puts a dataset given its uri, worked out with Lance's own
//! parsing, and a canonical spelling of that place for comparisons.
//!
//! Lance reads a uri as a URL when it parses as one (the scheme in any case;
//! `file:` with no, one or three slashes; `%XX` decoded once; `.` and `..`
//! segments resolved, `%2e%2e` included), else as a local path (`~` expanded,
//! made absolute, `..` resolved without looking at the disk). The local
//! schemes (`file`, `file-object-store`, `file+uring`) write where
//! [`resolve_uri`] says; the kernel then follows any symlink on the way,
//! which [`CanonicalLocation::of`] follows too.
//!
//! Refused, because Lance would write somewhere the uri does not say or
//! nowhere sensible: a scheme this build has no object store for (`http`,
//! `gs`, …); a `file://HOST/…` uri (Lance ignores the host and writes to
//! `/…`: `file://tmp/x` is `/x`); a path Lance's own parser refuses; a
//! symlink that points nowhere (its target could not be checked).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lance::io::{ObjectStore, ObjectStoreRegistry};

/// The schemes Lance writes to the local file system.
const LOCAL_SCHEMES: &[&str] = &["file", "file-object-store", "file+uring"];

/// Schemes Lance may know, to list the ones this build has in an error.
const KNOWN_SCHEMES: &[&str] = &[
    "file",
    "file-object-store",
    "file+uring",
    "memory",
    "shared-memory",
    "s3",
    "s3+ddb",
    "gs",
    "az",
    "abfss",
    "oss",
    "hf",
];

/// Why a uri has no location this engine will write to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// No object store of this build serves the scheme.
    #[error("uri '{uri}': no storage for scheme '{scheme}' in this build (it has: {})", available.join(", "))]
    UnknownScheme {
        /// The uri as given.
        uri: String,
        /// Its scheme, lower case.
        scheme: String,
        /// The schemes this build serves.
        available: Vec<String>,
    },
    /// A `file:` uri naming a host: Lance would drop the host.
    #[error(
        "uri '{uri}': a file uri with a host ('{host}') is not supported (Lance would ignore the host and write to {writes_to}); write file:///path or a plain path"
    )]
    HostInFileUri {
        /// The uri as given.
        uri: String,
        /// The host.
        host: String,
        /// Where Lance would write.
        writes_to: String,
    },
    /// Lance's parser refuses the uri.
    #[error("uri '{uri}': {reason}")]
    Unparsable {
        /// The uri as given.
        uri: String,
        /// Lance's reason (without its source locations).
        reason: String,
    },
    /// A local path with characters Lance's object-store paths encode:
    /// Lance would write part of the store (its MemWAL) at the encoded
    /// spelling, a second directory.
    #[error(
        "uri '{uri}': its path has {}, which Lance's object-store paths percent-encode: part of the data (the MemWAL) would go under a second, encoded spelling of the path; use only ASCII letters, digits, spaces and . _ - + = , ; : @ ! $ & ' ( )",
        offending.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(" ")
    )]
    TwoSpellings {
        /// The uri as given.
        uri: String,
        /// The characters.
        offending: Vec<char>,
    },
    /// A symlink on the path points to nothing, so where the data would go
    /// cannot be checked.
    #[error("uri '{uri}': {} is a symlink to nothing; its target cannot be checked", link.display())]
    DanglingLink {
        /// The uri as given.
        uri: String,
        /// The link.
        link: PathBuf,
    },
    /// A directory on the path could not be resolved.
    #[error("uri '{uri}': cannot resolve {}: {reason}", path.display())]
    Unresolvable {
        /// The uri as given.
        uri: String,
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
}

/// Where Lance writes the dataset of a uri.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataLocation {
    /// A local directory: absolute, with no `.` or `..` component (symlinks
    /// not followed).
    Local(PathBuf),
    /// An object store.
    Remote {
        /// The scheme, lower case.
        scheme: String,
        /// The bucket or container (and port), lower case.
        authority: String,
        /// The object path, decoded, with no leading or trailing `/`.
        path: String,
    },
}

/// Where Lance writes the dataset of `uri`, by Lance's own parsing (see the
/// module docs); `Err` when it would write somewhere the uri does not say.
pub fn resolve_uri(uri: &str) -> Result<DataLocation, UriError> {
    let registry = Arc::new(ObjectStoreRegistry::default());
    // What Lance does first (`uri_to_url`): a URL if it parses as one.
    let url = url::Url::parse(uri).ok();
    let extract = |registry| {
        ObjectStore::extract_path_from_uri(registry, uri).map_err(|e| UriError::Unparsable {
            uri: uri.to_string(),
            reason: without_source_locations(&e.to_string()),
        })
    };
    let Some(url) = url else {
        return Ok(DataLocation::Local(local(extract(registry)?)));
    };
    let scheme = url.scheme().to_string();
    if registry.get_provider(&scheme).is_none() {
        let available = KNOWN_SCHEMES
            .iter()
            .filter(|s| registry.get_provider(s).is_some())
            .map(|s| s.to_string())
            .collect();
        return Err(UriError::UnknownScheme {
            uri: uri.to_string(),
            scheme,
            available,
        });
    }
    let path = extract(registry)?;
    if LOCAL_SCHEMES.contains(&scheme.as_str()) {
        let path = local(path);
        if let Some(host) = url
            .host_str()
            .filter(|h| !h.is_empty() && *h != "localhost")
        {
            return Err(UriError::HostInFileUri {
                uri: uri.to_string(),
                host: host.to_string(),
                writes_to: path.display().to_string(),
            });
        }
        return Ok(DataLocation::Local(path));
    }
    let mut authority = url.host_str().unwrap_or_default().to_ascii_lowercase();
    if let Some(port) = url.port() {
        authority.push_str(&format!(":{port}"));
    }
    Ok(DataLocation::Remote {
        // One object store under two names.
        scheme: if scheme == "s3+ddb" {
            "s3".into()
        } else {
            scheme
        },
        authority,
        path: path.as_ref().trim_matches('/').to_string(),
    })
}

/// Where a new store at `uri` would be ([`resolve_uri`]), when Lance would
/// write all of it there: a local path Lance's object-store paths spell the
/// same (its MemWAL writes under `Path::from` of the path, which
/// percent-encodes `%`, `#`, `?`, `[`, non-ASCII and more: a second
/// directory) is refused ([`UriError::TwoSpellings`]).
pub fn check_new_uri(uri: &str) -> Result<DataLocation, UriError> {
    let location = resolve_uri(uri)?;
    if let DataLocation::Local(path) = &location {
        let text = path.to_string_lossy();
        let plain = text.trim_matches('/');
        if object_store::path::Path::from(plain).as_ref() != plain {
            let mut offending: Vec<char> = plain
                .split('/')
                .flat_map(|part| {
                    part.chars().filter(|c| {
                        let mut buf = [0; 4];
                        let one: &str = c.encode_utf8(&mut buf);
                        object_store::path::Path::from(one).as_ref() != one
                    })
                })
                .collect();
            offending.sort_unstable();
            offending.dedup();
            return Err(UriError::TwoSpellings {
                uri: uri.to_string(),
                offending,
            });
        }
    }
    Ok(location)
}

/// The local directory of an object-store path on the local file system
/// (what Lance's local I/O opens: `/` and the path).
fn local(path: object_store::path::Path) -> PathBuf {
    PathBuf::from(format!("/{path}"))
}

/// A location in one spelling: `file:///dir/` (symlinks followed for the
/// part of the path that exists) or `scheme://authority/path/`. One
/// location contains another when its spelling is a prefix of the other's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CanonicalLocation(String);

impl CanonicalLocation {
    /// The canonical location of `uri` ([`resolve_uri`], then symlinks
    /// followed as far as the path exists: a path that does not exist yet is
    /// its deepest existing ancestor, resolved, and the rest).
    pub fn of(uri: &str) -> Result<Self, UriError> {
        match resolve_uri(uri)? {
            DataLocation::Local(path) => {
                let path = follow_links(uri, &path)?;
                let text = path.to_string_lossy();
                Ok(Self(format!("file://{}/", text.trim_end_matches('/'))))
            }
            DataLocation::Remote {
                scheme,
                authority,
                path,
            } => Ok(Self(match path.is_empty() {
                true => format!("{scheme}://{authority}/"),
                false => format!("{scheme}://{authority}/{path}/"),
            })),
        }
    }

    /// Whether `other` is this location or inside it.
    pub fn contains(&self, other: &Self) -> bool {
        other.0.starts_with(&self.0)
    }

    /// Whether one of the two contains the other.
    pub fn overlaps(&self, other: &Self) -> bool {
        self.contains(other) || other.contains(self)
    }

    /// The first path component of `other` below this location, when
    /// `other` is strictly inside it.
    pub fn child_towards<'a>(&self, other: &'a Self) -> Option<&'a str> {
        let rest = other.0.strip_prefix(&self.0)?;
        rest.split('/').next().filter(|c| !c.is_empty())
    }

    /// The canonical spelling.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CanonicalLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `path` with the symlinks of its existing part followed: its deepest
/// existing ancestor canonicalized, and the rest appended.
fn follow_links(uri: &str, path: &Path) -> Result<PathBuf, UriError> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(resolved) => {
                return Ok(rest.iter().rev().fold(resolved, |p, c| p.join(c)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Not there, or a link to nothing (whose target the kernel
                // would create through: it cannot be checked here).
                if std::fs::symlink_metadata(existing).is_ok() {
                    return Err(UriError::DanglingLink {
                        uri: uri.to_string(),
                        link: existing.to_path_buf(),
                    });
                }
            }
            Err(e) => {
                return Err(UriError::Unresolvable {
                    uri: uri.to_string(),
                    path: existing.to_path_buf(),
                    reason: e.to_string(),
                });
            }
        }
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            // The root always exists; a relative path never gets here.
            return Ok(path.to_path_buf());
        };
        rest.push(name.to_os_string());
        existing = parent;
    }
}

/// `text` without the source locations Lance appends to its messages
/// (`, /…/src/file.rs:12:34`): they say where in Lance's code the error was
/// made, nothing a caller can act on, and they show the build's paths.
pub fn without_source_locations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find_location(rest) {
        let (start, end) = at;
        out.push_str(&rest[..start]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The byte range of the first `, PATH.rs:LINE:COL` (or ` PATH.rs:LINE:COL`)
/// in `text`, the separator included.
fn find_location(text: &str) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(found) = text[from..].find(".rs:") {
        let dot = from + found;
        let after = &text[dot + 4..];
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        let line = digits(after);
        let col = if line > 0 && after[line..].starts_with(':') {
            digits(&after[line + 1..])
        } else {
            0
        };
        if col > 0 {
            let end = dot + 4 + line + 1 + col;
            // The path runs back to the whitespace before it; a ", " before
            // that goes too.
            let start = text[..dot].rfind(char::is_whitespace).map_or(0, |i| i + 1);
            let start = match text[..start].strip_suffix(", ") {
                Some(kept) => kept.len(),
                None => text[..start].trim_end().len(),
            };
            return Some((start, end));
        }
        from = dot + 4;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_locations_are_left_out() {
        assert_eq!(
            without_source_locations(
                "Invalid user input: No object store provider found for scheme: 'http', /root/.cargo/registry/src/index.crates.io-1/lance-io-14.0.2/src/object_store.rs:650:5"
            ),
            "Invalid user input: No object store provider found for scheme: 'http'"
        );
        assert_eq!(
            without_source_locations("a, x/y.rs:1:2: b, /z.rs:3:4, c"),
            "a: b, c"
        );
        assert_eq!(without_source_locations("lib.rs: fine"), "lib.rs: fine");
    }

    #[test]
    fn local_spellings_resolve_the_way_lance_writes() {
        let local = |uri: &str| match resolve_uri(uri) {
            Ok(DataLocation::Local(p)) => p,
            other => panic!("{uri}: {other:?}"),
        };
        for uri in [
            "/d/a b",
            "file:///d/a%20b",
            "FILE:///d/a%20b/",
            "File:/d/a%20b",
            "file:d/a%20b",
            "file://localhost/d/a%20b",
            "file:///d/x/../a%20b",
            "file:///d/x/%2e%2e/a%20b",
            "/d/./x/../a b",
            "file-object-store:///d/a%20b",
        ] {
            assert_eq!(local(uri), Path::new("/d/a b"), "{uri}");
        }
        // A plain path is not decoded.
        assert_eq!(local("/d/a%20b"), Path::new("/d/a%20b"));
        assert_eq!(local("file:///d/a%2520b"), Path::new("/d/a%20b"));
    }

    #[test]
    fn paths_lance_would_spell_twice_are_refused() {
        for uri in [
            "/d/a%20b",
            "file:///d/a%2520b",
            "/d/g#h",
            "/d/q?r",
            "/d/\u{e9}",
            "file:///d/%C3%A8",
            "/d/br[a]ce",
            "/d/~x",
        ] {
            assert!(
                matches!(check_new_uri(uri), Err(UriError::TwoSpellings { .. })),
                "{uri}"
            );
        }
        for uri in [
            "/d/c d",
            "file:///d/a%20b",
            "/d/x.y_z-1+2=3,4;5:6@7!8$9&0'(a)",
        ] {
            assert!(check_new_uri(uri).is_ok(), "{uri}");
        }
    }

    #[test]
    fn hosts_and_unknown_schemes_are_refused() {
        assert!(matches!(
            resolve_uri("file://d/a"),
            Err(UriError::HostInFileUri { host, writes_to, .. }) if host == "d" && writes_to == "/a"
        ));
        for uri in [
            "http://x/a",
            "HTTPS://x/a",
            "gs://b/a",
            "az://c/a",
            "ftp://x/",
        ] {
            assert!(
                matches!(resolve_uri(uri), Err(UriError::UnknownScheme { .. })),
                "{uri}"
            );
        }
        assert_eq!(
            CanonicalLocation::of("S3://Bucket/a/b/").unwrap().as_str(),
            "s3://bucket/a/b/"
        );
        assert_eq!(
            CanonicalLocation::of("s3+ddb://bucket/a%20b")
                .unwrap()
                .as_str(),
            "s3://bucket/a b/"
        );
    }

    #[test]
    fn containment_is_by_whole_components() {
        let at = |uri: &str| CanonicalLocation::of(uri).unwrap();
        assert!(at("/nonexistent-x/a").contains(&at("/nonexistent-x/a/b")));
        assert!(!at("/nonexistent-x/a").contains(&at("/nonexistent-x/ab")));
        assert!(at("/").contains(&at("/nonexistent-x")));
        assert_eq!(
            at("/nonexistent-x").child_towards(&at("/nonexistent-x/a/b")),
            Some("a")
        );
    }
}
