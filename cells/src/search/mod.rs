//! Full-text search of a cell's history: one tantivy index per tenant under
//! `<data_dir>/search/`, fed after the ack by the [`indexer`] (its own
//! consumer group on the cell's event queue, so a slow index never slows a
//! send), and queried by `MessageService::search`, which reads every hit
//! back through `Pull`'s path before the caller sees it.

pub mod analyzer;
pub mod index;
pub mod indexer;

use cellmesh_proto::ids::TenantId;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cellmesh_proto::config::{ConfigError, check, check_range};
use serde::{Deserialize, Serialize};

pub use analyzer::Language;
pub use index::{Candidate, IndexedMessage, Lookup, Prepared, TenantIndex};

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("search index: {0}")]
    Index(#[from] tantivy::TantivyError),
    #[error("search index directory: {0}")]
    Directory(#[from] tantivy::directory::error::OpenDirectoryError),
    #[error("search index files: {0}")]
    Io(#[from] std::io::Error),
    #[error("query: {0}")]
    Query(String),
}

/// `[search]` in a cell's config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    pub enabled: bool,
    /// How long indexed messages may wait before a commit makes them
    /// searchable (and durable in the index).
    pub commit_interval_ms: u64,
    /// Memory of one tenant's index writer (at least 15 MB).
    pub writer_heap_mb: u32,
    /// The analyzer of tenants not listed in `tenants`.
    pub language: Language,
    pub tenants: Vec<TenantSearch>,
}

/// One tenant's search settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantSearch {
    pub tenant: TenantId,
    #[serde(default)]
    pub language: Option<Language>,
    /// The tenant's clients encrypt end to end: the server holds no
    /// plaintext, nothing is indexed and `Search` is refused.
    #[serde(default)]
    pub end_to_end_encrypted: bool,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            commit_interval_ms: 500,
            writer_heap_mb: 16,
            language: Language::Standard,
            tenants: Vec::new(),
        }
    }
}

impl SearchConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("search.writer_heap_mb", self.writer_heap_mb, 15, 4096)?;
        check_range(
            "search.commit_interval_ms",
            self.commit_interval_ms,
            10,
            60_000,
        )?;
        let mut seen = std::collections::HashSet::new();
        for t in &self.tenants {
            check(
                "search.tenants",
                seen.insert(t.tenant),
                "lists a tenant twice",
            )?;
        }
        Ok(())
    }

    fn tenant(&self, tenant: TenantId) -> Option<&TenantSearch> {
        self.tenants.iter().find(|t| t.tenant == tenant)
    }

    /// Whether `tenant`'s messages are indexed and searchable.
    pub fn searchable(&self, tenant: TenantId) -> bool {
        self.enabled && !self.tenant(tenant).is_some_and(|t| t.end_to_end_encrypted)
    }

    pub fn language(&self, tenant: TenantId) -> Language {
        self.tenant(tenant)
            .and_then(|t| t.language)
            .unwrap_or(self.language)
    }
}

/// The cell's tenant indexes, opened on first use.
pub struct Search {
    root: PathBuf,
    pub config: SearchConfig,
    open: Mutex<HashMap<u64, Arc<TenantIndex>>>,
}

impl Search {
    pub fn new(data_dir: &Path, config: SearchConfig) -> Self {
        Self {
            root: data_dir.join("search"),
            config,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// `tenant`'s index, opened (or created) now if it is not open.
    pub fn tenant(&self, tenant: TenantId) -> Result<Arc<TenantIndex>, SearchError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = open.get(&tenant.get()) {
            return Ok(index.clone());
        }
        let index = Arc::new(TenantIndex::open(
            &self.root.join(tenant.to_string()),
            self.config.language(tenant),
            self.config.writer_heap_mb as usize * 1024 * 1024,
        )?);
        open.insert(tenant.get(), index.clone());
        Ok(index)
    }

    /// Commits every open index that has pending changes.
    pub fn commit(&self, tenants: impl IntoIterator<Item = u64>) -> Result<(), SearchError> {
        for tenant in tenants {
            self.tenant(TenantId(tenant))?.commit()?;
        }
        Ok(())
    }
}
