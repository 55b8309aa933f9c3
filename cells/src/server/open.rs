//! Opening a cell before it serves: its store (with failpoints and the
//! high-water marks attached), the cold tier, the attachments store and
//! its file server, search, the message service over them, and the sync
//! service with its hub of device streams.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{StartError, connect_coordination, register};
use crate::clock::Clock;
use crate::config::CellConfig;
use crate::homes::Homes;
use crate::hwm::HighWaterMarks;
use crate::message::MessageService;
use crate::ownership::Ownership;
use crate::search::Search;
use crate::storage::Store;
use crate::sync::{Hub, SyncService};

/// A cell opened, not yet serving gRPC.
pub(super) struct Opened {
    pub config: Arc<CellConfig>,
    pub store: Arc<Store>,
    pub coordination: Option<Arc<dyn cellmesh_coord::Coordination>>,
    pub service: Arc<MessageService>,
    pub search: Option<Arc<Search>>,
    /// The signed-URL file server: its address and task.
    pub files: Option<(SocketAddr, JoinHandle<()>)>,
    pub hub: Arc<Hub>,
    pub sync: Arc<SyncService>,
}

/// Validates `config` and opens everything the cell serves from.
pub(super) async fn open(
    config: CellConfig,
    ownership: Arc<dyn Ownership>,
    homes: Arc<dyn Homes>,
    marks: &Arc<HighWaterMarks>,
    clock: Arc<dyn Clock>,
) -> Result<Opened, StartError> {
    config.validate()?;
    cellmesh_proto::tls::install(&config.tls).map_err(StartError::Tls)?;
    std::fs::create_dir_all(&config.data_dir)?;
    let store = Store::open(&config.data_dir.join("db"), &config.storage)?;
    marks.attach(&store);
    store
        .failpoints()
        .clone()
        .watch(config.data_dir.join("failpoints"));
    let config = Arc::new(config);
    let replicator = Arc::new(crate::replication::Replicator::start(
        &config,
        homes.clone(),
        store.clone(),
    ));
    let coordination = connect_coordination(&config.routing).await?;
    let cold = match config.tiering.enabled {
        true => Some(Arc::new(
            crate::cold::ColdTier::open(
                &config.tiering,
                &config.data_dir,
                crate::cold::journal::Journal::new(coordination.clone(), &config.cell_id),
            )
            .map_err(StartError::ColdTier)?,
        )),
        false => None,
    };
    // A standalone cell (no region in its id) keeps its files as "local".
    let attachments = crate::attachments::Attachments::open(
        &config.attachments,
        &config.data_dir,
        register::region(&config),
    )
    .map_err(StartError::Attachments)?;
    let files = match &attachments {
        Some(a) => a.serve(clock.clone()).await?,
        None => None,
    };
    let search = (config.search.enabled).then(|| {
        Arc::new(crate::search::Search::new(
            &config.data_dir,
            config.search.clone(),
        ))
    });
    let service = Arc::new(
        MessageService::new(
            store.clone(),
            config.clone(),
            ownership,
            clock.clone(),
            replicator,
            marks.clone(),
        )?
        .with_cold(cold)
        .with_attachments(attachments)
        .with_search(search.clone()),
    );
    let hub = Arc::new(Hub::new(
        config.sync.presence_window_secs * 1000,
        config.sync.max_streams_per_user as usize,
    ));
    let sync = Arc::new(SyncService::new(
        store.clone(),
        hub.clone(),
        service.clone(),
        config.clone(),
        clock.clone(),
        homes.clone(),
    ));
    Ok(Opened {
        config,
        store,
        coordination,
        service,
        search,
        files,
        hub,
        sync,
    })
}
