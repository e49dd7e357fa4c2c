//! `lance-context serve`: the REST/JSON server over a data root's stores.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use lance_context_host::{Server, ServerConfig, TokensFile};

use crate::args::{StorageOption, options_map, parse_storage_option, usage};

#[derive(Parser, Debug)]
pub struct ServeCommand {
    /// The data root holding the registry.
    #[arg(long, default_value = "data")]
    root: PathBuf,
    /// Where to listen (port 0: any free port; the address is printed).
    /// Without tokens only a loopback address is allowed.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// A tokens file: `{"tokens": [{"token": "…", "role": "read|write|admin",
    /// "stores": ["…"]}]}`. Or the same JSON in $LANCE_CONTEXT_TOKENS.
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Largest request body, MiB.
    #[arg(long, default_value_t = 64)]
    body_limit_mib: usize,
    /// Longest a request may take, seconds.
    #[arg(long, default_value_t = 60)]
    request_timeout_secs: u64,
    /// Operations running at once per store (more wait, then 503).
    #[arg(long, default_value_t = 32)]
    store_concurrency: usize,
    /// Seconds a request's head may take to arrive, from the connection's
    /// start or the head's first byte (then the connection is closed).
    #[arg(long, default_value_t = 10)]
    header_timeout_secs: u64,
    /// Seconds a connection may stay idle between requests.
    #[arg(long, default_value_t = 60)]
    idle_timeout_secs: u64,
    /// Connections open at once (at the cap, the longest idle is closed to
    /// make room; new ones wait while every one is serving a request).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Storage option `key=value` for stores that need them; repeatable.
    #[arg(long = "storage-option", value_parser = parse_storage_option)]
    storage_options: Vec<StorageOption>,
    /// Plugin calls running at once over every store (each may use the
    /// plugin memory limit).
    #[arg(long, default_value_t = 8)]
    plugin_calls: usize,
    /// Plugin calls running at once for one store: a store whose calls run
    /// hot waits behind itself, not in front of other stores.
    #[arg(long, default_value_t = 2)]
    plugin_calls_per_store: usize,
    /// Longest one plugin call may run, milliseconds.
    #[arg(long, default_value_t = 5000)]
    plugin_call_deadline_ms: u64,
    /// Plugin loads (compile, describe) running at once.
    #[arg(long, default_value_t = 2)]
    plugin_loaders: usize,
    /// How long a store create or first open waits for a loader before
    /// 503 busy, seconds.
    #[arg(long, default_value_t = 10)]
    plugin_load_wait_secs: u64,
    /// Longest compiling one component may take, seconds (the compiler
    /// process is killed then).
    #[arg(long, default_value_t = 60)]
    compile_deadline_secs: u64,
    /// Memory one compile may use, MiB.
    #[arg(long, default_value_t = 2048)]
    compile_memory_mib: usize,
    /// Where a store created with a uri may go (a directory, or e.g.
    /// s3://bucket/tenants/); repeatable. A uri outside every prefix is
    /// refused (400). Default: the data root's stores/ only. Stores created
    /// without a uri go to ROOT/stores/NAME regardless.
    #[arg(long = "allow-uri-prefix", value_name = "PREFIX")]
    allow_uri_prefixes: Vec<String>,
    /// The buckets of bucketed stores (`store create --buckets N`) this
    /// instance writes, e.g. `0-7` or `0-3,8`: it claims their shards
    /// (fencing a previous owner, replaying its WAL). An add with a row of
    /// another bucket is refused (409 not_owner, naming the bucket); reads
    /// see every bucket. Default: all buckets. Stores without buckets
    /// ignore it.
    #[arg(long, value_name = "BUCKETS", value_parser = parse_owns)]
    owns: Option<Owns>,
    /// Scale-out: the address other instances reach this one at
    /// (`http://HOST:PORT`; `auto`: http:// and the address listened on,
    /// which must then not be 0.0.0.0). The server publishes a membership
    /// record with each bucketed store (instance, address, buckets, lease),
    /// sends the rows of other instances' buckets to their owners instead
    /// of refusing them, and opens every store at start (`/ready` answers
    /// 503 until then). See docs/operations.md.
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// Scale-out: this instance's name among the store's instances (its
    /// membership record's name). Default: the host name ($HOSTNAME, a
    /// Kubernetes pod's name).
    #[arg(long, value_name = "NAME", requires = "advertise")]
    instance: Option<String>,
    /// Scale-out: seconds a membership record holds without renewal (it is
    /// renewed every third of that); a killed instance's buckets are routed
    /// nowhere once it runs out.
    #[arg(long, default_value_t = 15, requires = "advertise")]
    lease_secs: u64,
}

/// The host's name: $HOSTNAME, else /etc/hostname.
fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
}

/// A set of buckets (`--owns`).
#[derive(Debug, Clone)]
struct Owns(Vec<u32>);

fn parse_owns(text: &str) -> lance_context_store::Result<Owns> {
    lance_context_store::parse_buckets(text).map(Owns)
}

impl ServeCommand {
    pub async fn execute(self) -> Result<()> {
        let tokens = match (&self.tokens, std::env::var("LANCE_CONTEXT_TOKENS")) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                parse_tokens(&text, &path.display().to_string())?
            }
            (None, Ok(text)) if !text.trim().is_empty() => {
                parse_tokens(&text, "$LANCE_CONTEXT_TOKENS")?
            }
            _ => Vec::new(),
        };
        let mut config = ServerConfig::new(&self.root, self.addr);
        config.tokens = tokens;
        config.body_limit = self.body_limit_mib.max(1) << 20;
        config.request_timeout = Duration::from_secs(self.request_timeout_secs.max(1));
        config.store_concurrency = self.store_concurrency.max(1);
        config.storage_options = options_map(&self.storage_options);
        config.plugin_limits = lance_context_host::PluginLimits {
            max_concurrent_calls: self.plugin_calls.max(1),
            calls_per_plugin: self.plugin_calls_per_store.max(1),
            call_deadline: Duration::from_millis(self.plugin_call_deadline_ms.max(1)),
            loaders: self.plugin_loaders.max(1),
            load_wait: Duration::from_secs(self.plugin_load_wait_secs),
            compile_deadline: Duration::from_secs(self.compile_deadline_secs.max(1)),
            compile_memory_bytes: self.compile_memory_mib.max(64) << 20,
            ..lance_context_host::PluginLimits::default()
        };
        config.header_timeout = Duration::from_secs(self.header_timeout_secs.max(1));
        config.idle_timeout = Duration::from_secs(self.idle_timeout_secs.max(1));
        config.max_connections = self.max_connections.max(1);
        config.allowed_uri_prefixes = self.allow_uri_prefixes;
        config.owned_buckets = self.owns.map(|o| o.0);
        if let Some(address) = &self.advertise {
            let instance = match &self.instance {
                Some(name) => name.clone(),
                None => host_name().ok_or_else(|| {
                    usage("serve --advertise: no host name to name this instance by; give --instance NAME")
                })?,
            };
            config.peers = Some(
                lance_context_host::PeerConfig::new(
                    &instance,
                    address,
                    Duration::from_secs(self.lease_secs),
                )
                .map_err(|e| usage(format!("serve: {e}")))?,
            );
        }
        let server = Server::bind(config).await?;
        let addr = server.local_addr()?;
        // The first line on stdout is the address (scripts and tests read it).
        println!("listening on http://{addr}");
        if server.requires_tokens() {
            crate::logging::notice("requests need a bearer token");
        } else {
            crate::logging::notice(
                "no tokens configured: serving without authentication on loopback only",
            );
        }
        std::io::stdout().flush()?;
        server.run(shutdown_signal()).await?;
        crate::logging::notice("stopped: in-flight requests finished, every store closed");
        Ok(())
    }
}

fn parse_tokens(text: &str, from: &str) -> Result<Vec<lance_context_host::Token>> {
    let file: TokensFile =
        serde_json::from_str(text).map_err(|e| usage(format!("{from}: not a tokens file: {e}")))?;
    if file.tokens.is_empty() {
        return Err(usage(format!(
            "{from}: no tokens (leave --tokens out to serve loopback without authentication)"
        )));
    }
    if file.tokens.iter().any(|t| t.token.len() < 16) {
        return Err(usage(format!(
            "{from}: every token must be at least 16 characters"
        )));
    }
    if file
        .tokens
        .iter()
        .any(|t| t.token.trim() != t.token || t.token.chars().any(char::is_whitespace))
    {
        return Err(usage(format!("{from}: a token contains whitespace")));
    }
    let mut seen = std::collections::HashSet::new();
    if !file.tokens.iter().all(|t| seen.insert(t.token.as_str())) {
        return Err(usage(format!("{from}: a token is listed twice")));
    }
    Ok(file.tokens)
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
