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
    /// Storage option `key=value` for stores that need them; repeatable.
    #[arg(long = "storage-option", value_parser = parse_storage_option)]
    storage_options: Vec<StorageOption>,
    /// Where a store created with a uri may go (a directory, or e.g.
    /// s3://bucket/tenants/); repeatable. A uri outside every prefix is
    /// refused (400). Default: the data root's stores/ only. Stores created
    /// without a uri go to ROOT/stores/NAME regardless.
    #[arg(long = "allow-uri-prefix", value_name = "PREFIX")]
    allow_uri_prefixes: Vec<String>,
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
        config.allowed_uri_prefixes = self.allow_uri_prefixes;
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
