//! Shared by every role's TOML configuration: the error that names the
//! offending field, and reading a file with documented defaults.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// An invalid configuration, naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: `{field}` {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

/// Parses TOML text (unknown keys are errors when the type denies them).
pub fn parse_toml<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: PathBuf::new(),
        message: e.to_string(),
    })
}

/// Reads a TOML file, then checks it with `validate`.
pub fn load_toml<T: DeserializeOwned>(
    path: &Path,
    validate: impl FnOnce(&T) -> Result<(), ConfigError>,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let config = parse_toml(&text).map_err(|e| match e {
        ConfigError::Parse { message, .. } => ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        },
        other => other,
    })?;
    validate(&config)?;
    Ok(config)
}

/// `config` as TOML without the settings that equal `T::default()`'s, so
/// that a release that predates a setting (and refuses it as unknown) reads
/// a config written by a later one while the setting is at its default:
/// `cellmesh dev` writes this way, and a rolling upgrade can run the
/// previous release on its configs. A setting whose absence would read
/// back as another value (its serde default is not its `Default`) is
/// written; the text always parses back to `config`.
pub fn to_toml_lean<T>(config: &T) -> Result<String, toml::ser::Error>
where
    T: serde::Serialize + DeserializeOwned + Default,
{
    let full = toml::Table::try_from(config)?;
    let mut lean = full.clone();
    if let Ok(defaults) = toml::Table::try_from(T::default()) {
        prune(&mut lean, &defaults);
    }
    for _ in 0..4 {
        let back = toml::from_str::<T>(&toml::to_string(&lean)?)
            .ok()
            .and_then(|back| toml::Table::try_from(back).ok());
        match back {
            Some(back) if back == full => return toml::to_string(&lean),
            Some(back) => restore(&mut lean, &full, &back),
            None => break,
        }
    }
    toml::to_string(&full)
}

/// Removes from `table` what equals `defaults` (tables left empty too).
fn prune(table: &mut toml::Table, defaults: &toml::Table) {
    table.retain(|key, value| match (value, defaults.get(key)) {
        (toml::Value::Table(inner), Some(toml::Value::Table(default))) => {
            prune(inner, default);
            !inner.is_empty()
        }
        (value, Some(default)) => value != default,
        (_, None) => true,
    });
}

/// Puts back into `lean` the settings of `full` that read back otherwise.
fn restore(lean: &mut toml::Table, full: &toml::Table, back: &toml::Table) {
    for (key, value) in full {
        match (value, back.get(key)) {
            (_, Some(read)) if read == value => {}
            (toml::Value::Table(inner), Some(toml::Value::Table(read))) => {
                let entry = lean
                    .entry(key.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(entry) = entry {
                    restore(entry, inner, read);
                }
            }
            _ => {
                lean.insert(key.clone(), value.clone());
            }
        }
    }
}

/// For `skip_serializing_if`: a flag left out of a written config while
/// off, so that a release that does not know it still reads the file.
pub fn is_off(flag: &bool) -> bool {
    !*flag
}

/// `Ok` when `ok`, else an error naming `field`.
pub fn check(field: &'static str, ok: bool, message: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            field,
            message: message.to_string(),
        })
    }
}

/// `[tls]`: none, or all three files readable with an identity in the
/// certificate, and that identity this process's: its role, and its id
/// where the config names one (a cell's `cell_id`, a router's `node_id`,
/// an edge's `region`). A node handed another node's bundle is refused
/// before it starts, not by its peers afterwards.
pub fn check_tls(
    tls: &crate::tls::TlsConfig,
    role: crate::tls::Role,
    id: Option<&str>,
) -> Result<(), ConfigError> {
    if !tls.enabled() {
        return Ok(());
    }
    let material = tls
        .load()
        .map_err(|(field, message)| ConfigError::Invalid { field, message })?;
    let me = &material.me;
    check(
        "tls.cert_file",
        me.role == role && id.is_none_or(|id| me.id == id),
        &format!(
            "{} names {}, not this {} ({})",
            tls.cert_file,
            me.uri(),
            role.as_str(),
            id.map_or_else(
                || "any id".to_string(),
                |id| format!("cellmesh:{}/{id}", role.as_str())
            )
        ),
    )
}

/// Whether etcd `endpoints` are reached over TLS: `Some(true)` when all
/// are `https://`, `Some(false)` when none is, `None` when they mix.
pub fn etcd_over_tls(endpoints: &[String]) -> Option<bool> {
    let secure = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    match secure {
        0 => Some(false),
        n if n == endpoints.len() => Some(true),
        _ => None,
    }
}

/// etcd endpoints: none, all `http://`, or all `https://` — which this
/// process reaches over mutual TLS with its `[tls]`, so it must have one.
pub fn check_etcd(
    field: &'static str,
    endpoints: &[String],
    tls: &crate::tls::TlsConfig,
) -> Result<(), ConfigError> {
    check(
        field,
        match etcd_over_tls(endpoints) {
            Some(secure) => !secure || tls.enabled(),
            None => false,
        },
        "https:// etcd endpoints are reached with this process's [tls] certificate: configure [tls], and make them all https://",
    )
}

/// Refuses to run the internal links in plaintext unless the config says
/// so (`insecure_plaintext = true`); with `[tls]` set, `Ok`.
pub fn check_transport(
    tls: &crate::tls::TlsConfig,
    insecure_plaintext: bool,
) -> Result<(), ConfigError> {
    check(
        "insecure_plaintext",
        tls.enabled() || insecure_plaintext,
        "no [tls] (ca_file, cert_file, key_file): every internal link would be plaintext; configure [tls], or set insecure_plaintext = true to accept that",
    )
}

/// `Ok` when an optional listen address is empty (that server off) or
/// `host:port`, else an error naming `field`.
pub fn check_listen(field: &'static str, value: &str) -> Result<(), ConfigError> {
    check(
        field,
        value.is_empty() || value.parse::<std::net::SocketAddr>().is_ok(),
        &format!("must be host:port (or empty to turn it off), got {value:?}"),
    )
}

/// `Ok` when `value` lies in `lo..=hi`, else an error naming `field` and
/// the range. Every numeric setting has one: no value overflows when it is
/// scaled to milliseconds or bytes, or sizes an allocation or a channel
/// beyond reason.
pub fn check_range<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    check(
        field,
        value >= lo && value <= hi,
        &format!("must be between {lo} and {hi}, got {value}"),
    )
}

/// Checks that every one of `urls` is a gRPC endpoint these components
/// can dial: `http://host:port`. They are built without TLS, so an
/// `https://` URL is refused here rather than failing at the first call.
pub fn check_grpc_urls<'a>(
    field: &'static str,
    urls: impl IntoIterator<Item = &'a String>,
) -> Result<(), ConfigError> {
    for url in urls {
        let message = if url.starts_with("https://") {
            format!("{url:?}: TLS is not built in; use http:// (inside a private network)")
        } else {
            format!("{url:?} is not an http://host:port URL")
        };
        let host = url.strip_prefix("http://").unwrap_or("");
        check(field, !host.is_empty() && !host.contains('/'), &message)?;
    }
    Ok(())
}

/// The address to dial for `address`: its entry in `links` (a proxy that
/// sits on that network path, e.g. a cross-region link), else itself.
pub fn via<'a>(links: &'a std::collections::BTreeMap<String, String>, address: &'a str) -> &'a str {
    links.get(address).map_or(address, String::as_str)
}
