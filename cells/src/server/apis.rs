//! The cell's gRPC services — messaging, sync, attachments, backups and
//! the peer API, with health and reflection — each behind the cluster
//! secret, as one set of routes for the server.

use std::sync::Arc;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::server::{Reporter, standard_services};
use cellmesh_proto::v1::attachments_server::AttachmentsServer;
use cellmesh_proto::v1::backups_server::BackupsServer;
use cellmesh_proto::v1::cell_peer_server::CellPeerServer;
use cellmesh_proto::v1::messaging_server::MessagingServer;
use cellmesh_proto::v1::sync_server::SyncServer;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;

use super::StartError;
use crate::config::{CellConfig, REQUEST_OVERHEAD_BYTES};
use crate::grpc::{AttachmentsApi, BackupsApi, MessagingApi, PeerApi, SyncApi};
use crate::message::MessageService;
use crate::pipeline::PeerInbound;
use crate::sync::SyncService;

/// What the cell's services are built from.
pub(super) struct Apis {
    pub service: Arc<MessageService>,
    pub sync: Arc<SyncService>,
    pub inbound: PeerInbound,
    /// Where this cell's `/metrics` is reached (peers ask for it).
    pub metrics_address: String,
    /// Set once the cell begins to stop (the peer API says so).
    pub closing: tokio::sync::watch::Receiver<bool>,
}

impl Apis {
    /// Every service the cell serves; the health reporter.
    pub async fn routes(self, config: &CellConfig) -> Result<(Routes, Reporter), StartError> {
        let Apis {
            service,
            sync,
            inbound,
            metrics_address,
            closing,
        } = self;
        let standard = standard_services::<MessagingServer<MessagingApi>>(&[
            <AttachmentsServer<AttachmentsApi> as tonic::server::NamedService>::NAME,
            <BackupsServer<BackupsApi> as tonic::server::NamedService>::NAME,
            <SyncServer<SyncApi> as tonic::server::NamedService>::NAME,
            <CellPeerServer<PeerApi> as tonic::server::NamedService>::NAME,
        ])
        .await
        .map_err(|e| StartError::Grpc(e.to_string()))?;
        let max_message = config.limits.max_body_bytes + REQUEST_OVERHEAD_BYTES;
        let secret = ClusterSecret::new(&config.routing.cluster_secret);
        let guard = |secret: ClusterSecret| move |r| secret.check(r);
        let messaging = InterceptedService::new(
            MessagingServer::new(MessagingApi::new(service.clone()))
                .max_decoding_message_size(max_message),
            guard(secret.clone()),
        );
        standard.reporter.set_serving::<SyncServer<SyncApi>>().await;
        let attachments = InterceptedService::new(
            AttachmentsServer::new(AttachmentsApi::new(service.clone())),
            guard(secret.clone()),
        );
        let backups =
            crate::backup::Backups::open(&config.backup, &config.cell_id, &config.data_dir)
                .map_err(|e| StartError::Backups(e.to_string()))?;
        let backups = InterceptedService::new(
            BackupsServer::new(BackupsApi::new(Arc::new(backups), service.clone())),
            guard(secret.clone()),
        );
        let sync_api = InterceptedService::new(
            SyncServer::new(SyncApi::new(sync.clone())),
            guard(secret.clone()),
        );
        let peer = InterceptedService::new(
            CellPeerServer::new(
                PeerApi::new(inbound, service, sync, secret.clone())
                    .with_metrics_address(metrics_address)
                    .with_closing(closing),
            )
            .max_decoding_message_size(64 * 1024 * 1024),
            guard(secret),
        );
        let routes = Routes::new(standard.health)
            .add_service(standard.reflection)
            .add_service(standard.reflection_v1alpha)
            .add_service(messaging)
            .add_service(sync_api)
            .add_service(attachments)
            .add_service(backups)
            .add_service(peer);
        Ok((routes, standard.reporter))
    }
}
